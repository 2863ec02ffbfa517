// ReadFile (tensorlift/read_file.h): every mode gives a file's bytes in order,
// around the piece size and O_DIRECT's blocks; a consumer's error stops the
// read; a file cut short while it is read gets the load's verdict (IOError,
// "short read", naming it), proven by construction: the cut happens in the
// consumer of the first piece, before the third piece's read may start.
#include "tensorlift/read_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;

constexpr uint64_t kPiece = 64 << 10;

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

TEST(ReadFileTest, EveryModeGivesTheBytesInOrder) {
  ScratchDir dir("tl_read_file");
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{4097},
                     kPiece - 1, kPiece, kPiece + 1, 3 * kPiece + 123}) {
    const std::string bytes = Bytes(n, static_cast<uint32_t>(n));
    const std::string path = dir.Write("f" + std::to_string(n), bytes);
    for (IoMode mode : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect}) {
      SCOPED_TRACE(std::to_string(n) + " bytes, " + std::string(IoModeName(mode)));
      std::string got;
      size_t pieces = 0;
      ReadFileOptions options;
      options.mode = mode;
      options.piece_bytes = kPiece;
      auto r = ReadFile(
          path,
          [&](const std::byte* data, size_t len) {
            EXPECT_LE(len, kPiece);
            got.append(reinterpret_cast<const char*>(data), len);
            ++pieces;
            return Status::Ok();
          },
          options);
      ASSERT_OK(r);
      EXPECT_EQ(got, bytes);
      EXPECT_EQ(r->bytes, n);
      EXPECT_EQ(pieces, (n + kPiece - 1) / kPiece);
      EXPECT_NE(r->mode, IoMode::kAuto);
      if (mode == IoMode::kBuffered) {
        EXPECT_EQ(r->mode, IoMode::kBuffered);
      }
    }
  }
}

TEST(ReadFileTest, AConsumersErrorStopsTheRead) {
  ScratchDir dir("tl_read_file");
  const std::string path = dir.Write("f", Bytes(5 * kPiece, 3));
  ReadFileOptions options;
  options.piece_bytes = kPiece;
  int calls = 0;
  auto r = ReadFile(
      path,
      [&](const std::byte*, size_t) {
        return ++calls == 2 ? UnavailableError("enough") : Status::Ok();
      },
      options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("enough"));
  EXPECT_EQ(calls, 2);
}

TEST(ReadFileTest, AFileCutShortWhileReadIsTheLoadsVerdict) {
  ScratchDir dir("tl_read_file");
  const std::string path = dir.Write("f", Bytes(4 * kPiece, 4));
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    SCOPED_TRACE(std::string(IoModeName(mode)));
    dir.Write("f", Bytes(4 * kPiece, 4));
    ReadFileOptions options;
    options.mode = mode;
    options.piece_bytes = kPiece;
    int calls = 0;
    auto r = ReadFile(
        path,
        [&](const std::byte*, size_t) {
          // The third piece goes into this piece's buffer: it is read after this returns.
          if (++calls == 1) std::filesystem::resize_file(path, kPiece);
          return Status::Ok();
        },
        options);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kIOError) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(path));
    EXPECT_THAT(r.status().message(), HasSubstr("short read"));
    EXPECT_LE(calls, 2);
  }
}

TEST(ReadFileTest, WhatItRefusesIsNamed) {
  ScratchDir dir("tl_read_file");
  auto consume = [](const std::byte*, size_t) { return Status::Ok(); };
  auto missing = ReadFile(dir / "missing", consume);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir / "missing"));
  auto directory = ReadFile(dir.File(""), consume);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  const std::string path = dir.Write("f", "abc");
  ReadFileOptions mmap;
  mmap.mode = IoMode::kMmap;
  EXPECT_EQ(ReadFile(path, consume, mmap).status().code(), StatusCode::kInvalidArgument);
  ReadFileOptions zero;
  zero.piece_bytes = 0;
  EXPECT_EQ(ReadFile(path, consume, zero).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensorlift
