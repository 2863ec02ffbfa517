#include "remote/availability.h"

#include <simdjson.h>

#include <algorithm>

namespace tensorlift::remote {

std::vector<uint64_t> ChunkStarts(const Manifest& m) {
  std::vector<uint64_t> starts;
  starts.reserve(m.tensors.size() + 1);
  uint64_t at = 0;
  for (const ManifestTensor& t : m.tensors) {
    starts.push_back(at);
    at += (t.nbytes + m.chunk_bytes - 1) / m.chunk_bytes;
  }
  starts.push_back(at);
  return starts;
}

Availability::Availability(const Manifest& manifest) : starts_(ChunkStarts(manifest)) {
  chunk_bytes_.reserve(starts_.back());
  for (const ManifestTensor& t : manifest.tensors) {
    for (uint64_t off = 0; off < t.nbytes; off += manifest.chunk_bytes)
      chunk_bytes_.push_back(std::min(manifest.chunk_bytes, t.nbytes - off));
  }
  bits_.assign((starts_.back() + 7) / 8, 0);
}

void Availability::Mark(size_t tensor, uint64_t chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tensor + 1 >= starts_.size()) return;
  const uint64_t i = starts_[tensor] + chunk;
  if (i >= starts_[tensor + 1]) return;
  uint8_t& byte = bits_[i / 8];
  const uint8_t bit = uint8_t(1u << (i % 8));
  if (byte & bit) return;
  byte |= bit;
  ++held_;
  held_bytes_ += chunk_bytes_[i];
  ++version_;
  changed_.notify_all();
}

void Availability::MarkAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (complete_) return;
  complete_ = true;
  for (uint64_t i = 0; i < starts_.back(); ++i) bits_[i / 8] |= uint8_t(1u << (i % 8));
  held_ = starts_.back();
  held_bytes_ = 0;
  for (uint64_t b : chunk_bytes_) held_bytes_ += b;
  ++version_;
  changed_.notify_all();
}

std::string Availability::TextLocked() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string t = "{\"version\":" + std::to_string(version_) +
                  ",\"complete\":" + (complete_ ? "true" : "false") + ",\"have\":\"";
  t.reserve(t.size() + bits_.size() * 2 + 2);
  for (uint8_t b : bits_) {
    t += kHex[b >> 4];
    t += kHex[b & 15];
  }
  return t + "\"}";
}

std::string Availability::Text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TextLocked();
}

std::string Availability::Wait(uint64_t after, std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, wait, [&] { return version_ > after; });
  return TextLocked();
}

uint64_t Availability::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

uint64_t Availability::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_bytes_;
}

Result<HeldChunks> ParseHeldChunks(std::string_view text, uint64_t chunks) {
  auto bad = [](const std::string& why) { return CorruptionError("relay's chunk map: " + why); };
  if (text.size() > 64 + 2 * ((chunks + 7) / 8) + 64) return bad("too long");
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(text.data(), text.size()).get(root) != simdjson::SUCCESS) return bad("not JSON");
  HeldChunks h;
  std::string_view hex;
  if (root["version"].get(h.version) != simdjson::SUCCESS ||
      root["complete"].get(h.complete) != simdjson::SUCCESS ||
      root["have"].get(hex) != simdjson::SUCCESS) {
    return bad("needs version, complete and have");
  }
  if (hex.size() != 2 * ((chunks + 7) / 8)) {
    return bad(std::to_string(hex.size()) + " hex digits for " + std::to_string(chunks) +
               " chunks");
  }
  h.bits.resize(hex.size() / 2);
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < h.bits.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad("not lowercase hex");
    h.bits[i] = uint8_t(hi << 4 | lo);
  }
  if (chunks % 8 && !h.bits.empty() && (h.bits.back() >> (chunks % 8)) != 0)
    return bad("bits past the last chunk");
  return h;
}

}  // namespace tensorlift::remote
