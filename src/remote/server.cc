// PeerServer's entry points: a checkpoint, loaded tensors or a caller's
// buffers turned into what the running server (peer_server.h) serves; and
// the peer URL parser. The server itself, its endpoints and sessions:
// peer_server.cc.
#include "remote/server.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/checked_math.h"
#include "device/device.h"
#include "format/tp_layout.h"
#include "load/shared_memory.h"
#include "remote/peer_server.h"

namespace tensorlift {
namespace remote {

Status ParseHttpUrl(const std::string& url, std::string* host, int* port) {
  constexpr std::string_view kScheme = "http://";
  if (url.size() > 1024 || url.compare(0, kScheme.size(), kScheme) != 0) {
    return InvalidArgumentError("peer URL '" + url + "' is not http://HOST:PORT");
  }
  std::string rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || rest.find('/') != std::string::npos) {
    return InvalidArgumentError("peer URL '" + url + "' is not http://HOST:PORT");
  }
  const std::string p = rest.substr(colon + 1);
  if (p.empty() || p.size() > 5 ||
      !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError("peer URL '" + url + "': bad port '" + p + "'");
  }
  const int n = std::stoi(p);
  if (n < 1 || n > 65535)
    return InvalidArgumentError("peer URL '" + url + "': port " + p + " out of range");
  *host = rest.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  *port = n;
  return Status::Ok();
}

Result<std::unique_ptr<PeerServer>> ServeShards(std::shared_ptr<const LoadedCheckpoint> loaded,
                                                std::vector<ShardOf> shards, const PeerKey& key,
                                                const ServeOptions& options) {
  if (!loaded) return InvalidArgumentError("serve: no checkpoint");
  const auto& tensors = loaded->tensors();
  if (shards.size() != tensors.size())
    return InternalError("serve: shards do not match the tensors");
  // Device tensors are served from the device's memory: a GPU's through
  // UCX's CUDA support (remote/ucx_transport.h), their checksums computed on
  // staged copies.
  std::vector<Served> served;
  const auto& owners = CheckpointBuilder::Owners(*loaded);
  std::vector<Span> regions;
  std::vector<const Buffer*> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const LoadedTensor& t = tensors[i];
    std::shared_ptr<Device> device;
    if (t.device != DeviceType::kCpu) {
      Result<std::shared_ptr<Device>> d = OpenDevice(t.device, t.device_index);
      if (!d.ok()) return d.status().WithContext("serve: tensor '" + t.name + "'");
      device = std::move(d).value();
    }
    served.push_back(
        {t.name, t.dtype, t.shape, static_cast<std::byte*>(t.data), t.nbytes, shards[i], device});
    const auto& owner = owners[i];
    if (!owner || std::find(seen.begin(), seen.end(), owner.get()) != seen.end()) continue;
    seen.push_back(owner.get());
    if (owner->size() == 0) continue;
    std::byte* map_at = owner->data();
    if (device && MemoryOf(device.get()) == UcxMemory::kHost) {
      map_at = owner->host_mapping();
      if (!map_at) {
        return UnimplementedError("serve: tensor '" + t.name + "': the memory of " +
                                  device->name() + " cannot be served");
      }
    }
    const auto* host = dynamic_cast<const HostBuffer*>(owner.get());
    regions.push_back({owner->data(), owner->size(), device, map_at, host ? host->shared_fd() : -1,
                       device ? owner.get() : nullptr});
  }
  // The load's content identity, when it computed one, covers exactly these
  // tensors (a checkpoint drops it when a tensor is added or removed).
  return StartPeerServer(key, options, std::move(served), std::move(regions), loaded,
                         loaded->content());
}

}  // namespace remote

Result<std::unique_ptr<PeerServer>> PeerServer::ServeCheckpoint(const std::string& path,
                                                                const PeerKey& key,
                                                                const ServeOptions& options,
                                                                const LoadOptions& load) {
  TL_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Parse(key.layout));
  if (load.on_tensor)
    return InvalidArgumentError("serve: LoadOptions::on_tensor applies to Load, not to serving");
  // A seed serves for as long as it runs: memory of its own, never views of the page
  // cache, which a later truncation of the file would turn into SIGBUS mid-transfer.
  LoadOptions owned = load;
  owned.copy = true;
  // Same-host clients are handed the memory itself: sealed shared memory
  // (docs/remote.md, "Same-host handover"), when the load can make it.
  owned.shared_memory = options.handover && CheckSharedMemoryOptions(owned).ok();
  // This rank's slices only, read straight into their memory (on the device,
  // or shared): the loader plans them (LoadOptions::parallel).
  owned.parallel = options.parallel;
  owned.layout = key.layout;
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path));
  TL_ASSIGN_OR_RETURN(std::vector<remote::ShardOf> shards,
                      remote::ShardsOf(ckpt, load.filter, layout, options.parallel));
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint mine, Load(ckpt, owned));
  auto server = remote::ServeShards(std::make_shared<const LoadedCheckpoint>(std::move(mine)),
                                    std::move(shards), key, options);
  if (!server.ok()) return server.status().WithContext(path);
  return server;
}

