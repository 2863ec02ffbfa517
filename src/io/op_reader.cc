// OpReader (read_op.h): one op read synchronously, through a scratch buffer for
// bounce and row ops; the engines' file checks.
#include <cstdlib>
#include <cstring>

#include "common/checked_math.h"
#include "io/read_op.h"

namespace tensorlift {

OpReader::~OpReader() { std::free(scratch_); }

Status OpReader::Grow(uint64_t bytes) {
  if (bytes <= scratch_size_) return Status::Ok();
  std::free(scratch_);
  scratch_size_ = 0;
  scratch_ =
      static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, AlignUp(bytes, kDirectAlign)));
  if (scratch_ == nullptr) return ResourceExhaustedError("cannot allocate a bounce buffer");
  scratch_size_ = bytes;
  return Status::Ok();
}

Status OpReader::Read(int fd, const ReadOp& op) {
  if (op.row_bytes > 0 && op.length > 0) {
    // The span covering the rows, then each row copied out.
    const uint64_t rows = op.length / op.row_bytes;
    const uint64_t span = (rows - 1) * op.row_stride + op.row_bytes;
    TL_RETURN_IF_ERROR(Grow(span));
    TL_RETURN_IF_ERROR(ReadAtLeast(fd, scratch_, op.offset, span, span));
    for (uint64_t i = 0; i < rows; ++i) {
      std::memcpy(op.dest + i * op.row_bytes, scratch_ + i * op.row_stride, op.row_bytes);
    }
    return Status::Ok();
  }
  if (!op.bounce) return ReadAtLeast(fd, op.dest, op.offset, op.length, op.length);
  // O_DIRECT: read the aligned span that covers the range, copy out the bytes.
  const uint64_t a0 = op.offset / kDirectAlign * kDirectAlign;
  const uint64_t a1 = (op.offset + op.length + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  const uint64_t span = a1 - a0;
  TL_RETURN_IF_ERROR(Grow(span));
  const uint64_t need = op.offset + op.length - a0;  // Bytes of the span we must get.
  // The span may run past the end of the file (its last block): only `need` must come.
  TL_RETURN_IF_ERROR(ReadAtLeast(fd, scratch_, a0, span, need));
  std::memcpy(op.dest, scratch_ + (op.offset - a0), op.length);
  return Status::Ok();
}

Status ReadEngine::InFileOf(const ReadOp& op, Status st) const {
  if (op.shard < files_.size() && files_[op.shard].path)
    return st.WithContext(*files_[op.shard].path);
  return st;
}

Status ReadEngine::ValidFile(const ReadOp& op) const {
  if (op.shard >= files_.size())
    return InternalError("a read names file " + std::to_string(op.shard) + " of an engine with " +
                         std::to_string(files_.size()));
  return Status::Ok();
}

}  // namespace tensorlift
