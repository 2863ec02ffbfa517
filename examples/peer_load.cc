// Loading from a running peer with the public API (include/tensorlift/remote.h):
//
//   tl_example_peer_load CHECKPOINT
//
// Starts a seed that serves CHECKPOINT on loopback (in practice a running
// inference server), then pulls every tensor from it as a new instance would,
// with the checkpoint on disk as the fallback, and checks the pulled bytes
// against a plain disk load. Needs tensorlift built with UCX (tensorlift
// doctor says).
#include <cstdio>
#include <cstring>
#include <string>

#include "tensorlift/loader.h"
#include "tensorlift/remote.h"

using namespace tensorlift;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  };
  // The key names what is served: model, revision (here a digest of the
  // headers), dtype, layout. A client only takes weights whose key matches.
  auto key = PeerKeyForCheckpoint(path);
  if (!key.ok()) return fail(key.status());
  auto seed = PeerServer::ServeCheckpoint(path, *key, ServeOptions{});
  if (!seed.ok()) return fail(seed.status());
  std::printf("serving %s at %s\n", key->model.c_str(), (*seed)->url().c_str());

  PeerLoadOptions options;
  options.peers = {(*seed)->url()};
  options.fallback_path = path;  // Used only if no peer works.
  PeerLoadReport report;
  auto pulled = LoadFromPeer(*key, options, &report);
  if (!pulled.ok()) return fail(pulled.status());
  std::printf("pulled %zu tensors, %llu bytes from %s in %.3f s\n", pulled->tensors().size(),
              static_cast<unsigned long long>(report.bytes), report.source.c_str(), report.seconds);

  auto disk = Load(path);
  if (!disk.ok()) return fail(disk.status());
  for (const LoadedTensor& t : disk->tensors()) {
    const LoadedTensor* p = pulled->Find(t.name);
    if (p == nullptr || p->nbytes != t.nbytes || std::memcmp(p->data, t.data, t.nbytes) != 0) {
      std::fprintf(stderr, "%s differs from the disk load\n", t.name.c_str());
      return 1;
    }
  }
  std::printf("every tensor matches the disk load\n");
  return 0;
}
