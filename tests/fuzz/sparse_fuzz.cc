// libFuzzer target for sparse-bitmask checkpoints (compressed-tensors'
// "sparse-bitmask" groups): the input is a whole safetensors file, opened as
// a checkpoint (from a memfd), searched by sparse::FindSparse, and every group
// it finds (up to 1 MiB dense) decoded by sparse::Decode.
//
// Checks:
//   - FindSparse rejects with Corruption only; each group's parts are where it
//     says, with the sizes its shape and nnz imply;
//   - Decode either fails with Corruption and writes nothing, or gives the
//     dense tensor a plain reference decoder (here) gives from the same parts;
//   - every decoder this CPU runs (scalar, AVX2, AVX-512) gives the same bytes.
// Any broken invariant aborts with a message (a finding).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/sparse.h"

namespace {

using namespace tensorlift;

constexpr uint64_t kMaxDenseBytes = uint64_t{1} << 20;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "sparse_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

// The bytes of tensor `loc` of a one-file checkpoint whose file is `file`.
std::span<const std::byte> Bytes(const Checkpoint& ckpt, Checkpoint::Location loc,
                                 std::span<const std::byte> file) {
  const Header& h = ckpt.shards()[loc.shard].header;
  const TensorInfo& t = ckpt.info(loc);
  return file.subspan(h.data_offset() + t.begin, t.nbytes());
}

// Row r's elements: bit c of the row's mask (little-endian bit order) takes
// the next value, from row_offsets[r] on.
std::vector<std::byte> ReferenceDecode(const std::byte* values, const uint8_t* mask,
                                       const int64_t* row_offsets, const sparse::BitmaskShape& s) {
  std::vector<std::byte> dense(s.dense_bytes());
  const uint32_t w = s.elem_bytes;
  for (uint64_t r = 0; r < s.rows; ++r) {
    uint64_t k = static_cast<uint64_t>(row_offsets[r]);
    for (uint64_t c = 0; c < s.cols; ++c) {
      if (mask[r * s.mask_row_bytes() + c / 8] & (1u << (c % 8))) {
        std::memcpy(dense.data() + (r * s.cols + c) * w, values + k * w, w);
        ++k;
      }
    }
  }
  return dense;
}

void CheckGroup(const Checkpoint& ckpt, const sparse::SparseTensor& g,
                std::span<const std::byte> file) {
  const sparse::BitmaskShape& s = g.shape;
  const auto values = Bytes(ckpt, g.values, file);
  const auto mask = Bytes(ckpt, g.bitmask, file);
  const auto offsets = Bytes(ckpt, g.row_offsets, file);
  if (values.size() != g.nnz * s.elem_bytes) Fail("values bytes", g.name);
  if (mask.size() != s.mask_bytes()) Fail("bitmask bytes", g.name);
  if (offsets.size() != s.rows * 8) Fail("row_offsets bytes", g.name);
  if (s.dense_bytes() > kMaxDenseBytes) return;
  // Aligned copies (the file's bytes may sit at any offset).
  std::vector<std::byte> v(values.begin(), values.end());
  std::vector<uint8_t> m(mask.size());
  if (!m.empty()) std::memcpy(m.data(), mask.data(), m.size());
  std::vector<int64_t> ro(s.rows);
  if (!ro.empty()) std::memcpy(ro.data(), offsets.data(), offsets.size());

  const sparse::DecodeIsa isas[] = {sparse::DecodeIsa::kScalar, sparse::DecodeIsa::kAvx2,
                                    sparse::DecodeIsa::kAvx512};
  std::vector<std::byte> first;
  for (const auto isa : isas) {
    if (!sparse::Supported(isa)) continue;
    std::vector<std::byte> dense(s.dense_bytes(), std::byte{0xA5});
    Status st = sparse::Decode(v.data(), g.nnz, m.data(), ro.data(), s, dense.data(), 1, isa);
    if (!st.ok()) {
      if (st.code() != StatusCode::kCorruption) Fail("decode code", st.ToString());
      for (std::byte b : dense) {
        if (b != std::byte{0xA5}) Fail("written on error", g.name);
      }
      if (isa != sparse::DecodeIsa::kScalar) Fail("only some decoders refuse", g.name);
      return;  // Every decoder validates the same way.
    }
    if (first.empty()) {
      first = dense;
      if (ReferenceDecode(v.data(), m.data(), ro.data(), s) != dense) {
        Fail("decode differs from the reference", g.name);
      }
    } else if (dense != first) {
      Fail("decoders disagree", std::string(sparse::IsaName(isa)) + " " + g.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  if (!Header::Parse(file).ok()) return 0;  // Headers are header_fuzz's.
  const int fd = memfd_create("sparse_fuzz", MFD_CLOEXEC);
  if (fd < 0) Fail("memfd_create", std::strerror(errno));
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) Fail("write", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  auto ckpt = Checkpoint::OpenFile("/proc/self/fd/" + std::to_string(fd));
  if (!ckpt.ok()) Fail("open", ckpt.status().ToString());
  auto catalog = sparse::FindSparse(*ckpt);
  if (!catalog.ok()) {
    if (catalog.status().code() != StatusCode::kCorruption) {
      Fail("FindSparse code", catalog.status().ToString());
    }
  } else {
    for (const auto& g : catalog->sparse) CheckGroup(*ckpt, g, file);
  }
  close(fd);
  return 0;
}
