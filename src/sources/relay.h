// A pull that relays (docs/remote.md, "Relaying"; PeerLoadOptions::relay):
// the destination's memory is served while it fills, and the pull takes its
// chunks from the holders that registered just before it, a striped load
// over the root seed and relays. Private to sources/ (peer_entry.cc, the
// public LoadFromPeer, calls it).
//
// The shape, and why: receivers in the order they registered in etcd form a
// chain in which each takes from the two holders before it (the root seed
// for the first two). Every link then carries the checkpoint about once,
// the root's link included, and all receivers finish about one pull's time
// after the first starts, whatever their number; a receiver behind a slow
// link slows only the share its children take from it (they take the rest
// from the holder before it). The registry holds membership and progress
// only: which chunks a relay holds is asked of the relay (GET /v1/have).
#ifndef TENSORLIFT_SOURCES_RELAY_H_
#define TENSORLIFT_SOURCES_RELAY_H_

#include <functional>
#include <memory>
#include <string>

#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::sources {

// "" when a pull of `key` with `options` relays; else why not ("no
// registry", "a tensor-parallel rank's slices", ...).
std::string WhyNotRelay(const PeerKey& key, const PeerLoadOptions& options);

struct Relayed {
  LoadedCheckpoint loaded;
  // This pull's relay, whole now (every chunk held); null when it could not
  // start (the pull then took from the root alone, report->failures says why).
  std::unique_ptr<PeerServer> relay;
  // Whether relays that registered after this one still receive (asks the
  // registry; true when it cannot say).
  std::function<bool()> children_left;
};

// The relaying pull. kUnavailable when no whole seed could be reached (the
// caller then loads as without relaying), or when the load failed (every
// source, the root's included).
Result<Relayed> RelayPull(const PeerKey& key, const PeerLoadOptions& options,
                          PeerLoadReport* report);

// Keeps a finished pull's relay serving while holders may still pull from it
// (sessions open, relays registered after it still receiving), at most
// `max_ms`, then stops it (WaitForRelays). Takes relayed.relay.
void Linger(Relayed& relayed, int max_ms);

// The address of this host on its route to `url`'s host ("http://host:port"),
// e.g. the address a relay advertises to the hosts that reach the registry.
Result<std::string> LocalAddressTowards(const std::string& url);

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_RELAY_H_
