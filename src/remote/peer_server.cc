// PeerServer: the control endpoint (cpp-httplib) over UCX-registered memory.
//
// Endpoints (docs/remote.md, "Control endpoint"); with a token, every request
// must be signed (remote/auth.h), else 401:
//   GET    /v1/key            {"protocol","key":{...},"digest","parallel":{size,rank},
//                              "tensors","total_bytes","sessions"}; no remote keys.
//   POST   /v1/session        opens a session (503 past max_sessions); the body is
//                              the manifest with remote keys and this session's rate
//                              share, the session id in X-Tensorlift-Session.
//   DELETE /v1/session/ID     closes it; the body is the bytes the client pulled.
//   GET    /v1/health         "ok".
// Pulls are one-sided UCX gets: no handler runs per tensor.
#include "remote/peer_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "format/tp_layout.h"
#include "remote/auth.h"
#include "remote/availability.h"
#include "remote/handover.h"
#include "remote/manifest.h"
#include "remote/peer_faults.h"
#include "remote/registry.h"
#include "tensorlift/checksum.h"
#include "tensorlift/text.h"

namespace tensorlift {

uint64_t AutoChunkBytes(uint64_t total_bytes) {
  uint64_t chunk = 4ull << 20;
  while (chunk > (64u << 10) && total_bytes / chunk < 128) chunk /= 2;
  return chunk;
}

}  // namespace tensorlift

namespace tensorlift::remote {

UcxMemory MemoryOf(const Device* device) {
  return device && device->kind() == DeviceType::kCuda ? UcxMemory::kCuda : UcxMemory::kHost;
}

namespace {

class PeerServerImpl final : public PeerServer {
 public:
  PeerServerImpl(PeerKey key, ServeOptions options)
      : key_(std::move(key)), options_(std::move(options)) {}

  ~PeerServerImpl() override {
    registration_.reset();
    announcement_.reset();
    handover_.reset();
    if (http_) http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
    ucx_.reset();  // Unmaps the regions before the memory goes.
  }

