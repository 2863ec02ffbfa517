#include "sha256.h"

#include <openssl/evp.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

#include "tensorlift/read_file.h"

namespace tensorlift::cli {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

Status ErrnoStatus(const std::string& what, int err) {
  std::string msg = what + ": " + ErrnoText(err);
  if (err == ENOENT) return NotFoundError(std::move(msg));
  if (err == EACCES || err == EPERM) return PermissionDeniedError(std::move(msg));
  return IOError(std::move(msg));
}

// Lowercase hex of a digest.
std::string Hex(const unsigned char* bytes, size_t n) {
  std::string out;
  out.reserve(2 * n);
  char two[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(two, sizeof two, "%02x", bytes[i]);
    out.append(two, 2);
  }
  return out;
}

struct CtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using Ctx = std::unique_ptr<EVP_MD_CTX, CtxDeleter>;

Result<Ctx> NewSha256() {
  Ctx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return InternalError("OpenSSL cannot start a SHA-256 digest");
  }
  return ctx;
}

std::string FinishHex(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  return Hex(md, len);
}

bool IsHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The components of a path, without empty ones and ".".
std::vector<std::string_view> Components(std::string_view path) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view c = path.substr(start, end - start);
    if (!c.empty() && c != ".") out.push_back(c);
    start = end + 1;
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

Status AddEntry(Sha256List* list, std::string_view name, std::string_view digest,
                const std::string& where) {
  if (!IsHex64(digest)) {
    return InvalidArgumentError(where + ": '" + std::string(digest) +
                                "' is not a SHA-256 (64 hexadecimal digits)");
  }
  if (name.empty()) return InvalidArgumentError(where + ": an empty file name");
  list->entries.push_back({std::string(name), Lower(digest)});
  return Status::Ok();
}

// sha256sum's output: "<hex>  name", "<hex> *name" (binary), a leading '\'
// when the name has escapes (\\ and \n); or --tag's "SHA256 (name) = <hex>".
Result<Sha256List> ParseSha256Sum(std::string_view text, const std::string& source) {
  Sha256List list{source, {}};
  size_t line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Trim(line).empty()) continue;
    const std::string where = source + ":" + std::to_string(line_no);
    if (line.rfind("SHA256 (", 0) == 0) {
      const size_t close = line.rfind(") = ");
      if (close == std::string_view::npos || close < 8) {
        return InvalidArgumentError(where + ": expected 'SHA256 (name) = <hex>'");
      }
      TL_RETURN_IF_ERROR(
          AddEntry(&list, line.substr(8, close - 8), Trim(line.substr(close + 4)), where));
      continue;
    }
    const bool escaped = line.front() == '\\';
    if (escaped) line.remove_prefix(1);
    if (line.size() < 66 || !IsHex64(line.substr(0, 64)) || line[64] != ' ' ||
        (line[65] != ' ' && line[65] != '*')) {
      return InvalidArgumentError(where +
                                  ": expected '<64 hex digits>  name' (sha256sum's output)");
    }
    std::string name(line.substr(66));
    if (escaped) {
      std::string unescaped;
      for (size_t i = 0; i < name.size(); ++i) {
        if (name[i] == '\\' && i + 1 < name.size()) {
          ++i;
          unescaped += name[i] == 'n' ? '\n' : name[i];
        } else {
          unescaped += name[i];
        }
      }
      name = std::move(unescaped);
    }
    TL_RETURN_IF_ERROR(AddEntry(&list, name, line.substr(0, 64), where));
  }
  return list;
}

// An entry of the Hub's siblings or tree lists: {"rfilename"|"path": name,
// "lfs": {"sha256"|"oid": hex}}. Ones without "lfs" (kept in git) are skipped.
Status AddHubEntry(Sha256List* list, simdjson::dom::element entry, const std::string& where) {
  simdjson::dom::object obj;
  if (entry.get(obj) != simdjson::SUCCESS) {
    return InvalidArgumentError(where + ": an entry is not an object");
  }
  std::string_view name;
  if (obj["rfilename"].get(name) != simdjson::SUCCESS &&
      obj["path"].get(name) != simdjson::SUCCESS) {
    return InvalidArgumentError(where + ": an entry has no \"rfilename\" or \"path\" string");
  }
  simdjson::dom::object lfs;
  if (obj["lfs"].get(lfs) != simdjson::SUCCESS) return Status::Ok();
  std::string_view digest;
  if (lfs["sha256"].get(digest) != simdjson::SUCCESS &&
      lfs["oid"].get(digest) != simdjson::SUCCESS) {
    return InvalidArgumentError(where + ": the \"lfs\" of '" + std::string(name) +
                                "' has no \"sha256\" or \"oid\" string");
  }
  return AddEntry(list, name, digest, where + ": '" + std::string(name) + "'");
}

