// Sparsify: rewrites a dense safetensors checkpoint as a sparse-bitmask one
// (compressed-tensors >= 0.9 naming, tensorlift/sparse.h), optionally pruning
// the targets by magnitude first.
//
// What is encoded: tensors whose name matches `targets` (a regex searched in
// the name), that are 2-D, floating point (F16, BF16, F32, F64, F8_E4M3,
// F8_E5M2) and named "*.weight" or "*.bias" (the names a group's prefix can
// stand for); of those, the ones whose fraction of bitwise-zero elements
// (after pruning) is at least min_sparsity and whose encoding
// (EncodedBytes) is smaller than the dense bytes. Everything else is copied
// unchanged.
//
// Output, in `output_dir` (created; it must not exist or be empty):
//   - model.safetensors, or model-0000k-of-0000n.safetensors shards of at most
//     max_shard_bytes of tensor data each (a larger single tensor gets a shard
//     of its own; a group's four parts stay in one shard) with
//     model.safetensors.index.json (weight_map of every stored name,
//     metadata.total_size), as transformers' save_pretrained shards. The
//     files are written as tensorlift's writer (the reference's byte order),
//     with the input's first shard's "__metadata__" (e.g. {"format": "pt"}).
//   - when the input is a directory (or an index in one): config.json with
//     quantization_config.sparsity_config = {"format": "sparse-bitmask",
//     "global_sparsity": zeros / elements of the encoded tensors,
//     "sparsity_structure": "unstructured", "targets": the encoded tensors'
//     module names (prefixes), "ignore": []} merged in (other fields kept; a
//     new quantization_config gets "quant_method": "compressed-tensors"; no
//     sparsity_config when nothing was encoded), and every other regular,
//     non-hidden file of that directory up to max_copy_bytes (tokenizer,
//     generation_config.json, ...) copied as is. *.safetensors files and
//     indexes are not copied; larger files are listed as skipped.
// A checkpoint that already holds sparse groups is refused.
//
// Memory: one tensor at a time, so the peak is the largest target's dense
// bytes plus its encoding (other tensors are copied in 16 MiB pieces).
// Targets are read twice: once to count their non-zeros, which fixes every
// offset and so the shard headers, and once to encode them into place.
//
// On error, the files written so far (and output_dir, if this made it) are
// removed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

namespace tensorlift::sparse {

struct SparsifyOptions {
  // Magnitude pruning of the targets before encoding: in every row, the
  // floor(cols * prune) elements of smallest magnitude become all-zero bits.
  // In [0, 1]; nullopt: no pruning.
  std::optional<double> prune;
  // The least fraction of zero elements for a target to be encoded, in [0, 1].
  double min_sparsity = 0.3;
  // ECMAScript regex searched in each tensor name.
  std::string targets = R"(\.weight$)";
  uint64_t max_shard_bytes = 5'000'000'000;  // As transformers' "5GB".
  uint64_t max_copy_bytes = 64ull << 20;     // Per companion file.
  // Merge quantization_config.sparsity_config into the copied config.json
  // (compressed-tensors' description of the encoding). False leaves
  // config.json as it is, for servers that refuse that key (vLLM 0.32 stops
  // at any compressed-tensors sparsity config); tensorlift decodes the
  // weights either way.
  bool write_sparsity_config = true;
};

struct SparsifyReport {
  struct Tensor {
    std::string name;  // The dense name.
    Dtype dtype = Dtype::kU8;
    std::vector<uint64_t> shape;
    bool target = false;  // Examined (and pruned, if asked).
    bool encoded = false;
    uint64_t nnz = 0;  // Targets only: non-zeros after pruning.
    uint64_t dense_bytes = 0;
    uint64_t stored_bytes = 0;  // Bytes written for it (four parts if encoded).
    std::string note;           // Why a tensor was not encoded.
  };
  std::vector<Tensor> tensors;      // Input name order.
  std::vector<std::string> files;   // Written into output_dir, in order.
  std::vector<std::string> copied;  // Companion files copied.
  // Companion files not copied: name, why.
  std::vector<std::pair<std::string, std::string>> skipped;
  uint64_t bytes_in = 0;   // Tensor data of the input.
  uint64_t bytes_out = 0;  // Tensor data written.
  uint64_t encoded = 0;
  uint64_t kept_dense = 0;
  double global_sparsity = 0;  // Zeros / elements over the encoded tensors.
};

// See above. InvalidArgument for bad options or output_dir, errors of the
// input as Checkpoint::Open and FindSparse report them.
Result<SparsifyReport> Sparsify(const std::string& input, const std::string& output_dir,
                                const SparsifyOptions& options = {});

// In each of `rows` rows of `cols` elements at `data`, sets the
// floor(cols * fraction) elements of smallest magnitude to all-zero bits
// (so -0.0 may become +0.0); ties go to the lower column, NaN ranks above
// infinity. dtype: F16, BF16, F32, F64, F8_E4M3 or F8_E5M2, else
// InvalidArgument; fraction in [0, 1].
Status PruneByMagnitude(std::byte* data, Dtype dtype, uint64_t rows, uint64_t cols,
                        double fraction);

}  // namespace tensorlift::sparse
