// tl_gpu_kernels_bench [--device cuda:0|emulated] [--mib N] [--reps R]:
// the device-side work of a GPU load, against the device's own limits,
// measured in one run through the device layer (src/device/device.h), the
// same calls the loader's pipeline makes. Prints one JSON object (and a
// table on stderr).
//
// Ops, each over a buffer of N MiB (default 1024 on a GPU, 16 emulated):
// - h2d_pinned: CopyToDevice from pinned memory (the limit of the pinned
//   pipeline: pinned host-to-device bandwidth);
// - d2d: CopyOnDevice between two device buffers (the reference for the
//   kernels: a device-to-device memcpy);
// - realign: CopyOnDevice from a source 2 bytes off its alignment (what the
//   pipeline does for a misaligned tensor);
// - convert_bf16_f16, convert_bf16_f32: Convert of N MiB of bf16;
// - sparse_decode_50: DecodeBitmask of a 50 %-dense bf16 [rows, 4096]
//   tensor of N MiB dense, against d2d of the same dense bytes.
// Throughput is in GB/s of bytes moved (read + written: a copy of B bytes
// moves 2B, a bf16->f32 conversion of B source bytes moves 3B, a decode
// moves its encoded input + its dense output), so each op's ratio against
// d2d says how close it comes to the memory's bandwidth; the decode's ratio
// is its dense output against a d2d copy of the same dense bytes (time
// against time, the Endor target). Each figure is the
// median of R samples (default 9); every sample enqueues the op several times
// and synchronizes once, timed on the host clock.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/dtype.h"