  // `known`: the tensors' content identity when their load computed it (may be
  // null); its hashes are used instead of hashing host tensors again.
  Status Start(std::vector<Served> tensors, std::vector<Span> regions,
               std::shared_ptr<const void> keep_alive, const ContentIdentity* known = nullptr,
               const RelayOf* relay = nullptr) {
    keep_alive_ = std::move(keep_alive);
    if (relay) {
      // Its chunks are the reference's; its memory is still being written
      // (nothing to hand over).
      options_.chunk_bytes = relay->reference->chunk_bytes;
      options_.handover = false;
      have_ = relay->have;
    }
    TL_RETURN_IF_ERROR(key_.Validate());
    TL_RETURN_IF_ERROR(CheckRank(options_.parallel, "serve"));
    if (options_.chunk_bytes != 0 &&
        (options_.chunk_bytes < 4096 || options_.chunk_bytes > (1ull << 30))) {
      return InvalidArgumentError("serve: chunk_bytes " + std::to_string(options_.chunk_bytes) +
                                  " is outside [4096, 1 GiB]");
    }
    if (options_.max_sessions < 1)
      return InvalidArgumentError("serve: max_sessions must be at least 1");
    std::sort(tensors.begin(), tensors.end(),
              [](const Served& a, const Served& b) { return a.name < b.name; });
    for (size_t i = 1; i < tensors.size(); ++i) {
      if (tensors[i].name == tensors[i - 1].name) {
        return InvalidArgumentError("serve: tensor '" + tensors[i].name + "' is given twice");
      }
    }
    tensors_ = std::move(tensors);
    if (options_.chunk_bytes == 0) {
      uint64_t total = 0;
      for (const Served& t : tensors_) total += t.nbytes;
      options_.chunk_bytes = AutoChunkBytes(total);
    }

    // Regions: the given ones (one per buffer), else the tensors' ranges with
    // touching or overlapping ones (in the same memory) merged.
    if (regions.empty()) {
      for (const Served& t : tensors_) {
        if (t.nbytes) regions.push_back({t.data, t.nbytes, t.device, t.data});
      }
    }
    std::sort(regions.begin(), regions.end(), [](const Span& a, const Span& b) {
      return std::make_pair(a.device.get(), a.data) < std::make_pair(b.device.get(), b.data);
    });
    std::vector<Span> merged;
    for (const Span& r : regions) {
      // Shared memory is handed over whole, one descriptor a region: never
      // merged with other memory.
      if (!merged.empty() && r.device == merged.back().device &&
          r.data <= merged.back().data + merged.back().bytes &&
          r.map_at - r.data == merged.back().map_at - merged.back().data && r.shared_fd == -1 &&
          merged.back().shared_fd == -1 && !r.buffer && !merged.back().buffer) {
        Span& m = merged.back();
        m.bytes = std::max<uint64_t>(m.bytes, static_cast<uint64_t>(r.data - m.data) + r.bytes);
      } else {
        merged.push_back(r);
      }
    }
    if (merged.empty()) {
      merged.push_back({empty_region_, sizeof empty_region_, nullptr, empty_region_});
    }

    ExportDeviceMemory(merged);
    UcxOptions uo;
    uo.transports = options_.transports;
    uo.clients_per_worker = options_.clients_per_worker;
    TL_ASSIGN_OR_RETURN(ucx_, UcxServer::Create(uo));
    manifest_.key = key_;
    manifest_.parallel = options_.parallel;
    manifest_.chunk_bytes = options_.chunk_bytes;
    manifest_.worker_address = ucx_->WorkerAddress();
    for (const Span& span : merged) {
      Result<uint32_t> registered =
          ucx_->Register(span.map_at, span.bytes, MemoryOf(span.device.get()));
      if (!registered.ok() && !exported_.empty() && !HandoverHostId().empty()) {
        // Handed over on this device (a UCX without CUDA cannot map a GPU's
        // memory): clients elsewhere cannot pull it (no remote key).
        Region region;
        region.address = reinterpret_cast<uintptr_t>(span.data);
        region.bytes = span.bytes;
        manifest_.regions.push_back(std::move(region));
        continue;
      }
      if (!registered.ok()) {
        return registered.status().WithContext(
            "serve: memory on " + (span.device ? span.device->name() : std::string("the host")));
      }
      const uint32_t index = *registered;
      Region region;
      region.address = ucx_->RegionAddress(index);
      region.bytes = span.bytes;
      TL_ASSIGN_OR_RETURN(region.rkey, ucx_->PackedRkey(index));
      manifest_.regions.push_back(std::move(region));
    }

    // The manifest, with each chunk's checksum (computed once, here).
    manifest_.tensors.resize(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Served& t = tensors_[i];
      ManifestTensor& m = manifest_.tensors[i];
      m.name = t.name;
      m.dtype = t.dtype;
      m.shape = t.shape;
      m.nbytes = t.nbytes;
      m.shard_dim = t.shard.dim;
      m.shard_start = t.shard.start;
      m.full_shape = t.shard.full_shape.empty() ? t.shape : t.shard.full_shape;
      if (t.nbytes == 0) continue;
      size_t r = 0;
      while (r < merged.size() && !(merged[r].device == t.device && t.data >= merged[r].data &&
                                    t.data + t.nbytes <= merged[r].data + merged[r].bytes)) {
        ++r;
      }
      if (r == merged.size())
        return InternalError("serve: tensor '" + t.name + "' is in no registered region");
      m.region = static_cast<uint32_t>(r);
      m.offset = static_cast<uint64_t>(t.data - merged[r].data);
      manifest_.total_bytes += t.nbytes;
    }
    if (relay) {
      TL_RETURN_IF_ERROR(TakeReferenceChecksums(*relay->reference));
    } else {
      TL_RETURN_IF_ERROR(ComputeChecksums(known));
      have_ = std::make_shared<Availability>(manifest_);
      have_->MarkAll();
    }
    // Refuse to serve what a client would refuse (bounds, names).
    auto check = ParseManifest(manifest_.ToJson());
    if (!check.ok()) return check.status().WithContext("serve: the manifest would be invalid");

    TL_RETURN_IF_ERROR(StartHandover(merged));
    TL_RETURN_IF_ERROR(StartHttp());
    TL_RETURN_IF_ERROR(ApplyFaultsFromEnvironment());
    if (options_.resident) {
      TL_ASSIGN_OR_RETURN(announcement_,
                          LocalAnnouncement::Start(key_.Digest(), options_.parallel.rank,
                                                   options_.parallel.size, url()));
    }
    if (!options_.registry.empty()) {
      TL_ASSIGN_OR_RETURN(registry_,
                          Registry::Connect(options_.registry, std::chrono::milliseconds(5000)));
      SeedInfo seed;
      seed.key_digest = key_.Digest();
      seed.url = url();
      seed.rank = options_.parallel.rank;
      seed.world = options_.parallel.size;
      seed.load = 0;
      if (manifest_.content) seed.content = manifest_.content->Hex();
      if (relay) {
        seed.partial = true;
        seed.progress = Progress();
      }
      TL_ASSIGN_OR_RETURN(registration_, registry_->Register(seed, options_.registry_ttl_s));
    }
    return Status::Ok();
  }

