// The safetensors format: parsing and validating a header, and writing files.
//
//   [ 8 bytes: N, u64 little-endian ][ N bytes: UTF-8 JSON header ][ data ]
//
// A Header exists only if it passed every rule of the reference reader, in the
// reference's order (docs/format.md lists them with their error names):
//   HeaderTooSmall, HeaderTooLarge, InvalidHeaderLength, InvalidHeader (UTF-8),
//   InvalidHeaderDeserialization (JSON and schema), DuplicateTensor (stricter
//   than the reference), InvalidOffset, ValidationOverflow, MisalignedSlice,
//   TensorInvalidInfo, MetadataIncompleteBuffer.
// Each error is a Corruption status whose message starts with the rule's name
// and names the tensor and the numbers. File-level entry points prefix the
// path once.
//
// Headers are immutable values and may be shared between threads.
#ifndef TENSORLIFT_SAFETENSORS_H_
#define TENSORLIFT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

namespace tensorlift {

// The reference's limit on N, inclusive.
inline constexpr uint64_t kMaxHeaderSize = 100'000'000;

// Metadata: the string-to-string map of "__metadata__". std::map keeps keys
// sorted, which also makes written files reproducible.
using Metadata = std::map<std::string, std::string>;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  // Byte range [begin, end) relative to the start of the data section.
  uint64_t begin = 0;
  uint64_t end = 0;
  // Product of shape (1 for rank 0).
  uint64_t num_elements = 0;

  uint64_t nbytes() const { return end - begin; }
};

// Which file, in which state, a header was read from: a later reader compares
// it with what it opens to detect a file changed or replaced in between.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

class Header {
 public:
  // Parses and validates a whole file held in memory.
  static Result<Header> Parse(std::span<const std::byte> file_bytes);
  // Parses and validates from the file's first bytes: `prefix` must hold at
  // least 8 + N bytes (it may hold more); `file_size` is the whole file's size.
  static Result<Header> ParsePrefix(std::span<const std::byte> prefix, uint64_t file_size);
  // Opens `path`, reads only its header (bounded by kMaxHeaderSize and the file
  // size, checked before any allocation) and validates it. Errors start with
  // the path. `identity`, if given, receives the file's identity as opened.
  static Result<Header> ReadFile(const std::string& path, FileIdentity* identity = nullptr);

  // Tensors in file (data offset) order; ties keep the header's order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Looks a tensor up by name; nullptr if absent.
  const TensorInfo* Find(std::string_view name) const;
  // Tensor indices (into tensors()) sorted by name, bytewise.
  const std::vector<uint32_t>& by_name() const { return by_name_; }

  // "__metadata__": nullopt when absent or null, a map (maybe empty) otherwise.
  const std::optional<Metadata>& metadata() const { return metadata_; }

  uint64_t header_size() const { return header_size_; }      // N.
  uint64_t data_offset() const { return 8 + header_size_; }  // Start of data.
  uint64_t data_size() const { return data_size_; }
  uint64_t file_size() const { return data_offset() + data_size_; }

 private:
  friend class HeaderParser;
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> by_name_;
  std::optional<Metadata> metadata_;
  uint64_t header_size_ = 0;
  uint64_t data_size_ = 0;
};

// A tensor to write: its bytes are borrowed for the duration of the call.
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  std::span<const std::byte> data;
};

// Builds the header bytes (8-byte length + JSON padded with spaces to a
// multiple of 8) for `tensors`, byte-identical to the reference writer's:
// tensors sorted by dtype descending then name, compact JSON, "__metadata__"
// first when present. Sets *order to the data order (indices into tensors).
// Rejects duplicate names, the name "__metadata__", data whose size does not
// match dtype x shape, and headers over kMaxHeaderSize.
Result<std::string> SerializeHeader(std::span<const TensorView> tensors,
                                    const std::optional<Metadata>& metadata,
                                    std::vector<size_t>* order);

// A tensor as a header describes it, without its data: for writers that
// place the data themselves (sparsify writes each tensor at its offset).
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
};
// The same header from sizes alone (same rules and checks).
Result<std::string> SerializeHeader(std::span<const TensorSpec> tensors,
                                    const std::optional<Metadata>& metadata,
                                    std::vector<size_t>* order);

// Serializes a whole file into memory.
Result<std::vector<std::byte>> Serialize(std::span<const TensorView> tensors,
                                         const std::optional<Metadata>& metadata);

// Writes a file: to a temporary file in the same directory, then renamed over
// `path`, so a reader of the old file (even through a mapping) is undisturbed
// and nobody sees a partial file.
Status WriteFile(const std::string& path, std::span<const TensorView> tensors,
                 const std::optional<Metadata>& metadata);

}  // namespace tensorlift

#endif  // TENSORLIFT_SAFETENSORS_H_