namespace {

using namespace tensorlift;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "tl_gpu_kernels_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

void Check(const Status& st, const std::string& what) {
  if (!st.ok()) Die(what, st);
}

struct Op {
  std::string name;
  uint64_t moved_bytes;  // read + written per call
  uint64_t out_bytes;    // written per call (a decode's dense output)
  std::function<Status()> enqueue;
  int inner = 1;
  std::vector<double> gbps = {};
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda:0";
  uint64_t mib = 0;
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc)
      device_name = argv[++i];
    else if (a == "--mib" && i + 1 < argc)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: tl_gpu_kernels_bench [--device cuda:0|emulated] [--mib N] [--reps R]\n");
      return 2;
    }
  }
  std::shared_ptr<Device> dev;
  if (device_name == "emulated") {
    // The copy model a load's emulated device has (TENSORLIFT_EMULATED_*).
    Result<EmulatedDeviceOptions> options = EmulatedDeviceOptionsFromEnvironment();
    if (!options.ok()) {
      std::fprintf(stderr, "tl_gpu_kernels_bench: %s\n", options.status().ToString().c_str());
      return 2;
    }
    options->prefault_bytes = 0;
    dev = MakeEmulatedDevice(*options);
    if (mib == 0) mib = 16;
  } else {
    int ordinal = 0;
    if (device_name.rfind("cuda:", 0) == 0) ordinal = std::atoi(device_name.c_str() + 5);
    dev = Must(OpenCudaDevice(ordinal), "opening " + device_name);
    if (mib == 0) mib = 1024;
  }
  const uint64_t bytes = mib << 20;
  auto stream = Must(dev->CreateStream(), "stream");
  auto src = Must(dev->Allocate(bytes), "device buffer");
  auto dst = Must(dev->Allocate(2 * bytes), "device buffer");  // room for bf16 -> f32
  auto pinned = Must(dev->AllocatePinned(bytes), "pinned buffer");

  // bf16 values: random normals' upper halves (no NaN patterns beyond the
  // random ones a real checkpoint has). Uploaded once; also the dense input
  // of the sparse case after zeroing half of it.
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal;
  auto* p16 = reinterpret_cast<uint16_t*>(pinned->data());
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    p16[i] = static_cast<uint16_t>(u >> 16);
  }
  Check(stream->CopyToDevice(src->data(), pinned->data(), bytes), "upload");
  Check(stream->Synchronize(), "upload");

  // Sparse: [rows, 4096] bf16 at 50 % density, encoded on the host.
  sparse::BitmaskShape shape{bytes / (4096 * 2), 4096, 2};
  std::vector<std::byte> dense(shape.dense_bytes());
  std::memcpy(dense.data(), pinned->data(), dense.size());
  std::bernoulli_distribution keep(0.5);
  auto* d16 = reinterpret_cast<uint16_t*>(dense.data());
  for (uint64_t i = 0; i < shape.rows * shape.cols; ++i) {
    if (!keep(rng) || d16[i] == 0)
      d16[i] = 0;
    else if (d16[i] == 0x8000)
      d16[i] = 0x3f80;  // -0.0 counts as non-zero; keep it simple
  }
  const uint64_t nnz = sparse::CountNonZero(dense.data(), shape);
  std::vector<std::byte> values(nnz * 2 + 8);
  std::vector<uint8_t> mask(shape.mask_bytes());
  std::vector<int64_t> offsets(shape.rows);
  sparse::Encode(dense.data(), shape, values.data(), mask.data(), offsets.data());
  Check(sparse::Validate(mask.data(), offsets.data(), shape, nnz), "validate");
  const uint64_t enc_bytes = nnz * 2 + mask.size() + offsets.size() * 8;
  auto sp_vals = Must(dev->Allocate(nnz * 2 + 8), "sparse values");
  auto sp_mask = Must(dev->Allocate(mask.size()), "sparse mask");
  auto sp_offs = Must(dev->Allocate(offsets.size() * 8), "sparse offsets");
  auto upload = [&](std::byte* to, const void* from, uint64_t n) {
    for (uint64_t done = 0; done < n;) {
      const uint64_t k = std::min<uint64_t>(n - done, bytes);
      std::memcpy(pinned->data(), static_cast<const std::byte*>(from) + done, k);
      Check(stream->CopyToDevice(to + done, pinned->data(), k), "sparse upload");
      Check(stream->Synchronize(), "sparse upload");
      done += k;
    }
  };
  upload(sp_vals->data(), values.data(), nnz * 2);
  upload(sp_mask->data(), mask.data(), mask.size());
  upload(sp_offs->data(), offsets.data(), offsets.size() * 8);

  // Correctness of the decode on this device, once: decoded bytes == dense.
  {
    Check(stream->DecodeBitmask(
              dst->data(), sp_vals->data(), nnz, reinterpret_cast<const uint8_t*>(sp_mask->data()),
              reinterpret_cast<const int64_t*>(sp_offs->data()), shape.rows, shape.cols, 2),
          "decode");
    std::vector<std::byte> back(shape.dense_bytes());
    for (uint64_t done = 0; done < back.size();) {
      const uint64_t k = std::min<uint64_t>(back.size() - done, bytes);
      Check(stream->CopyToHost(pinned->data(), dst->data() + done, k), "download");
      Check(stream->Synchronize(), "download");
      std::memcpy(back.data() + done, pinned->data(), k);
      done += k;
    }
    if (std::memcmp(back.data(), dense.data(), back.size()) != 0) {
      std::fprintf(stderr, "tl_gpu_kernels_bench: the decoded tensor differs from the dense one\n");
      return 1;
    }
  }

  std::vector<Op> ops;
  ops.push_back({"h2d_pinned", 2 * bytes, bytes,
                 [&] { return stream->CopyToDevice(dst->data(), pinned->data(), bytes); }});
  ops.push_back({"d2d", 2 * bytes, bytes,
                 [&] { return stream->CopyOnDevice(dst->data(), src->data(), bytes); }});
  ops.push_back({"realign", 2 * (bytes - 256), bytes - 256,
                 [&] { return stream->CopyOnDevice(dst->data(), src->data() + 2, bytes - 256); }});
  ops.push_back({"convert_bf16_f16", 2 * bytes, bytes, [&] {
                   return stream->Convert(dst->data(), Dtype::kF16, src->data(), Dtype::kBF16,
                                          bytes / 2);
                 }});
  ops.push_back({"convert_bf16_f32", 3 * bytes, 2 * bytes, [&] {
                   return stream->Convert(dst->data(), Dtype::kF32, src->data(), Dtype::kBF16,
                                          bytes / 2);
                 }});
  ops.push_back({"sparse_decode_50", enc_bytes + shape.dense_bytes(), shape.dense_bytes(), [&] {
                   return stream->DecodeBitmask(dst->data(), sp_vals->data(), nnz,
                                                reinterpret_cast<const uint8_t*>(sp_mask->data()),
                                                reinterpret_cast<const int64_t*>(sp_offs->data()),
                                                shape.rows, shape.cols, 2);
                 }});
  ops.push_back({"d2d_dense_of_sparse", 2 * shape.dense_bytes(), shape.dense_bytes(), [&] {
                   return stream->CopyOnDevice(dst->data(), src->data(), shape.dense_bytes());
                 }});

  auto sample = [&](Op& op) {
    const auto t0 = Clock::now();
    for (int i = 0; i < op.inner; ++i) Check(op.enqueue(), op.name);
    Check(stream->Synchronize(), op.name);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (Op& op : ops) {  // Warm-up, and enough calls per sample for >= 20 ms.
    sample(op);
    while (sample(op) < 0.02 && op.inner < (1 << 16)) op.inner *= 2;
  }
  for (int r = 0; r < reps; ++r) {
    for (Op& op : ops) {  // Turns, so that a change in load hits every op alike.
      const double s = sample(op);
      op.gbps.push_back(static_cast<double>(op.moved_bytes) * op.inner / s / 1e9);
    }
  }
  auto find = [&](const std::string& name) -> const Op& {
    for (const Op& op : ops)
      if (op.name == name) return op;
    return ops.front();
  };
  std::printf(
      "{\"device\": \"%s\", \"mib\": %llu, \"reps\": %d, \"sparse_density\": %.4f, \"ops\": {",
      dev->name().c_str(), static_cast<unsigned long long>(mib), reps,
      static_cast<double>(nnz) / static_cast<double>(shape.rows * shape.cols));
  std::fprintf(stderr, "%-22s %12s %12s %10s\n", "op", "GB/s moved", "GB/s out", "vs d2d");
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const double moved = Median(op.gbps);
    const double out =
        moved * static_cast<double>(op.out_bytes) / static_cast<double>(op.moved_bytes);
    // The decode against a copy of its dense bytes (time against time); the
    // others against d2d in bytes moved.
    double ratio;
    if (op.name == "sparse_decode_50") {
      const Op& ref = find("d2d_dense_of_sparse");
      const double ref_out = Median(ref.gbps) * static_cast<double>(ref.out_bytes) /
                             static_cast<double>(ref.moved_bytes);
      ratio = ref_out > 0 ? out / ref_out : 0.0;
    } else {
      const double ref = Median(find("d2d").gbps);
      ratio = ref > 0 ? moved / ref : 0.0;
    }
    std::printf(
        "%s\"%s\": {\"gbps_moved\": %.3f, \"gbps_out\": %.3f, \"vs_d2d\": %.3f, \"moved_bytes\": "
        "%llu, "
        "\"out_bytes\": %llu}",
        i ? ", " : "", op.name.c_str(), moved, out, ratio,
        static_cast<unsigned long long>(op.moved_bytes),
        static_cast<unsigned long long>(op.out_bytes));
    std::fprintf(stderr, "%-22s %12.2f %12.2f %9.2fx\n", op.name.c_str(), moved, out, ratio);
  }
  std::printf("}}\n");
  return 0;
}
