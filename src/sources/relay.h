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
// A parent measured slow (a receiver behind a slow link) while this pull
// waits on it gets the holder before it added as a second source
// (SlowParentRule), so a slow receiver slows only the share its children take
// from it. The registry holds membership and progress only: which chunks a
// relay holds is asked of the relay (GET /v1/have).
#ifndef TENSORLIFT_SOURCES_RELAY_H_
#define TENSORLIFT_SOURCES_RELAY_H_

#include <chrono>
#include <cstdint>
#include <deque>
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

// The rule that takes a second source for a slow parent (a relay behind a
// slow link, which would hold every relay after it to its rate). Nothing in
// the registry says how fast a parent could be fed (its own parent may be
// the root, or slowed by it), so it is measured: once this pull has been
// caught up with its parent (waiting on it) for `hold`, the holder before
// the parent (the root for the first relay) is probed: it joins as a source
// and gives a piece, and is kept for good only when it delivered at more
// than kFaster times the parent's rate (the store's measures: bytes per
// second while a source holds pieces). In a chain at full speed the probe
// shares the holder's upload with the parent and comes out slower; behind a
// link at a quarter it comes out about three times faster. Each parent is
// probed once. A holder kept shares its upload between two children, which
// is why a parent is not helped on a guess: the registry's progress values
// are up to a second old, and a rule on them alone took second sources on
// noise and slowed a chain of 8 hop by hop.
class SlowParentRule {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kCaughtUp = 0.05;  // A share of the checkpoint.
  static constexpr double kFaster = 2.0;
  explicit SlowParentRule(std::chrono::milliseconds hold = std::chrono::milliseconds(1000))
      : hold_(hold) {}
  // One look at the registry, at `now`: the parent's and this pull's
  // progress (0..1). True once this pull has stayed within kCaughtUp of the
  // parent for `hold` (time to probe the holder before it).
  bool CaughtUpFor(Clock::time_point now, const std::string& parent, double parent_progress,
                   double mine) {
    const bool caught_up = mine >= parent_progress - kCaughtUp;
    if (!caught_up || parent != parent_) {
      parent_ = parent;
      since_.reset();
      if (!caught_up) return false;
    }
    if (!since_) since_ = now;
    return now - *since_ >= hold_;
  }
  // After the probe: whether the holder probed is kept (rates in bytes/s,
  // and the bytes each delivered); none until both have delivered (a parent
  // with nothing to give yet is not measured, and judging it then kept no
  // second source behind a slow relay at 512 MiB).
  static std::optional<bool> KeepProbed(double parent_rate, uint64_t parent_bytes,
                                        double probed_rate, uint64_t probed_bytes) {
    if (parent_bytes == 0 || probed_bytes == 0 || parent_rate <= 0) return std::nullopt;
    return probed_rate > kFaster * parent_rate;
  }

 private:
  const std::chrono::milliseconds hold_;
  std::string parent_;
  std::optional<Clock::time_point> since_;
};

// The slow relay's own rule: a relay that gains chunks at less than kSlower
// times its parent's rate (by the parent's own chunk map, which the relay
// follows, so fresh) over `window`, at two looks in a row, while it is behind
// the parent, is behind a slower link than the chain's. Looks start with the
// first chunk in after the parent came (a new parent is connected to first).
// It says so in its registry entry (SeedInfo::behind) and the chain orders
// it after every relay that did not: its children then take from its
// parent, whose upload it no longer shares, and it takes from the chain's
// last relay, whose upload is free. Waiting on its parent (caught up with it), a relay gains what
// the parent gains and is never found behind; a relay found behind by mistake (a stall) loses a
// hop's time, its children none. Sticky: a relay moves at most once.
class BehindRule {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kSlower = 0.5;
  // Judged over the window or longer: until the parent gained kMinChunks
  // (fewer are noise; at 512 MiB in 4 MiB chunks on 200 Mbit/s, half a
  // second holds 3). Looks older than kKept go.
  static constexpr uint64_t kMinChunks = 6;
  static constexpr std::chrono::seconds kKept{10};
  explicit BehindRule(std::chrono::milliseconds window = std::chrono::milliseconds(500))
      : window_(window) {}
  // One look, at `now`: the parent's chunks held and this pull's. True from
  // the look that finds this pull behind for the second time in a row.
  bool Behind(Clock::time_point now, const std::string& parent, uint64_t parent_held,
              uint64_t mine);

 private:
  struct Look {
    Clock::time_point at;
    uint64_t parent = 0, mine = 0;
  };
  const std::chrono::milliseconds window_;
  std::string parent_;
  uint64_t first_ = 0;  // This pull's chunks when the parent came.
  std::deque<Look> looks_;
  int in_a_row_ = 0;
  bool behind_ = false;
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