Result<std::unique_ptr<PeerServer>> PeerServer::Serve(
    std::shared_ptr<const LoadedCheckpoint> loaded, const PeerKey& key,
    const ServeOptions& options) {
  if (!loaded) return InvalidArgumentError("serve: no checkpoint");
  TL_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Parse(key.layout));
  std::vector<remote::ShardOf> shards;
  for (const LoadedTensor& t : loaded->tensors()) {
    // Whole tensors: the layout's dim, covering all of it.
    remote::ShardOf s;
    s.full_shape = t.shape;
    s.dim = layout.DimFor(t.name);
    if (s.dim >= static_cast<int>(t.shape.size())) s.dim = -1;
    if (s.dim >= 0 && options.parallel.size > 1) {
      return InvalidArgumentError(
          "serve: tensor '" + t.name +
          "' is split by the layout, and Serve(loaded) takes "
          "whole tensors; with parallel.size > 1 use ServeCheckpoint or ServeBuffers");
    }
    shards.push_back(std::move(s));
  }
  return remote::ServeShards(std::move(loaded), std::move(shards), key, options);
}

namespace remote {

Result<uint64_t> BufferBytes(const PeerServer::Tensor& t, std::string_view what) {
  const std::string where = std::string(what) + ": tensor '" + t.name + "'";
  uint64_t elements = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || !CheckedMul(elements, static_cast<uint64_t>(d), &elements)) {
      return InvalidArgumentError(where + " has a bad shape");
    }
  }
  uint64_t bits = 0;
  if (!CheckedMul(elements, static_cast<uint64_t>(DtypeBits(t.dtype)), &bits) || bits % 8) {
    return InvalidArgumentError(where + " is not a whole number of bytes");
  }
  if (bits && !t.data) return InvalidArgumentError(where + " has no data");
  return bits / 8;
}

}  // namespace remote

Result<std::unique_ptr<PeerServer>> PeerServer::ServeBuffers(
    std::vector<Tensor> tensors, const PeerKey& key, const ServeOptions& options,
    std::shared_ptr<const void> keep_alive) {
  std::vector<remote::Served> list;
  std::vector<remote::Span> regions;
  std::map<std::string, std::shared_ptr<Device>> devices;  // By name ("cuda:0").
  for (Tensor& t : tensors) {
    TL_ASSIGN_OR_RETURN(const uint64_t nbytes, remote::BufferBytes(t, "serve"));
    std::shared_ptr<Device> device;
    if (!t.device.on_host()) {
      auto& open = devices[t.device.Name()];
      if (!open) {
        Result<std::shared_ptr<Device>> d = OpenDevice(t.device.type, t.device.index);
        if (!d.ok()) return d.status().WithContext("serve: tensor '" + t.name + "'");
        open = std::move(d).value();
      }
      device = open;
    }
    remote::ShardOf s;
    s.dim = t.shard_dim;
    s.start = t.shard_start;
    s.full_shape = t.full_shape.empty() ? t.shape : t.full_shape;
    auto* data = static_cast<std::byte*>(const_cast<void*>(t.data));
    list.push_back({t.name, t.dtype, t.shape, data, nbytes, s, device});
    if (nbytes == 0) continue;
    // UCX maps a GPU's memory at its device address, the emulated device's
    // at the host's own mapping of it.
    std::byte* map_at = data;
    if (device && remote::MemoryOf(device.get()) == remote::UcxMemory::kHost) {
      Result<std::byte*> mapped = device->HostMapping(data, nbytes);
      if (!mapped.ok()) return mapped.status().WithContext("serve: tensor '" + t.name + "'");
      map_at = *mapped;
    }
    regions.push_back({data, nbytes, device, map_at});
  }
  return remote::StartPeerServer(key, options, std::move(list), std::move(regions),
                                 std::move(keep_alive));
}

}  // namespace tensorlift
