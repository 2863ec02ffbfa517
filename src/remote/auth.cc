// Request signing for the control endpoint: HMAC-SHA256 (OpenSSL libcrypto),
// nonces from the OS, a replay window, and token files.
#include "remote/auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "common/posix_file.h"
#include "io/pread.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {
namespace {

constexpr size_t kMacHexChars = 64;
constexpr size_t kMaxNonceChars = 128;
constexpr size_t kMaxTokenFileBytes = 4096;

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string MacMessage(std::string_view method, std::string_view path, int64_t unix_seconds,
                       std::string_view nonce) {
  std::string msg = "v1\n";
  msg += method;
  msg += '\n';
  msg += path;
  msg += '\n';
  msg += std::to_string(unix_seconds);
  msg += '\n';
  msg += nonce;
  return msg;
}

bool IsNonceChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
         c == '_';
}

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status Denied(std::string why) { return PermissionDeniedError("request authentication: " + why); }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HmacSha256Hex(std::string_view token, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  // HMAC() wants a non-null key even when it is empty.
  static const unsigned char kEmpty = 0;
  const void* key = token.empty() ? static_cast<const void*>(&kEmpty) : token.data();
  const auto* data =
      message.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(message.data());
  if (HMAC(EVP_sha256(), key, static_cast<int>(token.size()), data, message.size(), mac,
           &mac_len) == nullptr) {
    return "";  // Never matches a 64-digit MAC.
  }
  return Hex(mac, mac_len);
}

std::string RandomNonce() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  if (got < sizeof(bytes)) {
    // No getrandom (old kernel, seccomp): OpenSSL's generator.
    if (RAND_bytes(bytes, sizeof(bytes)) != 1) return "";
  }
  return Hex(bytes, sizeof(bytes));
}

std::string SignRequest(std::string_view token, std::string_view method, std::string_view path,
                        int64_t unix_seconds, std::string_view nonce) {
  std::string out = "v1:" + std::to_string(unix_seconds) + ":";
  out += nonce;
  out += ':';
  out += HmacSha256Hex(token, MacMessage(method, path, unix_seconds, nonce));
  return out;
}

RequestVerifier::RequestVerifier(std::string token, int64_t max_skew_s)
    : token_(std::move(token)), max_skew_s_(max_skew_s < 0 ? 0 : max_skew_s) {}

Status RequestVerifier::Verify(std::string_view header, std::string_view method,
                               std::string_view path, int64_t now_unix_seconds) {
  if (header.empty()) return Denied(std::string("missing ") + kAuthHeader + " header");
  // v1:<seconds>:<nonce>:<mac>
  std::string_view parts[4];
  std::string_view rest = header;
  for (int i = 0; i < 3; ++i) {
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos)
      return Denied("malformed header: expected v1:SECONDS:NONCE:MAC");
    parts[i] = rest.substr(0, colon);
    rest.remove_prefix(colon + 1);
  }
  parts[3] = rest;
  if (parts[0] != "v1") return Denied("malformed header: unknown version (expected v1)");
  const std::string_view secs = parts[1];
  if (secs.empty() || secs.size() > 18) return Denied("malformed header: bad timestamp");
  int64_t ts = 0;
  for (char c : secs) {
    if (c < '0' || c > '9') return Denied("malformed header: bad timestamp");
    ts = ts * 10 + (c - '0');
  }
  if (secs.size() > 1 && secs[0] == '0') return Denied("malformed header: bad timestamp");
  const std::string_view nonce = parts[2];
  if (nonce.empty() || nonce.size() > kMaxNonceChars) return Denied("malformed header: bad nonce");
  for (char c : nonce) {
    if (!IsNonceChar(c)) return Denied("malformed header: bad nonce");
  }
  const std::string_view mac = parts[3];
  if (mac.size() != kMacHexChars || !IsLowerHex(mac)) {
    return Denied("malformed header: the MAC must be 64 lowercase hex digits");
  }
  int64_t skew;
  if (__builtin_sub_overflow(now_unix_seconds, ts, &skew) || skew == INT64_MIN) skew = INT64_MAX;
  if (skew < 0) skew = -skew;
  if (skew > max_skew_s_) {
    return Denied("stale request: timestamp " + std::to_string(ts) + " is " + std::to_string(skew) +
                  " s from the server's clock (" + std::to_string(now_unix_seconds) +
                  "), more than the allowed " + std::to_string(max_skew_s_) + " s");
  }
  const std::string expected = HmacSha256Hex(token_, MacMessage(method, path, ts, nonce));
  if (expected.size() != kMacHexChars ||
      CRYPTO_memcmp(expected.data(), mac.data(), kMacHexChars) != 0) {
    return Denied("bad MAC (wrong token, or the request was altered)");
  }

  std::lock_guard<std::mutex> lock(mu_);
  int64_t oldest;
  if (__builtin_sub_overflow(now_unix_seconds, max_skew_s_, &oldest)) oldest = INT64_MIN;
  // Amortized pruning: when the set doubles past 64 entries.
  const size_t n = seen_.size();
  if (n >= 64 && (n & (n - 1)) == 0) {
    for (auto it = seen_.begin(); it != seen_.end();) {
      it = it->second < oldest ? seen_.erase(it) : std::next(it);
    }
  }
  auto [it, inserted] = seen_.try_emplace(std::string(nonce), ts);
  if (!inserted) {
    // A nonce seen outside the window is not a replay of anything still
    // acceptable; only one inside it is.
    if (it->second >= oldest) return Denied("replayed request (nonce already used)");
    it->second = ts;
  }
  return Status::Ok();
}

}  // namespace tensorlift::remote

namespace tensorlift {

Result<std::string> ReadTokenFile(const std::string& path) {
  auto result = [&]() -> Result<std::string> {
    TL_ASSIGN_OR_RETURN(PosixFile file, PosixFile::OpenForRead(path));
    struct stat st;
    if (fstat(file.fd(), &st) != 0) return PosixError("fstat", errno);
    if (!S_ISREG(st.st_mode)) return InvalidArgumentError("the token file is not a regular file");
    // Readable or writable by others: the token is no secret.
    if ((st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return PermissionDeniedError(
          std::string("the token file is accessible by group or others (mode ") + mode +
          "); chmod 600 it");
    }
    if (static_cast<uint64_t>(st.st_size) > remote::kMaxTokenFileBytes) {
      return InvalidArgumentError("the token file has " + std::to_string(st.st_size) +
                                  " bytes, more than the limit of " +
                                  std::to_string(remote::kMaxTokenFileBytes));
    }
    std::string text(static_cast<size_t>(st.st_size), '\0');
    TL_RETURN_IF_ERROR(ReadExactlyAt(file.fd(), 0, text.data(), text.size()));
    size_t b = 0, e = text.size();
    while (b < e && remote::IsSpace(text[b])) ++b;
    while (e > b && remote::IsSpace(text[e - 1])) --e;
    if (b == e) return InvalidArgumentError("the token file is empty");
    return text.substr(b, e - b);
  }();
  if (!result.ok()) return result.status().WithContext(path);
  return result;
}

}  // namespace tensorlift
