#include "remote/handover.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>

#include "common/posix_file.h"
#include "device/host_buffer.h"
#include "load/checkpoint_builder.h"
#include "remote/auth.h"

namespace tensorlift::remote {
namespace {

constexpr size_t kMaxRequest = 1024;
constexpr size_t kFdsPerPacket = 64;
constexpr size_t kMaxRegions = 1u << 16;  // ManifestLimits::max_regions.

// A descriptor closed when it goes out of scope (unless released).
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) ::close(fd);
  fds->clear();
}

// The sockaddr of abstract socket `name` ("@..." as the manifest has it).
Result<socklen_t> AbstractAddress(const std::string& name, sockaddr_un* addr) {
  if (name.size() < 2 || name[0] != '@' || name.size() > sizeof(addr->sun_path)) {
    return InvalidArgumentError("handover socket '" + name + "' is not an abstract socket name");
  }
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data() + 1, name.size() - 1);  // sun_path[0] = 0.
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
}

void SetTimeouts(int fd, int timeout_ms) {
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// One packet of descriptors: a byte of data and room for kFdsPerPacket.
struct FdPacket {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerPacket)];
  msghdr msg{};
  FdPacket() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  FdPacket(const FdPacket&) = delete;
  FdPacket& operator=(const FdPacket&) = delete;
};

// Lowercase hex of `bytes`.
std::string HexBytes(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    out += kHex[static_cast<unsigned char>(c) >> 4];
    out += kHex[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

Status SendText(int fd, const std::string& text) {
  if (::send(fd, text.data(), text.size(), MSG_NOSIGNAL) < 0) return PosixError("send", errno);
  return Status::Ok();
}

}  // namespace

std::string HandoverHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  if (id.size() != 36) return "";
  return id;
}

namespace {

std::string AnnouncementName(const std::string& digest, int rank, int size) {
  return "@tensorlift/key/" + digest + "/" + std::to_string(rank) + "-of-" + std::to_string(size);
}

// A listening abstract socket of `type` named `name`, and an eventfd to stop its loop.
Status Listen(const std::string& name, int type, int* listen_fd, int* stop_fd) {
  sockaddr_un addr;
  TL_ASSIGN_OR_RETURN(const socklen_t len, AbstractAddress(name, &addr));
  *listen_fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (*listen_fd < 0) return PosixError("socket", errno);
  if (::bind(*listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int e = errno;
    if (e == EADDRINUSE) return UnavailableError(name + " is already taken");
    return PosixError("bind " + name, e);
  }
  if (::listen(*listen_fd, 64) != 0) return PosixError("listen", errno);
  *stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (*stop_fd < 0) return PosixError("eventfd", errno);
  return Status::Ok();
}

// Accepts connections until `stop_fd` is written, calling serve(connection).
void AcceptLoop(int listen_fd, int stop_fd, const std::function<void(int)>& serve) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    Fd conn(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.fd < 0) continue;
    SetTimeouts(conn.fd, 2000);
    serve(conn.fd);
  }
}

void StopLoop(std::thread* thread, int stop_fd) {
  if (!thread->joinable()) return;
  const uint64_t one = 1;
  (void)!::write(stop_fd, &one, sizeof one);
  thread->join();
}

}  // namespace

Result<std::unique_ptr<HandoverServer>> HandoverServer::Start(
    std::vector<int> fds, std::string token, std::function<bool(const std::string&)> session_open,
    const std::vector<ExportedMemory>* device) {
  std::unique_ptr<HandoverServer> s(new HandoverServer());
  if (device) {
    fds.clear();
    for (const ExportedMemory& e : *device) {
      fds.push_back(e.fd);
      s->records_.push_back("D " + std::to_string(e.bytes) + " " + std::to_string(e.pid) + " " +
                            (e.handle.empty() ? std::string("-") : HexBytes(e.handle)));
    }
  }
  if (fds.empty() || fds.size() > kMaxRegions)
    return InvalidArgumentError("handover: " + std::to_string(fds.size()) + " regions");
  s->fds_ = std::move(fds);
  s->token_ = std::move(token);
  s->session_open_ = std::move(session_open);
  s->socket_ = "@tensorlift/" + std::to_string(::getpid()) + "/" + RandomNonce().substr(0, 16);
  Status st = Listen(s->socket_, SOCK_SEQPACKET, &s->listen_fd_, &s->stop_fd_);
  if (!st.ok()) return st.WithContext("handover");
  HandoverServer* self = s.get();
  s->thread_ = std::thread([self] { self->Loop(); });
  return s;
}

