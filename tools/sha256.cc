#include "sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

namespace tensorlift::cli {
namespace {

constexpr size_t kChunk = size_t{8} << 20;  // Bytes per read, and per buffer.
constexpr size_t kAlign = 4096;             // O_DIRECT's alignment (offsets, lengths, memory).

std::string ErrnoText(int err) { return std::strerror(err); }

Status ErrnoStatus(const std::string& what, int err) {
  std::string msg = what + ": " + ErrnoText(err);
  if (err == ENOENT) return NotFoundError(std::move(msg));
  if (err == EACCES || err == EPERM) return PermissionDeniedError(std::move(msg));
  return IOError(std::move(msg));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t[], FreeDeleter>;

Result<AlignedBuffer> AllocateAligned(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) {
    return ResourceExhaustedError("cannot allocate a " + std::to_string(bytes) + "-byte buffer");
  }
  return AlignedBuffer(static_cast<uint8_t*>(p));
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

// The fraction of the file's pages in the page cache (mincore); 0 when it
// cannot tell.
double ResidentFraction(int fd, uint64_t size) {
  if (size == 0) return 1.0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 0.0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = (size + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  double fraction = 0.0;
  if (::mincore(map, size, vec.data()) == 0) {
    size_t resident = 0;
    for (unsigned char v : vec) resident += v & 1;
    fraction = static_cast<double>(resident) / static_cast<double>(pages);
  }
  ::munmap(map, size);
  return fraction;
}

// Reads [0, size) of `fd` into two buffers in turn on a thread of its own,
// handing each full one to the hashing side. With O_DIRECT the reads stay
// aligned until the last; a short read that leaves them unaligned turns
// O_DIRECT off for the rest.
class DoubleBufferedReader {
 public:
  DoubleBufferedReader(int fd, uint64_t size, bool direct, const std::string& path)
      : fd_(fd), size_(size), direct_(direct), path_(path) {}
  ~DoubleBufferedReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  Status Start() {
    for (auto& slot : slots_) {
      TL_ASSIGN_OR_RETURN(slot.data, AllocateAligned(kChunk));
    }
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  // Hands `consume(data, len)` each buffer in file order; stops at the end
  // of the file or at the first error.
  template <typename F>
  Status Consume(F&& consume) {
    for (uint64_t i = 0;; ++i) {
      Slot& slot = slots_[i % 2];
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return slot.full; });
        if (!slot.status.ok()) return slot.status;
      }
      if (slot.len > 0) consume(slot.data.get(), slot.len);
      const bool last = slot.last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.full = false;
      }
      cv_.notify_all();
      if (last) return Status::Ok();
    }
  }

 private:
  struct Slot {
    AlignedBuffer data;
    size_t len = 0;
    bool full = false;
    bool last = false;
    Status status;
  };

  void Run() {
    uint64_t offset = 0;
    for (uint64_t i = 0;; ++i) {
      Slot& slot = slots_[i % 2];
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !slot.full || stop_; });
        if (stop_) return;
      }
      size_t len = 0;
      Status status = Fill(slot.data.get(), offset, &len);
      offset += len;
      const bool done = !status.ok() || offset >= size_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.len = len;
        slot.status = std::move(status);
        slot.last = done;
        slot.full = true;
      }
      cv_.notify_all();
      if (done) return;
    }
  }

  // Reads up to kChunk bytes at `offset` (fewer only at the end of the file).
  Status Fill(uint8_t* buf, uint64_t offset, size_t* len) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, size_ - offset));
    size_t got = 0;
    while (got < want) {
      const uint64_t at = offset + got;
      if (direct_ && at % kAlign != 0) {
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
        direct_ = false;
      }
      // O_DIRECT lengths are multiples of the alignment; the last read asks
      // for the rest of the block and gets the bytes up to the end.
      size_t ask = want - got;
      if (direct_) ask = (ask + kAlign - 1) / kAlign * kAlign;
      const ssize_t n = ::pread(fd_, buf + got, ask, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(path_ + ": read at offset " + std::to_string(at), errno);
      }
      if (n == 0) {
        return IOError(path_ + ": the file ended at byte " + std::to_string(at) + " of " +
                       std::to_string(size_) + " while being hashed (did it change?)");
      }
      got += std::min(static_cast<size_t>(n), want - got);
    }
    *len = got;
    return Status::Ok();
  }

  const int fd_;
  const uint64_t size_;
  bool direct_;  // The reader thread's alone once started.
  const std::string& path_;
  Slot slots_[2];
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

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
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoStatus(path, errno);
  Fd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(path + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // O_DIRECT for a file mostly on disk, where the filesystem takes it (not
  // tmpfs, some FUSE ones: EINVAL); plain reads with readahead otherwise.
  bool direct = false;
  if (size >= kChunk && ResidentFraction(fd.get(), size) < 0.5) {
    const int flags = ::fcntl(fd.get(), F_GETFL);
    direct = flags >= 0 && ::fcntl(fd.get(), F_SETFL, flags | O_DIRECT) == 0;
  }
  if (!direct) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  TL_ASSIGN_OR_RETURN(Ctx ctx, NewSha256());
  if (size > 0) {
    DoubleBufferedReader reader(fd.get(), size, direct, path);
    TL_RETURN_IF_ERROR(reader.Start());
    TL_RETURN_IF_ERROR(reader.Consume(
        [&](const uint8_t* data, size_t len) { EVP_DigestUpdate(ctx.get(), data, len); }));
  }
  return FileDigest{FinishHex(ctx.get()), size};
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