Result<Sha256List> ParseJson(std::string_view text, const std::string& source) {
  Sha256List list{source, {}};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    return InvalidArgumentError(source + ": not valid JSON (" +
                                std::string(simdjson::error_message(err)) + ")");
  }
  simdjson::dom::array array;
  if (root.get(array) == simdjson::SUCCESS) {
    for (simdjson::dom::element e : array) TL_RETURN_IF_ERROR(AddHubEntry(&list, e, source));
    return list;
  }
  simdjson::dom::object obj;
  if (root.get(obj) != simdjson::SUCCESS) {
    return InvalidArgumentError(source + ": expected a JSON object or array");
  }
  simdjson::dom::array siblings;
  if (obj["siblings"].get(siblings) == simdjson::SUCCESS) {
    for (simdjson::dom::element e : siblings) {
      TL_RETURN_IF_ERROR(AddHubEntry(&list, e, source + ": siblings"));
    }
    return list;
  }
  for (auto [key, value] : obj) {
    std::string_view digest;
    simdjson::dom::object inner;
    if (value.get(inner) == simdjson::SUCCESS) {
      simdjson::dom::object lfs;
      if (inner["sha256"].get(digest) != simdjson::SUCCESS &&
          !(inner["lfs"].get(lfs) == simdjson::SUCCESS &&
            lfs["sha256"].get(digest) == simdjson::SUCCESS)) {
        return InvalidArgumentError(source + ": '" + std::string(key) +
                                    "' has no \"sha256\" string");
      }
    } else if (value.get(digest) != simdjson::SUCCESS) {
      return InvalidArgumentError(source + ": the value of '" + std::string(key) +
                                  "' is not a string");
    }
    TL_RETURN_IF_ERROR(AddEntry(&list, key, digest, source + ": '" + std::string(key) + "'"));
  }
  return list;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return Hex(md, len);
}

Result<FileDigest> Sha256File(const std::string& path) {
  TL_ASSIGN_OR_RETURN(Ctx ctx, NewSha256());
  // The library's whole-file read: O_DIRECT for a file mostly out of the page
  // cache, buffered with readahead otherwise, the next piece read while this
  // one is hashed.
  TL_ASSIGN_OR_RETURN(const ReadFileReport read,
                      ReadFile(path, [&](const std::byte* data, size_t n) {
                        EVP_DigestUpdate(ctx.get(), data, n);
                        return Status::Ok();
                      }));
  return FileDigest{FinishHex(ctx.get()), read.bytes};
}

std::vector<Result<FileDigest>> Sha256Files(const std::vector<std::string>& paths, int threads) {
  std::vector<Result<FileDigest>> out(paths.size(), Result<FileDigest>(InternalError("not run")));
  size_t n = threads > 0 ? static_cast<size_t>(threads) : std::thread::hardware_concurrency();
  n = std::max<size_t>(1, std::min(n, paths.size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < paths.size();) out[i] = Sha256File(paths[i]);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

Result<Sha256List> ParseSha256List(std::string_view text, const std::string& source) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && (text[first] == '{' || text[first] == '[')) {
    return ParseJson(text, source);
  }
  return ParseSha256Sum(text, source);
}

Result<Sha256List> ReadSha256List(const std::string& source) {
  std::ifstream in(source, std::ios::binary);
  if (!in) return ErrnoStatus(source, errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IOError(source + ": read failed");
  return ParseSha256List(text.str(), source);
}

Result<std::string> ExpectedSha256(const Sha256List& list, const std::string& path) {
  const std::vector<std::string_view> want = Components(path);
  if (want.empty()) return InvalidArgumentError("'" + path + "' names no file");
  // The best match: most trailing components in common, the whole of the
  // entry's name (a relative path) matched; else its last component alone.
  size_t best = 0;
  const Sha256Entry* found = nullptr;
  const Sha256Entry* other = nullptr;  // A different digest matching as well as `found`.
  const Sha256Entry* by_basename = nullptr;
  const Sha256Entry* other_by_basename = nullptr;
  for (const auto& e : list.entries) {
    const std::vector<std::string_view> name = Components(e.name);
    if (name.empty() || name.back() != want.back()) continue;
    if (by_basename == nullptr) {
      by_basename = &e;
    } else if (by_basename->digest != e.digest) {
      other_by_basename = &e;
    }
    if (name.size() > want.size() || !std::equal(name.rbegin(), name.rend(), want.rbegin())) {
      continue;
    }
    if (name.size() > best) {
      best = name.size();
      found = &e;
      other = nullptr;
    } else if (name.size() == best && found->digest != e.digest) {
      other = &e;
    }
  }
  if (found == nullptr) {
    found = by_basename;
    other = other_by_basename;
  }
  if (found == nullptr) {
    return NotFoundError("no SHA-256 known for " + path + " in " + list.source);
  }
  if (other != nullptr) {
    return InvalidArgumentError(list.source + " gives two SHA-256 for " + path + ": '" +
                                found->name + "' " + found->digest + " and '" + other->name + "' " +
                                other->digest);
  }
  return found->digest;
}

Result<std::string> HubSha256(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(path, errno);
  const std::string why =
      "no SHA-256 known for " + path +
      ": it is not a symlink into a Hugging Face cache's blobs/ (a file kept in git rather than "
      "LFS, or a copy of the snapshot); give --sha256 a digest list instead";
  if (!S_ISLNK(st.st_mode)) return NotFoundError(why);
  std::string target(static_cast<size_t>(std::max<off_t>(st.st_size, 0)) + 256, '\0');
  const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  if (n < 0) return ErrnoStatus(path + ": readlink", errno);
  target.resize(static_cast<size_t>(n));
  const std::vector<std::string_view> parts = Components(target);
  if (parts.size() < 2 || parts[parts.size() - 2] != "blobs" || !IsHex64(parts.back())) {
    return NotFoundError(why + " (it points to " + target + ")");
  }
  return Lower(parts.back());
}

}  // namespace tensorlift::cli