HandoverServer::~HandoverServer() {
  StopLoop(&thread_, stop_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void HandoverServer::Loop() {
  AcceptLoop(listen_fd_, stop_fd_, [this](int conn) { Serve(conn); });
}

void HandoverServer::Serve(int conn) {
  char buf[kMaxRequest + 1];
  const ssize_t n = ::recv(conn, buf, kMaxRequest, 0);
  if (n <= 0) return;
  const std::string request(buf, static_cast<size_t>(n));
  auto refuse = [&](const std::string& why) { SendText(conn, "ERR " + why).IgnoreError(); };
  // "TLHANDOVER1 <session> <auth>"
  const size_t a = request.find(' ');
  const size_t b = a == std::string::npos ? a : request.find(' ', a + 1);
  if (b == std::string::npos || request.compare(0, a, "TLHANDOVER1") != 0)
    return refuse("malformed request");
  const std::string session = request.substr(a + 1, b - a - 1);
  const std::string auth = request.substr(b + 1);
  if (session.empty() || session.size() > 64 ||
      !std::all_of(session.begin(), session.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    return refuse("malformed session id");
  }
  if (!token_.empty()) {
    RequestVerifier verifier(token_);
    Status st = verifier.Verify(auth == "-" ? std::string_view() : std::string_view(auth),
                                "HANDOVER", "/v1/handover/" + session, UnixSeconds());
    if (!st.ok()) return refuse(st.message());
  } else {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
      return refuse("cannot tell who is asking (SO_PEERCRED)");
    if (cred.uid != ::geteuid() && cred.uid != 0) {
      return refuse("memory goes only to processes of user " + std::to_string(::geteuid()) +
                    " without a token; uid " + std::to_string(cred.uid) + " asked");
    }
  }
  if (!session_open_(session)) return refuse("no open session " + session);
  if (!SendText(conn, "OK " + std::to_string(fds_.size())).ok()) return;
  if (!records_.empty()) {
    for (size_t i = 0; i < fds_.size(); ++i) {
      FdPacket packet;
      msghdr& msg = packet.msg;
      std::string record = records_[i];
      packet.iov = iovec{record.data(), record.size()};
      if (fds_[i] >= 0) {
        msg.msg_controllen = CMSG_SPACE(sizeof(int));
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fds_[i], sizeof(int));
      } else {
        msg.msg_control = nullptr;
        msg.msg_controllen = 0;
      }
      if (::sendmsg(conn, &msg, MSG_NOSIGNAL) < 0) return;
    }
    ++handed_over_;
    return;
  }
  for (size_t i = 0; i < fds_.size(); i += kFdsPerPacket) {
    const size_t k = std::min(kFdsPerPacket, fds_.size() - i);
    FdPacket packet;
    msghdr& msg = packet.msg;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * k);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * k);
    std::memcpy(CMSG_DATA(c), fds_.data() + i, sizeof(int) * k);
    if (::sendmsg(conn, &msg, MSG_NOSIGNAL) < 0) return;
  }
  ++handed_over_;
}

