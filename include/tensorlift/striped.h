// Striped loads: one load's byte ranges shared among every source that holds
// them, fetched at once, the faster sources taking more (public API).
//
//   tensorlift::StripeOptions opts;
//   opts.path = "/models/llama";                  // the local copy
//   opts.object_url = "s3://models/llama/";       // a bucket
//   opts.registry = "http://127.0.0.1:2379";      // running peers (seeds)
//   tensorlift::StripeReport report;
//   auto loaded = tensorlift::LoadStriped(opts, &report);
//
// Sources: the local file (path), object storage (object_url, with `store`),
// and peers serving the same key (peers, plus the live seeds the registry
// lists for it) that hold every tensor whole. The headers come from the local
// copy when there is one, else from the bucket; a bucket's headers must equal
// the local copy's.
//
// A local copy that is in the page cache is loaded from alone (use_page_cache).
// Otherwise the sources join one store and the loader reads through it as it
// reads any checkpoint (host memory, or a device through the GPU pipeline's
// staging slots: host memory bounded by the staging pool, not the checkpoint).
// Each read is cut into pieces (a peer's checksum chunks, grouped up to
// range_bytes); every source has workers that take the next piece from one
// queue, so a faster source takes more (work stealing). A source fetches one
// piece alone until its rate is measured; then a slower source takes only what
// it would deliver no later than the others, and near the end leaves the last
// pieces to faster ones that would finish them all sooner. A piece lands
// straight where the read asked and, when any peer's manifest is at hand, each
// of its chunks is checked against that manifest's XXH3 where it lands,
// whichever source fetched it (a chunk a read asks only part of is fetched
// whole, checked, and the rest kept for the read that asks for it). A source
// that fails, or whose bytes do not match, is dropped and its pieces go to the
// others; the load fails (freeing everything) only when every source has.
// docs/object-storage.md, "Many sources at once".
//
// Thread safety: LoadStriped may run concurrently; callbacks are called from
// the sources' worker threads, one at a time.
#ifndef TENSORLIFT_STRIPED_H_
#define TENSORLIFT_STRIPED_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorlift/loader.h"
#include "tensorlift/objstore.h"
#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift {

struct StripeOptions {
  std::string path;                // A local checkpoint (file, index or directory); "": none.
  std::string object_url;          // s3:// or gs://; "": none.
  ObjectStoreOptions store;        // For object_url (parallel, layout and cache_dir are refused).
  std::vector<std::string> peers;  // Peer control endpoints ("http://host:port").
  std::string registry;            // etcd endpoint: the key's live seeds join the peers.
  std::string token;               // As PeerLoadOptions::token.
  // The peers' key; model empty: PeerKeyForCheckpoint of the checkpoint (a
  // peer serving a copy of the same files has it).
  PeerKey key;
  // Every option applies as to a local load (dtype, filter, on_tensor, sparse
  // decoding, device, progress, ...), except those that choose how local
  // files are read (mode, engine, threads: refused; see disk_threads).
  LoadOptions load;
  uint64_t range_bytes = 8ull << 20;  // The most bytes one piece holds.
  int disk_threads = 4;               // Workers reading the local files.
  // Workers fetching from the bucket (each one ranged GET at a time);
  // 0: store.connections, bounded by store.max_in_flight_bytes / range_bytes.
  int object_threads = 0;
  int peer_ranges_at_once = 4;  // Ranges a peer's worker takes together.
  // When at least 90% of the local copy is in the page cache, load from it
  // alone (views of the page cache, as Load's auto mode: nothing is faster);
  // false: stripe anyway (for measuring the sources, and tests).
  bool use_page_cache = true;
  // Peer time-outs, minimum rate and transports, as in PeerLoadOptions.
  int request_timeout_ms = 5000;
  int connect_timeout_ms = 5000;
  int stall_timeout_ms = 10000;
  uint64_t min_rate = 1000000;
  std::string transports;
  // Called as each batch of pieces lands and checks out: the source's name
  // (as in the report) and the bytes it delivered.
  std::function<void(const std::string& source, uint64_t bytes)> on_range;
};

struct StripeSourceReport {
  std::string name;     // "disk:PATH", the object URL, or the peer's URL.
  uint64_t bytes = 0;   // Tensor bytes it delivered (and that checked out).
  uint64_t ranges = 0;  // Pieces it delivered.
  double seconds = 0;   // From the start of the transfers to its last range.
  std::string failure;  // Empty unless it was dropped: why.
};

struct StripeReport {
  std::vector<StripeSourceReport> sources;  // Those that took part, in order.
  // Sources that could not join (a peer with another key, ...), one line each.
  std::vector<std::string> failures;
  uint64_t bytes = 0;      // Tensor bytes loaded.
  uint64_t ranges = 0;     // Pieces the loader's reads were cut into.
  uint64_t refetched = 0;  // Pieces fetched again after their source failed.
  bool checked = false;    // Every chunk was checked against a peer's manifest.
  std::string note;        // Why the load did not stripe, when it did not.
  double seconds = 0;
};

// Loads the tensors that pass options.load.filter from all the sources at
// once (see above). InvalidArgument when no local path or object URL gives
// the headers; Unavailable (naming every source and why) when all failed.
Result<LoadedCheckpoint> LoadStriped(const StripeOptions& options, StripeReport* report = nullptr);

}  // namespace tensorlift

#endif  // TENSORLIFT_STRIPED_H_