  std::string url() const override {
    return "http://" + options_.host + ":" + std::to_string(port_);
  }
  int port() const override { return port_; }
  const PeerKey& key() const override { return key_; }
  uint64_t served_bytes() const override { return served_bytes_.load(); }
  int active_sessions() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(sessions_.size());
  }
  int live_workers() const override { return ucx_ ? ucx_->LiveWorkers() : 0; }
  std::string content() const override {
    return manifest_.content ? manifest_.content->Hex() : std::string();
  }

  // (peer_faults.h) Flips one bit of the served copy of `tensor`.
  Status Corrupt(const std::string& tensor, uint64_t offset, bool lie) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      Served& t = tensors_[i];
      if (t.name != tensor) continue;
      if (offset >= t.nbytes)
        return OutOfRangeError("tensor '" + tensor + "': offset past its bytes");
      if (handover_ && !t.device) {
        // Sealed memory cannot be written: the manifest's checksum of the
        // chunk changes instead, which clients see as the same mismatch.
        manifest_.tensors[i].chunk_xxh3[offset / options_.chunk_bytes] ^= 1;
        return Status::Ok();
      }
      if (!t.device) {
        t.data[offset] ^= std::byte{1};
        if (lie) {
          const uint64_t c = offset / options_.chunk_bytes, at = c * options_.chunk_bytes;
          manifest_.tensors[i].chunk_xxh3[c] =
              Xxh3_64(t.data + at, std::min(options_.chunk_bytes, t.nbytes - at));
        }
        return Status::Ok();
      }
      TL_ASSIGN_OR_RETURN(auto stream, t.device->CreateStream());
      std::byte b{};
      TL_RETURN_IF_ERROR(stream->CopyToHost(&b, t.data + offset, 1));
      TL_RETURN_IF_ERROR(stream->Synchronize());
      b ^= std::byte{1};
      TL_RETURN_IF_ERROR(stream->CopyToDevice(t.data + offset, &b, 1));
      return stream->Synchronize();
    }
    return NotFoundError("tensor '" + tensor + "' is not served");
  }

 private:
  // TENSORLIFT_PEER_FAULTS (peer_faults.h), applied once the manifest is made.
  Status ApplyFaultsFromEnvironment() {
    const char* spec = std::getenv("TENSORLIFT_PEER_FAULTS");
    if (spec == nullptr || *spec == '\0') return Status::Ok();
    const std::string all(spec);
    size_t at = 0;
    while (at <= all.size()) {
      const size_t comma = std::min(all.find(',', at), all.size());
      const std::string rule = all.substr(at, comma - at);
      const size_t colon = rule.find(':'), sign = rule.rfind('@');
      const std::string kind = rule.substr(0, colon);
      uint64_t offset = 0;
      bool number = sign != std::string::npos && sign + 1 < rule.size();
      for (size_t i = sign + 1; number && i < rule.size(); ++i) {
        number = rule[i] >= '0' && rule[i] <= '9';
        if (number) offset = offset * 10 + static_cast<uint64_t>(rule[i] - '0');
      }
      if (colon == std::string::npos || (kind != "corrupt" && kind != "lie") || !number ||
          sign <= colon + 1) {
        return InvalidArgumentError("TENSORLIFT_PEER_FAULTS: '" + rule +
                                    "' is not corrupt:TENSOR@OFFSET or lie:TENSOR@OFFSET");
      }
      Status st = Corrupt(rule.substr(colon + 1, sign - colon - 1), offset, kind == "lie");
      // A rule for a tensor this server does not serve applies to another one.
      if (!st.ok() && st.code() != StatusCode::kNotFound)
        return st.WithContext("TENSORLIFT_PEER_FAULTS");
      at = comma + 1;
    }
    return Status::Ok();
  }

  // A relay's checksums and content root: the reference's, tensor by tensor
  // (the same names, dtypes, shapes and bytes, or InvalidArgument).
  Status TakeReferenceChecksums(const Manifest& reference) {
    if (reference.tensors.size() != manifest_.tensors.size()) {
      return InvalidArgumentError("relay: " + std::to_string(manifest_.tensors.size()) +
                                  " tensors, the reference has " +
                                  std::to_string(reference.tensors.size()));
    }
    for (ManifestTensor& m : manifest_.tensors) {
      const ManifestTensor* r = reference.Find(m.name);
      if (!r || r->dtype != m.dtype || r->shape != m.shape || r->nbytes != m.nbytes ||
          r->shard_dim != -1) {
        return InvalidArgumentError("relay: tensor '" + m.name +
                                    "' is not the reference's whole tensor");
      }
      m.chunk_xxh3 = r->chunk_xxh3;
      m.xxh128 = r->xxh128;
    }
    manifest_.content = reference.content;
    return Status::Ok();
  }

  double Progress() const {
    return manifest_.total_bytes
               ? std::min(1.0, double(have_->held_bytes()) / double(manifest_.total_bytes))
               : 1.0;
  }

 public:
  // A relay's registry entry: its progress, or whole once every chunk is held.
  Status UpdateRelay(bool behind) {
    if (!registration_) return Status::Ok();
    const bool whole = have_->held() == have_->chunks();
    return registration_->UpdateProgress(!whole, Progress(), behind);
  }

 private:
  // Each tensor's chunk checksums into the manifest, on up to 4 threads:
  // host memory directly, device memory through pinned staging (each thread
  // its own stream and about 8 MiB of staging, a whole number of chunks); and
  // the content hashes of host tensors: from `known` (the load's, may be null)
  // when it has the tensor, else hashed here, a second pass over its bytes.
  Status ComputeChecksums(const ContentIdentity* known) {
    const unsigned threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    const uint64_t cb = options_.chunk_bytes;
    const uint64_t window = std::max<uint64_t>(1, (8ull << 20) / cb) * cb;
    std::atomic<size_t> next{0};
    std::mutex failed_mu;
    Status failed = Status::Ok();
    auto work = [&] {
      std::unique_ptr<DeviceStream> stream;
      std::shared_ptr<Buffer> staging;  // `window` bytes, pinned, for `staged_for`.
      const Device* staged_for = nullptr;
      for (size_t i; (i = next.fetch_add(1)) < tensors_.size();) {
        const Served& t = tensors_[i];
        if (!t.device || t.nbytes == 0) {
          manifest_.tensors[i].chunk_xxh3 = ChunkChecksums(t.data, t.nbytes, cb);
          const TensorContent* k = known ? known->Find(t.name) : nullptr;
          manifest_.tensors[i].xxh128 =
              k && k->dtype == t.dtype && k->shape == t.shape && k->nbytes == t.nbytes
                  ? k->hash
                  // The content hash on the same bytes, still in cache for small tensors.
                  : TensorContentHash(t.data, t.nbytes);
          continue;
        }
        Result<std::vector<uint64_t>> sums = [&]() -> Result<std::vector<uint64_t>> {
          if (staged_for != t.device.get()) {
            TL_ASSIGN_OR_RETURN(stream, t.device->CreateStream());
            TL_ASSIGN_OR_RETURN(staging, t.device->AllocatePinned(window));
            staged_for = t.device.get();
          }
          return StagedChunkChecksums(t.data, t.nbytes, cb, *stream, *staging, window);
        }();
        if (sums.ok()) {
          manifest_.tensors[i].chunk_xxh3 = std::move(sums).value();
        } else {
          std::lock_guard<std::mutex> lock(failed_mu);
          if (failed.ok()) {
            failed = sums.status().WithContext("serve: checksums of tensor '" + t.name + "'");
          }
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    // The content identity (docs/remote.md, "Content identity") when every
    // tensor was hashed (none is in device memory).
    std::vector<TensorContent> contents;
    for (const ManifestTensor& m : manifest_.tensors) {
      if (!m.xxh128) {
        for (ManifestTensor& c : manifest_.tensors) c.xxh128.reset();
        return failed;
      }
      contents.push_back({m.name, m.dtype, m.shape, m.nbytes, *m.xxh128});
    }
    manifest_.content = ContentRoot(contents);
    return failed;
  }

  // Same-host handover (remote/handover.h), when asked for and every region
  // is sealed shared memory, or every region is a whole allocation of one
  // device that exports it (Device::Export): the manifest then says where to
  // ask.
  Status StartHandover(const std::vector<Span>& regions) {
    if (!options_.handover) return Status::Ok();
    std::vector<int> fds;
    const std::shared_ptr<Device> device = regions.empty() ? nullptr : regions[0].device;
    for (const Span& r : regions) {
      if (device ? (r.device != device || !r.buffer) : (r.shared_fd < 0 || r.device))
        return Status::Ok();
      fds.push_back(r.shared_fd);
    }
    const std::string host = HandoverHostId();
    if (host.empty()) return Status::Ok();
    if (device && exported_.size() != regions.size()) return Status::Ok();
    TL_ASSIGN_OR_RETURN(handover_, HandoverServer::Start(
                                       std::move(fds), options_.token,
                                       [this](const std::string& id) {
                                         std::lock_guard<std::mutex> lock(mu_);
                                         return sessions_.count(id) > 0;
                                       },
                                       device ? &exported_ : nullptr));
    if (device) manifest_.handover_device = device->identity();
    manifest_.handover_host = host;
    manifest_.handover_socket = handover_->socket();
    return Status::Ok();
  }

  // Device regions exported for handover, before UCX maps them (the emulated
  // device's memory moves into a memfd at the same address); none unless all
  // are whole allocations of one device that exports them (clients pull).
  void ExportDeviceMemory(const std::vector<Span>& regions) {
    for (const Span& r : regions) {
      if (!options_.handover || !r.device || r.device != regions[0].device || !r.buffer) break;
      Result<ExportedMemory> e = r.device->Export(*r.buffer);
      if (!e.ok()) break;
      exported_.push_back(std::move(e).value());
    }
    if (exported_.size() != regions.size()) exported_.clear();
  }

  Status StartHttp() {
    http_ = std::make_unique<httplib::Server>();
    if (!options_.token.empty()) verifier_ = std::make_unique<RequestVerifier>(options_.token);
    http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!verifier_) return httplib::Server::HandlerResponse::Unhandled;
      auto it = req.headers.find(kAuthHeader);
      Status st = verifier_->Verify(
          it == req.headers.end() ? std::string_view() : std::string_view(it->second), req.method,
          req.path, UnixSeconds());
      if (st.ok()) return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;
      res.set_content(st.message(), "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
    http_->Get("/v1/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    http_->Get("/v1/key", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(KeyJson(), "application/json");
    });
    http_->Get("/v1/have", [this](const httplib::Request& req, httplib::Response& res) {
      // ?after=V&wait_ms=W: answers once the map's version is past V, or
      // after W ms (at most 5 s).
      uint64_t after = 0, wait_ms = 0;
      auto number = [&](const char* name, uint64_t* out) {
        if (!req.has_param(name)) return;
        const std::string v = req.get_param_value(name);
        std::from_chars(v.data(), v.data() + v.size(), *out);
      };
      number("after", &after);
      number("wait_ms", &wait_ms);
      res.set_content(
          have_->Wait(after, std::chrono::milliseconds(std::min<uint64_t>(wait_ms, 5000))),
          "application/json");
    });
    http_->Post("/v1/session",
                [this](const httplib::Request&, httplib::Response& res) { OpenSession(res); });
    http_->Delete(R"(/v1/session/([0-9a-f]{1,64}))",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    CloseSession(req.matches[1], req.body, res);
                  });
    port_ = options_.port == 0
                ? http_->bind_to_any_port(options_.host)
                : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
    if (port_ <= 0) {
      return IOError("serve: cannot listen on " + options_.host + ":" +
                     std::to_string(options_.port));
    }
    http_thread_ = std::thread([this] { http_->listen_after_bind(); });
    // Until the loop runs, stop() would be lost (and the destructor's join
    // would wait forever).
    for (int i = 0; i < 5000 && !http_->is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!http_->is_running()) return InternalError("serve: the control endpoint did not start");
    return Status::Ok();
  }

  std::string KeyJson() const {
    std::string j = "{\"protocol\":" + std::to_string(kPeerProtocolVersion) + ",\"key\":{";
    j += "\"model\":" + JsonString(key_.model) + ",\"revision\":" + JsonString(key_.revision) +
         ",\"dtype\":" + JsonString(PeerKeyDtypeName(key_.dtype)) +
         ",\"quantization\":" + JsonString(key_.quantization) +
         ",\"layout\":" + JsonString(key_.layout) +
         ",\"protocol\":" + std::to_string(key_.protocol) + "}";
    j += ",\"digest\":\"" + key_.Digest() +
         "\",\"parallel\":{\"size\":" + std::to_string(options_.parallel.size) +
         ",\"rank\":" + std::to_string(options_.parallel.rank) + "}";
    j += ",\"tensors\":" + std::to_string(manifest_.tensors.size()) +
         ",\"total_bytes\":" + std::to_string(manifest_.total_bytes) +
         ",\"sessions\":" + std::to_string(active_sessions());
    if (manifest_.content) j += ",\"content\":\"" + manifest_.content->Hex() + '"';
    j += "}";
    return j;
  }

  void OpenSession(httplib::Response& res) {
    std::string id;
    uint64_t share = 0;
    UcxServer::WorkerLease lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ExpireSessionsLocked();
      if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
        res.status = 503;
        res.set_content("serve: " + std::to_string(sessions_.size()) +
                            " sessions open (max_sessions " +
                            std::to_string(options_.max_sessions) + ")",
                        "text/plain");
        return;
      }
      id = RandomNonce().substr(0, 16);
      lease = ucx_->Lease();
      sessions_[id] = Session{std::chrono::steady_clock::now(), lease.worker};
      if (options_.rate_limit)
        share = std::max<uint64_t>(1, options_.rate_limit / sessions_.size());
    }
    UpdateLoad();
    Manifest m = manifest_;  // Copy: the rate share and the worker differ per session.
    m.rate_limit = share;
    m.worker_address = std::move(lease.address);
    res.set_header("X-Tensorlift-Session", id);
    res.set_content(m.ToJson(), "application/json");
  }

  void CloseSession(const std::string& id, const std::string& body, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) {
        res.status = 404;
        res.set_content("no session " + id, "text/plain");
        return;
      }
      ucx_->Unlease(it->second.worker);
      sessions_.erase(it);
    }
    // The bytes the client says it read: a decimal count, at most the whole
    // checkpoint. Anything else (not a number, or above 2^64 - 1) is ignored:
    // the session is closed either way, and the load below stays right.
    uint64_t reported = 0;
    const char* const end = body.data() + body.size();
    const auto [stop, error] = std::from_chars(body.data(), end, reported);
    if (!body.empty() && error == std::errc() && stop == end) {
      served_bytes_ += std::min<uint64_t>(reported, manifest_.total_bytes);
    }
    UpdateLoad();
    res.set_content("closed", "text/plain");
  }

  // Sessions a client never closed (it died) go after an hour.
  void ExpireSessionsLocked() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (now - it->second.opened > std::chrono::hours(1)) {
        ucx_->Unlease(it->second.worker);
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void UpdateLoad() {
    if (!registration_) return;
    registration_->UpdateLoad(active_sessions()).IgnoreError();  // health() keeps the last error.
  }

  PeerKey key_;
  ServeOptions options_;
  std::shared_ptr<const void> keep_alive_;
  std::vector<Served> tensors_;
  std::byte empty_region_[64] = {};
  std::unique_ptr<UcxServer> ucx_;
  Manifest manifest_;
  std::unique_ptr<RequestVerifier> verifier_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;
  mutable std::mutex mu_;
  struct Session {
    std::chrono::steady_clock::time_point opened;
    uint64_t worker;  // Its UCX worker lease.
  };
  std::map<std::string, Session> sessions_;
  std::atomic<uint64_t> served_bytes_{0};
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<Registration> registration_;
  std::vector<ExportedMemory> exported_;  // Device memory handed over (descriptors it owns).
  std::unique_ptr<HandoverServer> handover_;
  std::unique_ptr<LocalAnnouncement> announcement_;
  std::shared_ptr<Availability> have_;  // GET /v1/have; every chunk unless a relay.
};

}  // namespace

Result<std::unique_ptr<PeerServer>> StartPeerServer(const PeerKey& key, const ServeOptions& options,
                                                    std::vector<Served> tensors,
                                                    std::vector<Span> regions,
                                                    std::shared_ptr<const void> keep_alive,
                                                    const ContentIdentity* known,
                                                    const RelayOf* relay) {
  auto server = std::make_unique<PeerServerImpl>(key, options);
  TL_RETURN_IF_ERROR(
      server->Start(std::move(tensors), std::move(regions), std::move(keep_alive), known, relay));
  return std::unique_ptr<PeerServer>(std::move(server));
}

Status UpdateRelayEntry(PeerServer& server, bool behind) {
  auto* impl = dynamic_cast<PeerServerImpl*>(&server);
  if (impl == nullptr) return InvalidArgumentError("not a tensorlift peer server");
  return impl->UpdateRelay(behind);
}

Status CorruptServedForTesting(PeerServer& server, const std::string& tensor, uint64_t offset,
                               bool lie) {
  auto* impl = dynamic_cast<PeerServerImpl*>(&server);
  if (impl == nullptr) return InvalidArgumentError("not a tensorlift peer server");
  return impl->Corrupt(tensor, offset, lie);
}

}  // namespace tensorlift::remote