namespace {

// Connects to `socket`, asks for `session`'s `regions` and checks the "OK n"
// answer: the connection, ready for the regions' packets.
Result<std::unique_ptr<Fd>> AskForHandover(const std::string& socket, const std::string& session,
                                           const std::string& token, int timeout_ms,
                                           size_t regions) {
  sockaddr_un addr;
  TL_ASSIGN_OR_RETURN(const socklen_t len, AbstractAddress(socket, &addr));
  auto fd = std::make_unique<Fd>(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd->fd < 0) return PosixError("handover: socket", errno);
  SetTimeouts(fd->fd, timeout_ms);
  if (::connect(fd->fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return UnavailableError("handover: cannot reach " + socket + " (" +
                            PosixError("connect", errno).message() + ")");
  }
  const std::string auth = token.empty() ? "-"
                                         : SignRequest(token, "HANDOVER", "/v1/handover/" + session,
                                                       UnixSeconds(), RandomNonce());
  TL_RETURN_IF_ERROR(SendText(fd->fd, "TLHANDOVER1 " + session + " " + auth));
  char buf[kMaxRequest + 1];
  const ssize_t n = ::recv(fd->fd, buf, kMaxRequest, 0);
  if (n < 0) return PosixError("handover: receive from " + socket, errno);
  const std::string answer(buf, static_cast<size_t>(n));
  if (answer.compare(0, 4, "ERR ") == 0)
    return PermissionDeniedError("handover refused by " + socket + ": " + answer.substr(4));
  if (answer != "OK " + std::to_string(regions)) {
    return CorruptionError("handover: " + socket + " answered '" + answer.substr(0, 64) +
                           "', expected OK " + std::to_string(regions));
  }
  return fd;
}

// A decimal u64 of at most 20 digits, all of `text`.
bool ParseU64(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// "D <bytes> <pid> <hex or ->" into `e` (bytes, pid, handle).
bool ParseDeviceRecord(std::string_view text, ExportedMemory* e) {
  std::string_view fields[4];
  for (int i = 0; i < 4; ++i) {
    const size_t space = text.find(' ');
    if ((space == std::string_view::npos) != (i == 3)) return false;
    fields[i] = text.substr(0, space);
    text = i == 3 ? std::string_view() : text.substr(space + 1);
  }
  uint64_t pid = 0;
  if (fields[0] != "D" || !ParseU64(fields[1], &e->bytes) || !ParseU64(fields[2], &pid) ||
      pid > INT32_MAX) {
    return false;
  }
  e->pid = static_cast<int64_t>(pid);
  if (fields[3] == "-") return true;
  const std::string_view hex = fields[3];
  if (hex.size() % 2 != 0 || hex.size() > 512) return false;
  e->handle.clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (char c : hex.substr(i, 2)) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    e->handle.push_back(static_cast<char>(v));
  }
  return true;
}

}  // namespace

Result<std::vector<ExportedMemory>> ReceiveDeviceHandover(const std::string& socket,
                                                          const std::string& session,
                                                          const std::string& token, int timeout_ms,
                                                          size_t regions) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<Fd> fd,
                      AskForHandover(socket, session, token, timeout_ms, regions));
  std::vector<ExportedMemory> out(regions);
  for (size_t i = 0; i < regions; ++i) {
    FdPacket packet;
    char text[kMaxRequest];
    packet.iov = iovec{text, sizeof text};
    msghdr& msg = packet.msg;
    const ssize_t got = ::recvmsg(fd->fd, &msg, MSG_CMSG_CLOEXEC);
    if (got <= 0) {
      return PosixError("handover: receive region " + std::to_string(i) + " from " + socket,
                        got < 0 ? errno : ECONNRESET);
    }
    // Every descriptor that came is owned before anything is checked.
    size_t fds = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t j = 0; j < k; ++j, ++fds) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
        if (out[i].fd < 0) {
          out[i].fd = received;
        } else {
          ::close(received);
        }
      }
    }
    const std::string_view record(text, static_cast<size_t>(got));
    if ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || fds > 1 ||
        !ParseDeviceRecord(record, &out[i])) {
      return CorruptionError("handover: " + socket + " sent a malformed record for region " +
                             std::to_string(i) + ": '" + std::string(record.substr(0, 64)) + "'");
    }
  }
  return out;
}

