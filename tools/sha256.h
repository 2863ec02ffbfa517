// SHA-256 of whole files, and the digests a Hugging Face repository lists for
// them: `tensorlift verify --sha256 SOURCE`. Linked into the CLI only (it is
// the one user of OpenSSL); tests/tools/sha256_test.cc tests it.
#ifndef TENSORLIFT_TOOLS_SHA256_H_
#define TENSORLIFT_TOOLS_SHA256_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift::cli {

// The lowercase hex SHA-256 of `data` (OpenSSL's EVP).
std::string Sha256Hex(std::string_view data);

struct FileDigest {
  std::string digest;  // Lowercase hex, 64 characters.
  uint64_t bytes = 0;  // How many bytes were hashed (the file's size).
};

// The SHA-256 of a file's bytes, with OpenSSL's EVP (which uses the CPU's
// SHA extensions where it has them), read by the library's ReadFile
// (tensorlift/read_file.h): a reader thread fills one 8 MiB buffer while the
// caller hashes the other; a file mostly out of the page cache is read with
// O_DIRECT where its filesystem allows it, a cached one with plain reads.
// Errors name the file.
Result<FileDigest> Sha256File(const std::string& path);

// Sha256File of each path, up to `threads` files at a time (0: one per core,
// std::thread::hardware_concurrency). Results are in the order of `paths`.
std::vector<Result<FileDigest>> Sha256Files(const std::vector<std::string>& paths, int threads = 0);

// What a repository lists: a file name (a path relative to the repository
// root, as listed) and its SHA-256.
struct Sha256Entry {
  std::string name;
  std::string digest;  // Lowercase hex.
};
struct Sha256List {
  std::string source;  // The file it came from, for messages.
  std::vector<Sha256Entry> entries;
};

// Parses the text of a digest list, `source` naming it in messages. Text whose
// first non-blank character is '{' or '[' is JSON, in one of these forms:
//   {"model.safetensors": "<hex>", ...}    (a value may also be {"sha256": hex})
//   {"siblings": [{"rfilename": ..., "lfs": {"sha256": ...}}, ...]}
//                                          (the Hub's /api/models/ID answer)
//   [{"path": ..., "lfs": {"oid": ...}}, ...]   (the Hub's /tree/ answer)
// (siblings and tree entries without "lfs" are files kept in git, which have
// no SHA-256 there, and are left out); anything else is `sha256sum` output,
// "<hex>  name" or "<hex> *name" per line (and sha256sum --tag's
// "SHA256 (name) = <hex>").
Result<Sha256List> ParseSha256List(std::string_view text, const std::string& source);
// Reads the file `source` and parses it.
Result<Sha256List> ReadSha256List(const std::string& source);

// The digest `list` gives for the file `path`: an entry whose name is the
// trailing components of `path` (the longest such one), else the one entry
// whose name's last component is `path`'s. NotFound ("no SHA-256 known for
// PATH in SOURCE") when there is none; InvalidArgument when two entries with
// different digests match equally.
Result<std::string> ExpectedSha256(const Sha256List& list, const std::string& path);

// The digest a Hugging Face hub cache gives for `path`: in a snapshot
// (models--ORG--NAME/snapshots/REV/), a file stored with LFS is a symlink to
// ../../blobs/<its SHA-256>. NotFound naming `path` when it is not such a
// symlink (a file kept in git, or a copy of the snapshot).
Result<std::string> HubSha256(const std::string& path);

}  // namespace tensorlift::cli

#endif  // TENSORLIFT_TOOLS_SHA256_H_
