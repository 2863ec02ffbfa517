// A pull that relays (docs/remote.md, "Relaying"; PeerLoadOptions::relay):
// the destination's memory is served while it fills, and the pull takes its
// chunks from the holders that registered just before it, a striped load
// over the root seed and relays. Private to sources/ (peer_entry.cc, the
// public LoadFromPeer, calls it).
//
// The shape, and why: receivers in the order they registered in etcd form a
// chain in which each takes from the holder registered just before it (the
// root seed for the first). Every link then carries the checkpoint about
// once, the root's link included, and all receivers finish about one pull's
// time (and a chunk per hop) after the first starts, whatever their number.
// A parent that stays behind its own parent (a receiver behind a slow link)
// while this pull waits on it gets that one added as a second source
// (BehindWatch), so a slow receiver slows only the share its children take
// from it. The registry holds membership and progress only: which chunks a
// relay holds is asked of the relay (GET /v1/have).
#ifndef TENSORLIFT_SOURCES_RELAY_H_
#define TENSORLIFT_SOURCES_RELAY_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
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
// source, the root's included); kUnimplemented when the root seed is on this
// host and hands its memory over (PeerLoadOptions::handover): the caller's
// usual pull maps it, with nothing to relay.
Result<Relayed> RelayPull(const PeerKey& key, const PeerLoadOptions& options,
                          PeerLoadReport* report);

// The rule that takes a parent's own parent as a second source: the parent
// is kBehind (a share of the checkpoint) behind it while this pull has caught
// up with the parent (it waits on it), and has stayed so for `hold`. The
// registry's progress values are up to a second old (each relay writes its
// own once a second), which on a small checkpoint is a gap as wide as
// kBehind for a moment: only a parent whose own updates keep it behind (a
// slow link) is helped. A pull's chain is otherwise left alone, since a
// holder taken as a second source shares its upload between two children.
class BehindWatch {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kBehind = 0.15;
  explicit BehindWatch(std::chrono::milliseconds hold = std::chrono::milliseconds(2000))
      : hold_(hold) {}
  // One look at the registry, at `now`: the parent's, its parent's and this
  // pull's progress (0..1). True once the rule has held for `hold`.
  bool Behind(Clock::time_point now, const std::string& parent, double parent_progress,
              double grandparent_progress, double mine) {
    const bool behind =
        grandparent_progress - parent_progress > kBehind && mine >= parent_progress - kBehind / 3;
    if (!behind || parent != parent_) {
      parent_ = parent;
      since_.reset();
      if (!behind) return false;
    }
    if (!since_) since_ = now;
    return now - *since_ >= hold_;
  }

 private:
  const std::chrono::milliseconds hold_;
  std::string parent_;
  std::optional<Clock::time_point> since_;
};

// Keeps a finished pull's relay serving while holders may still pull from it
// (sessions open, relays registered after it still receiving), at most
// `max_ms`, then stops it (WaitForRelays). Takes relayed.relay.
void Linger(Relayed& relayed, int max_ms);

// The address of this host on its route to `url`'s host ("http://host:port"),
// e.g. the address a relay advertises to the hosts that reach the registry.
Result<std::string> LocalAddressTowards(const std::string& url);

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_RELAY_H_