Result<std::vector<int>> ReceiveHandover(const std::string& socket, const std::string& session,
                                         const std::string& token, int timeout_ms, size_t regions) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<Fd> fd,
                      AskForHandover(socket, session, token, timeout_ms, regions));
  std::vector<int> fds;
  fds.reserve(regions);
  while (fds.size() < regions) {
    FdPacket packet;
    msghdr& msg = packet.msg;
    const ssize_t got = ::recvmsg(fd->fd, &msg, MSG_CMSG_CLOEXEC);
    if (got <= 0) {
      const int e = got < 0 ? errno : ECONNRESET;
      CloseAll(&fds);
      return PosixError("handover: receive descriptors from " + socket, e);
    }
    size_t in_packet = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t j = 0; j < k; ++j) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
        fds.push_back(received);
        ++in_packet;
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) || in_packet == 0 || fds.size() > regions) {
      CloseAll(&fds);
      return CorruptionError("handover: " + socket + " sent a packet without the descriptors");
    }
  }
  return fds;
}

Result<std::unique_ptr<LocalAnnouncement>> LocalAnnouncement::Start(const std::string& digest,
                                                                    int rank, int size,
                                                                    std::string url) {
  std::unique_ptr<LocalAnnouncement> a(new LocalAnnouncement());
  a->name_ = AnnouncementName(digest, rank, size);
  a->url_ = std::move(url);
  Status st = Listen(a->name_, SOCK_STREAM, &a->listen_fd_, &a->stop_fd_);
  if (!st.ok()) return st.WithContext("resident seed");
  LocalAnnouncement* self = a.get();
  a->thread_ = std::thread([self] {
    AcceptLoop(self->listen_fd_, self->stop_fd_,
               [self](int conn) { SendText(conn, self->url_).IgnoreError(); });
  });
  return a;
}

LocalAnnouncement::~LocalAnnouncement() {
  StopLoop(&thread_, stop_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

bool HandoverReachable(const std::string& socket, int timeout_ms) {
  sockaddr_un addr;
  Result<socklen_t> len = AbstractAddress(socket, &addr);
  if (!len.ok()) return false;
  Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return false;
  SetTimeouts(fd.fd, timeout_ms);
  return ::connect(fd.fd, reinterpret_cast<sockaddr*>(&addr), *len) == 0;
}

Result<std::string> FindLocalSeed(const std::string& digest, int rank, int size, int timeout_ms) {
  const std::string name = AnnouncementName(digest, rank, size);
  sockaddr_un addr;
  TL_ASSIGN_OR_RETURN(const socklen_t len, AbstractAddress(name, &addr));
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return PosixError("socket", errno);
  SetTimeouts(fd.fd, timeout_ms);
  if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return NotFoundError("no resident seed on this host (" + name + ")");
  char buf[1025];
  size_t got = 0;
  for (ssize_t n; got < 1024 && (n = ::recv(fd.fd, buf + got, 1024 - got, 0)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("receive from " + name, errno);
    }
    got += static_cast<size_t>(n);
  }
  const std::string url(buf, got);
  if (url.compare(0, 7, "http://") != 0)
    return CorruptionError(name + " answered '" + url.substr(0, 64) + "', not a URL");
  return url;
}

bool HandoverOffered(const Manifest& manifest) {
  if (manifest.handover_socket.empty() || manifest.handover_host.empty()) return false;
  return manifest.handover_host == HandoverHostId();
}

namespace {

// Every chunk of every tensor against the manifest, on up to 4 threads.
Status VerifyChunks(const Manifest& manifest, const std::vector<LoadedTensor>& tensors,
                    const std::string& url) {
  const unsigned threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status failed = Status::Ok();
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < tensors.size();) {
      const LoadedTensor& t = tensors[i];
      const ManifestTensor* m = manifest.Find(t.name);
      const std::vector<uint64_t> sums = ChunkChecksums(t.data, t.nbytes, manifest.chunk_bytes);
      for (size_t c = 0; m && c < sums.size(); ++c) {
        if (c < m->chunk_xxh3.size() && sums[c] == m->chunk_xxh3[c]) continue;
        std::lock_guard<std::mutex> lock(mu);
        if (failed.ok()) {
          failed = CorruptionError(url + ": handed-over tensor '" + t.name + "': chunk " +
                                   std::to_string(c) + " does not match the manifest's checksum");
        }
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return failed;
}

// The manifest's tensors into `out`, as views of `memory` (one buffer a
// region; on `device`, or host memory when null): their bytes.
uint64_t AddWholeTensors(const Manifest& manifest,
                         const std::vector<std::shared_ptr<Buffer>>& memory,
                         const std::shared_ptr<Device>& device, CheckpointBuilder* out) {
  out->Reserve(manifest.tensors.size());
  if (device) out->set_device(device);
  uint64_t bytes = 0;
  for (const ManifestTensor& m : manifest.tensors) {
    LoadedTensor t;
    t.name = m.name;
    t.dtype = m.dtype;
    t.shape = m.shape;
    SetRowMajorStrides(&t);
    t.nbytes = m.nbytes;
    const size_t r = m.nbytes ? m.region : 0;
    // ParseManifest checked that offset + nbytes lies within the region (and
    // the caller, the region within the buffer).
    t.data = memory[r]->data() + (m.nbytes ? m.offset : 0);
    if (device) {
      t.device = device->kind();
      t.device_index = device->ordinal();
    }
    bytes += m.nbytes;
    out->Add(std::move(t), memory[r]);
  }
  return bytes;
}

// The tensors of the device regions `memory` (one buffer a region) on
// `device`, every chunk checked against the manifest through pinned staging.
Status VerifyDeviceChunks(const Manifest& manifest, Device& device,
                          const std::vector<std::shared_ptr<Buffer>>& memory,
                          const std::string& url) {
  const uint64_t cb = manifest.chunk_bytes;
  const uint64_t window = std::max<uint64_t>(1, (8ull << 20) / cb) * cb;
  TL_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream, device.CreateStream());
  TL_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> staging, device.AllocatePinned(window));
  for (const ManifestTensor& m : manifest.tensors) {
    if (m.nbytes == 0) continue;
    TL_ASSIGN_OR_RETURN(std::vector<uint64_t> sums,
                        StagedChunkChecksums(memory[m.region]->data() + m.offset, m.nbytes, cb,
                                             *stream, *staging, window));
    for (size_t c = 0; c < sums.size(); ++c) {
      if (c < m.chunk_xxh3.size() && sums[c] == m.chunk_xxh3[c]) continue;
      return CorruptionError(url + ": handed-over tensor '" + m.name + "': chunk " +
                             std::to_string(c) + " does not match the manifest's checksum");
    }
  }
  return Status::Ok();
}

// A handover's checkpoint: its one file report ("handed over on this host: "
// and `what`), timed from t0.
LoadedCheckpoint FinishHandover(CheckpointBuilder out, const Manifest& manifest,
                                const std::string& url, uint64_t bytes, const std::string& what,
                                std::chrono::steady_clock::time_point t0) {
  FileReport f;
  f.path = url;
  f.reason = "handed over on this host: " + what;
  f.bytes = bytes;
  f.tensors = static_cast<uint32_t>(manifest.tensors.size());
  out.files().push_back(std::move(f));
  return std::move(out).Finish(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// TakeHandover of device memory (manifest.handover_device).
Result<LoadedCheckpoint> TakeDeviceHandover(const Manifest& manifest, const std::string& url,
                                            const std::string& session, const TakeOptions& options,
                                            std::chrono::steady_clock::time_point t0) {
  const std::shared_ptr<Device>& device = options.device;
  if (!device) {
    return InvalidArgumentError(url + ": the seed hands over memory of device " +
                                manifest.handover_device + ", and this load goes to host memory");
  }
  if (device->identity() != manifest.handover_device) {
    return InvalidArgumentError(
        url + ": the seed's tensors are on device " + manifest.handover_device + ", and " +
        device->name() + " is " +
        (device->identity().empty() ? "not exportable memory" : device->identity()));
  }
  TL_ASSIGN_OR_RETURN(std::vector<ExportedMemory> exported,
                      ReceiveDeviceHandover(manifest.handover_socket, session, options.token,
                                            options.timeout_ms, manifest.regions.size()));
  std::vector<std::shared_ptr<Buffer>> memory(exported.size());
  for (size_t i = 0; i < exported.size(); ++i) {
    const uint64_t need = manifest.regions[i].bytes;
    if (exported[i].bytes < need) {
      return CorruptionError(url + ": handed-over region " + std::to_string(i) + " holds " +
                             std::to_string(exported[i].bytes) + " bytes, the manifest says " +
                             std::to_string(need));
    }
    exported[i].device_id = manifest.handover_device;
    Result<std::shared_ptr<Buffer>> imported = device->Import(std::move(exported[i]));
    if (!imported.ok()) return imported.status().WithContext(url + ": region " + std::to_string(i));
    memory[i] = std::move(imported).value();
  }
  if (options.copy_on_write) {
    // This process's own memory: one copy on the device, then the seed's
    // allocations are closed.
    TL_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream, device->CreateStream());
    std::vector<std::shared_ptr<Buffer>> own(memory.size());
    for (size_t i = 0; i < memory.size(); ++i) {
      const uint64_t bytes = manifest.regions[i].bytes;
      TL_ASSIGN_OR_RETURN(own[i], device->Allocate(bytes));
      if (bytes) TL_RETURN_IF_ERROR(stream->CopyOnDevice(own[i]->data(), memory[i]->data(), bytes));
    }
    TL_RETURN_IF_ERROR(stream->Synchronize());
    memory = std::move(own);
  }
  if (options.verify) TL_RETURN_IF_ERROR(VerifyDeviceChunks(manifest, *device, memory, url));
  CheckpointBuilder out;
  const uint64_t bytes = AddWholeTensors(manifest, memory, device, &out);
  return FinishHandover(std::move(out), manifest, url, bytes,
                        std::to_string(memory.size()) + " allocations of " + device->name() + " " +
                            (options.copy_on_write ? "copied once on the device into its own memory"
                                                   : "mapped, no byte copied") +
                            (options.verify ? ", every chunk checked" : ""),
                        t0);
}

}  // namespace

Result<std::vector<uint64_t>> StagedChunkChecksums(const std::byte* data, uint64_t nbytes,
                                                   uint64_t chunk_bytes, DeviceStream& stream,
                                                   Buffer& staging, uint64_t window) {
  std::vector<uint64_t> sums;
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t n = std::min<uint64_t>(window, nbytes - done);
    TL_RETURN_IF_ERROR(stream.CopyToHost(staging.data(), data + done, n));
    TL_RETURN_IF_ERROR(stream.Synchronize());
    std::vector<uint64_t> part = ChunkChecksums(staging.data(), n, chunk_bytes);
    sums.insert(sums.end(), part.begin(), part.end());
    done += n;
  }
  return sums;
}

Result<LoadedCheckpoint> TakeHandover(const Manifest& manifest, const std::string& url,
                                      const std::string& session, const TakeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (manifest.regions.empty()) return InvalidArgumentError(url + ": no regions to hand over");
  if (!manifest.handover_device.empty())
    return TakeDeviceHandover(manifest, url, session, options, t0);
  TL_ASSIGN_OR_RETURN(std::vector<int> fds,
                      ReceiveHandover(manifest.handover_socket, session, options.token,
                                      options.timeout_ms, manifest.regions.size()));
  std::vector<std::shared_ptr<HostBuffer>> maps(fds.size());
  Status failed = Status::Ok();
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!failed.ok()) {
      ::close(fds[i]);  // MapShared takes the others.
      continue;
    }
    Result<std::shared_ptr<HostBuffer>> m =
        HostBuffer::MapShared(fds[i], manifest.regions[i].bytes, options.copy_on_write);
    if (m.ok()) {
      maps[i] = std::move(m).value();
    } else {
      failed = m.status().WithContext(url + ": region " + std::to_string(i));
    }
  }
  TL_RETURN_IF_ERROR(failed);
  CheckpointBuilder out;
  const uint64_t bytes = AddWholeTensors(
      manifest, std::vector<std::shared_ptr<Buffer>>(maps.begin(), maps.end()), nullptr, &out);
  if (options.verify) TL_RETURN_IF_ERROR(VerifyChunks(manifest, out.tensors(), url));
  return FinishHandover(std::move(out), manifest, url, bytes,
                        std::to_string(maps.size()) + " regions of sealed shared memory mapped " +
                            (options.copy_on_write ? "copy-on-write" : "read-only") +
                            (options.verify ? ", every chunk checked" : ""),
                        t0);
}

}  // namespace tensorlift::remote
