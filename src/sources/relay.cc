// A pull that relays (relay.h): the root's session and manifest, the pull's
// file, a striped store over the root, the relay started once the loader has
// placed the tensors, and a thread that follows the registry to take the
// holder registered just before this relay.
#include "sources/relay.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "device/device.h"
#include "load/host_load.h"
#include "remote/availability.h"
#include "remote/control.h"
#include "remote/handover.h"
#include "remote/peer_server.h"
#include "remote/peer_session.h"
#include "remote/peer_store.h"
#include "remote/registry.h"
#include "remote/server.h"
#include "sources/striped_plan.h"
#include "sources/striped_sources.h"
#include "sources/striped_store.h"

namespace tensorlift::sources {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Where the relay listens and what it advertises (PeerLoadOptions::relay_host).
Result<std::string> RelayHost(const PeerLoadOptions& o) {
  if (!o.relay_host.empty()) return o.relay_host;
  std::string registry_host;
  int port = 0;
  TL_RETURN_IF_ERROR(remote::ParseHttpUrl(o.registry, &registry_host, &port));
  if (!o.seed.host.empty() && !(IsLoopback(o.seed.host) && !IsLoopback(registry_host)))
    return o.seed.host;
  return LocalAddressTowards(o.registry);
}

remote::PeerSession::DialOptions Dial(const PeerLoadOptions& o) { return WholeTensorDial(o); }

remote::UcxClient::GetOptions Gets(const PeerLoadOptions& o) {
  remote::UcxClient::GetOptions g;
  g.stall_timeout = milliseconds(o.stall_timeout_ms);
  g.min_rate = o.min_rate;
  g.max_in_flight = o.max_in_flight;
  g.max_get_bytes = o.batch_bytes;
  return g;
}

// The load's options: the fallback's, but those that shape the tensors (the
// root serves the key's) and those about local files.
LoadOptions RelayLoadOptions(const PeerLoadOptions& o) {
  LoadOptions l = o.fallback_load;
  l.filter = TensorFilter();
  l.dtype.reset();
  l.parallel = TensorParallel();
  l.layout.clear();
  l.mode = IoMode::kAuto;
  l.engine = IoEngine::kAuto;
  l.threads = 0;
  l.device = DeviceId();
  l.arena_pool.reset();  // The relay keeps the memory it serves.
  l.shared_memory = false;
  if (l.content_hash == ContentHashMode::kAuto) l.content_hash = ContentHashMode::kOff;
  return l;
}

// The registry's whole seeds of size 1 for the key, after `peers`.
std::vector<std::string> Roots(const PeerKey& key, const PeerLoadOptions& o,
                               remote::Registry* registry, PeerLoadReport* report) {
  std::vector<std::string> roots = o.peers;
  Result<std::vector<remote::SeedInfo>> listed = registry->List(key.Digest());
  if (!listed.ok()) {
    report->failures.push_back("registry " + o.registry + ": " + listed.status().message());
    return roots;
  }
  for (const remote::SeedInfo& s : *listed) {
    if (!s.partial && s.world == 1 && std::find(roots.begin(), roots.end(), s.url) == roots.end()) {
      roots.push_back(s.url);
    }
  }
  return roots;
}

// The running pull: the store, the relay once started, and the thread that
// follows the registry.
class Relay {
 public:
  Relay(const PeerKey& key, const PeerLoadOptions& o, PeerLoadReport* report)
      : key_(key), o_(o), report_(report) {}

  ~Relay() { StopFollowing(); }

  Result<Relayed> Run() {
    TL_ASSIGN_OR_RETURN(
        registry_, remote::Registry::Connect(o_.registry, milliseconds(o_.request_timeout_ms)));
    TL_RETURN_IF_ERROR(OpenRoot());
    TL_ASSIGN_OR_RETURN(host_, RelayHost(o_));
    HostLoadHooks hooks;
    hooks.placed = [this](Checkpoint::Location loc, const std::byte* data) {
      placed_.push_back({loc, data});
    };
    hooks.arenas = [this](std::vector<std::shared_ptr<const Buffer>> arenas) {
      Status st = StartRelay(std::move(arenas));
      if (!st.ok()) report_->failures.push_back("relay: " + st.message());
    };
    Result<LoadedCheckpoint> loaded =
        LoadOnHost(ckpt_->WithStore(store_), RelayLoadOptions(o_), nullptr, &hooks);
    StopFollowing();
    for (const StripeSourceReport& s : store_->SourceReports()) {
      report_->sources.push_back({s.name, s.bytes, s.failure});
      if (!s.failure.empty()) report_->failures.push_back(s.name + ": " + s.failure);
    }
    store_.reset();  // Closes the sessions with the root and the relays.
    if (!loaded.ok()) {
      relay_.reset();
      return UnavailableError("relaying pull: " + loaded.status().message());
    }
    Relayed out;
    out.loaded = std::move(loaded).value();
    if (relay_) {
      have_->MarkAll();
      Status st = remote::UpdateRelayEntry(*relay_, behind_);
      if (!st.ok()) report_->failures.push_back("relay: " + st.message());
      report_->relay = relay_->url();
      out.relay = std::move(relay_);
      // Whether a relay that registered after this one still receives (it may
      // be pulling from this one); true when the registry cannot say.
      // Relays behind a slower link come after it whenever they registered.
      out.children_left = [registry = registry_, digest = key_.Digest(), mine = my_created_,
                           url = report_->relay]() {
        Result<std::vector<remote::SeedInfo>> listed = registry->List(digest);
        if (!listed.ok() || mine == 0) return true;
        for (const remote::SeedInfo& s : *listed) {
          if (s.partial && s.url != url && (s.created > mine || s.behind)) return true;
        }
        return false;
      };
    }
    return out;
  }

 private:
  // The first whole seed that answers: the reference every chunk is checked
  // against, and the first source.
  Status OpenRoot() {
    std::vector<std::string> roots = Roots(key_, o_, registry_.get(), report_);
    std::unique_ptr<remote::PeerSession> session;
    // The root's data plane is connected only if it is read from (the first
    // relay's): a UCX 1.13 source may abort when a client's endpoint that
    // never carried a get goes away during its wire-up (docs/security.md).
    remote::PeerSession::DialOptions dial = Dial(o_);
    dial.connect = false;
    for (const std::string& url : roots) {
      auto s = remote::PeerSession::Dial(url, key_, dial);
      if (s.ok() && !key_.content.empty() &&
          (!(*s)->manifest.content || (*s)->manifest.content->Hex() != key_.content)) {
        report_->failures.push_back(url + ": content differs from " + key_.content);
        continue;
      }
      if (!s.ok()) {
        report_->failures.push_back(s.status().message());
        continue;
      }
      session = std::move(s).value();
      root_url_ = url;
      break;
    }
    if (!session) return UnavailableError("relaying pull: no whole seed answered");
    const remote::Manifest& m = session->manifest;
    if (o_.handover != HandoverMode::kOff && !m.handover_socket.empty() &&
        m.handover_host == remote::HandoverHostId() &&
        remote::HandoverReachable(m.handover_socket, o_.connect_timeout_ms)) {
      return UnimplementedError("relaying pull: the root seed " + root_url_ +
                                " is on this host: its memory is handed over");
    }
    std::vector<remote::Wanted> wanted;
    for (const remote::ManifestTensor& t : session->manifest.tensors) {
      remote::Wanted w;
      w.name = t.name;
      w.dtype = t.dtype;
      w.full_shape = t.shape;
      w.shape = t.shape;
      w.nbytes = t.nbytes;
      wanted.push_back(std::move(w));
    }
    TL_ASSIGN_OR_RETURN(Checkpoint ckpt, remote::OpenPullFile(wanted, root_url_));
    ckpt_ = std::make_unique<Checkpoint>(std::move(ckpt));
    layout_ = LayOut(*ckpt_);
    TL_ASSIGN_OR_RETURN(
        std::unique_ptr<PeerSource> root,
        PeerSource::Open(std::move(session), layout_, TensorFilter(), /*take=*/1, Gets(o_)));
    root->ConnectOnFirstFetch(o_.transports, o_.connect_timeout_ms);
    reference_ = &root->manifest();
    for (auto& shard : layout_.shards) {
      for (auto& t : shard) t.checked_by = root->served(t);
    }
    layout_.chunk_bytes = reference_->chunk_bytes;
    have_ = std::make_shared<remote::Availability>(*reference_);
    StripedStore::Options so;
    // One chunk a piece: a relay serves a chunk once it is whole and checked,
    // so each hop of the chain is one chunk's time behind the one before.
    so.piece_bytes = reference_->chunk_bytes;
    so.idle_timeout = milliseconds(o_.stall_timeout_ms);
    // TENSORLIFT_RELAY_FAULTS=corrupt (tests: docs/security.md, "Peer
    // faults"): a relay that serves wrong bytes, each chunk's first byte
    // flipped once it has landed and checked, before its children are told.
    const char* faults = std::getenv("TENSORLIFT_RELAY_FAULTS");
    const bool corrupt = faults && std::string(faults) == "corrupt";
    so.on_chunk = [this, corrupt](const LaidOut& t, int64_t chunk) {
      if (!t.checked_by) return;
      if (corrupt) {
        auto it = data_of_.find(t.info);
        if (it != data_of_.end()) it->second[chunk * reference_->chunk_bytes] ^= std::byte{1};
      }
      have_->Mark(t.checked_by - reference_->tensors.data(), chunk);
    };
    std::vector<std::unique_ptr<Source>> sources;
    root_ = root.get();
    sources.push_back(std::move(root));
    // Moved: the tensors' entries stay where the root's source mapped them.
    store_ = std::make_shared<StripedStore>(std::move(layout_), std::move(sources), so);
    using_[root_url_] = root_;
    return Status::Ok();
  }

  // The tensors are placed (before any read): serve them as they land, and
  // follow the registry for the holders before this relay.
  Status StartRelay(std::vector<std::shared_ptr<const Buffer>> arenas) {
    std::vector<remote::Served> served;
    for (const auto& [loc, data] : placed_) {
      const TensorInfo& info = ckpt_->info(loc);
      data_of_[&info] = const_cast<std::byte*>(data);
      remote::Served s;
      s.name = info.name;
      s.dtype = info.dtype;
      for (uint64_t d : info.shape) s.shape.push_back(static_cast<int64_t>(d));
      s.data = const_cast<std::byte*>(data);
      s.nbytes = info.nbytes();
      served.push_back(std::move(s));
    }
    ServeOptions so;
    so.host = host_;
    so.token = o_.token;
    so.rate_limit = o_.relay_rate_limit;
    so.registry = o_.registry;
    so.registry_ttl_s = o_.seed.registry_ttl_s;
    so.transports = o_.transports;
    so.handover = false;
    remote::RelayOf of{reference_, have_};
    auto keep = std::make_shared<std::vector<std::shared_ptr<const Buffer>>>(std::move(arenas));
    TL_ASSIGN_OR_RETURN(relay_, remote::StartPeerServer(key_, so, std::move(served), {},
                                                        std::move(keep), nullptr, &of));
    // TENSORLIFT_RELAY_FAULTS=behind (tests): a relay that says at once it is
    // behind a slower link (BehindRule), to move to the chain's end.
    const char* faults = std::getenv("TENSORLIFT_RELAY_FAULTS");
    if (faults && std::string(faults) == "behind") {
      behind_ = true;
      report_->relay_behind = true;
      TL_RETURN_IF_ERROR(remote::UpdateRelayEntry(*relay_, behind_));
    }
    Discover();  // Before the first read: the root is asked only if no relay came before.
    follower_ = std::thread([this] { Follow(); });
    return Status::Ok();
  }

  void StopFollowing() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (follower_.joinable()) follower_.join();
  }

  // Every 200 ms while the load runs (and once before its first read): the
  // source is the holder registered just before this relay (and its own
  // parent while it is measured slow: SlowParentRule); the root seed only while no
  // relay came before (it feeds the first relay, and each relay its
  // successor: every link carries the checkpoint about once).
  void Follow() {
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, milliseconds(200), [&] { return stop_; })) return;
      }
      Discover();
      if (Clock::now() - last_progress >= std::chrono::seconds(1)) {
        remote::UpdateRelayEntry(*relay_, behind_).IgnoreError();
        last_progress = Clock::now();
      }
    }
  }

  // One round: a holder that failed or whose map cannot be read is passed
  // over for the next earlier one; those no longer wanted (a closer relay
  // came) leave the queue. The registry unreachable: the sources stay.
  void Discover() {
    for (const StripeSourceReport& s : store_->SourceReports()) {
      if (!s.failure.empty()) dead_.insert(s.name);
    }
    for (const auto& [url, src] : using_) {
      auto* r = dynamic_cast<RelaySource*>(src);
      if (r && !r->lost().empty() && !dead_.count(url)) {
        store_->Drop(src, "its chunk map: " + r->lost());
        dead_.insert(url);
      }
    }
    Result<std::vector<remote::SeedInfo>> listed = registry_->List(key_.Digest());
    if (!listed.ok()) return;
    int64_t mine = 0;
    for (const remote::SeedInfo& s : *listed) {
      if (s.url == relay_->url()) mine = s.created;
    }
    if (mine == 0) return;
    my_created_ = mine;
    std::vector<const remote::SeedInfo*> before = Before(*listed, mine);
    // The parent: the latest holder before this relay. A parent measured
    // slow (a relay behind a slower link) while this pull waits on it gets
    // the holder before it (the root for the first relay) as a second source
    // for good (SlowParentRule): the pull then takes what the parent can give
    // and the rest from the one before, and a slow relay slows no one after it.
    std::string parent = before.empty() ? root_url_ : before[0]->url;
    // This relay slower than its parent (BehindRule): it goes to the chain's
    // end, and says so at once, for its children to take from its parent.
    if (!behind_ && !before.empty() && before[0]->partial && using_.count(parent)) {
      auto* r = dynamic_cast<RelaySource*>(using_[parent]);
      if (r && behind_rule_.Behind(Clock::now(), parent, r->held(), have_->held())) {
        behind_ = true;
        report_->relay_behind = true;
        Status st = remote::UpdateRelayEntry(*relay_, behind_);
        if (!st.ok()) report_->failures.push_back("relay: behind its parent: " + st.message());
        before = Before(*listed, mine);
        parent = before.empty() ? root_url_ : before[0]->url;
      }
    }
    std::set<std::string> want;
    if (!dead_.count(parent)) want.insert(parent);
    if (!before.empty() && before[0]->partial && !probed_.count(parent) &&
        !helpers_.count(parent)) {
      const std::string q = before.size() >= 2 ? before[1]->url : root_url_;
      const double total = static_cast<double>(reference_->total_bytes);
      const double mine_p = total > 0 ? have_->held_bytes() / total : 1;
      if (probe_.first != parent) probe_ = {};
      if (probe_.first.empty()) {
        if (!dead_.count(q) && rule_.CaughtUpFor(Clock::now(), parent, before[0]->progress, mine_p))
          probe_ = {parent, q};
      } else if (dead_.count(q) || !using_.count(q) || !using_.count(parent)) {
        probed_.insert(parent);  // The holder before it is gone: nothing to compare.
        probe_ = {};
      } else {
        // Judged once both have delivered; the holder probed serves meanwhile.
        const auto [p_rate, p_bytes] = store_->Measured(using_[parent]);
        const auto [q_rate, q_bytes] = store_->Measured(using_[q]);
        if (std::optional<bool> keep =
                SlowParentRule::KeepProbed(p_rate, p_bytes, q_rate, q_bytes)) {
          if (*keep) helpers_[parent] = q;
          probed_.insert(parent);
          probe_ = {};
        }
      }
      if (!probe_.first.empty()) want.insert(probe_.second);
    }
    if (auto h = helpers_.find(parent); h != helpers_.end() && !dead_.count(h->second))
      want.insert(h->second);
    for (const std::string& url : want) {
      if (using_.count(url)) {
        if (retired_.erase(url)) store_->Unretire(using_[url]);
        continue;
      }
      Result<Source*> joined = Join(url);
      if (!joined.ok()) {
        dead_.insert(url);
        report_->failures.push_back(joined.status().message());
        continue;
      }
      using_[url] = *joined;
    }
    for (auto& [url, src] : using_) {
      if (!want.count(url) && !retired_.count(url)) {
        store_->Retire(src);
        retired_.insert(url);
      }
    }
  }

  // The holders before this relay in the chain, the latest first: the
  // registry's order (etcd's create_revision), with the relays behind a
  // slower link (SeedInfo::behind; this one's own flag is behind_, which its
  // entry may not show yet) after every other. Relays that finished are whole
  // seeds now: they keep their place among the sources already taken.
  std::vector<const remote::SeedInfo*> Before(const std::vector<remote::SeedInfo>& listed,
                                              int64_t mine) const {
    auto place = [](const remote::SeedInfo& s) { return std::pair(s.behind, s.created); };
    const std::pair<bool, int64_t> me(behind_, mine);
    std::vector<const remote::SeedInfo*> before;
    for (const remote::SeedInfo& s : listed) {
      if (s.created <= 0 || s.world != 1 || s.url == relay_->url() || dead_.count(s.url) ||
          !(place(s) < me))
        continue;
      if (s.partial || (s.url != root_url_ && using_.count(s.url))) before.push_back(&s);
    }
    std::sort(before.begin(), before.end(),
              [&](const remote::SeedInfo* a, const remote::SeedInfo* b) {
                return place(*a) > place(*b);
              });
    return before;
  }

  // A holder joins the store: a relay (its chunk map followed), or a whole seed.
  Result<Source*> Join(const std::string& url) {
    // Connected at its first fetch, as the root's: a holder joined and never
    // read from (the pull ended, or a closer one came) leaves no endpoint in
    // its wire-up, which UCX 1.13 aborts the holder over (docs/security.md).
    remote::PeerSession::DialOptions dial = Dial(o_);
    dial.connect = false;
    TL_ASSIGN_OR_RETURN(std::unique_ptr<remote::PeerSession> session,
                        remote::PeerSession::Dial(url, key_, dial));
    for (const remote::ManifestTensor& t : session->manifest.tensors) {
      const remote::ManifestTensor* r = reference_->Find(t.name);
      if (!r || r->chunk_xxh3 != t.chunk_xxh3 ||
          session->manifest.chunk_bytes != reference_->chunk_bytes) {
        return InvalidArgumentError(url + ": its chunks are not the root's (another checkpoint)");
      }
    }
    // Its chunk map's long poll answers within kHaveWaitMs: one that takes
    // 2.5 s (at most the request timeout) longer (a relay cut off or
    // stalled) is lost, and the next round passes it over, sooner than its
    // gets would stall.
    const int answer_ms = RelaySource::kHaveWaitMs + std::min(o_.request_timeout_ms, 2500);
    TL_ASSIGN_OR_RETURN(remote::Control control, remote::Control::Make(url, o_.token, answer_ms));
    TL_ASSIGN_OR_RETURN(std::unique_ptr<RelaySource> src,
                        RelaySource::Open(std::move(session), std::move(control), store_->layout(),
                                          TensorFilter(), /*take=*/1, Gets(o_)));
    src->ConnectOnFirstFetch(o_.transports, o_.connect_timeout_ms);
    return store_->AddSource(std::move(src));
  }

  const PeerKey& key_;
  const PeerLoadOptions& o_;
  PeerLoadReport* report_;
  std::shared_ptr<remote::Registry> registry_;
  std::string root_url_, host_;
  std::unique_ptr<Checkpoint> ckpt_;
  Layout layout_;
  const remote::Manifest* reference_ = nullptr;
  std::shared_ptr<remote::Availability> have_;
  std::shared_ptr<StripedStore> store_;
  Source* root_ = nullptr;
  std::map<std::string, Source*> using_;  // By URL: the sources joined (the store owns them).
  std::set<std::string> retired_;
  std::set<std::string> dead_;  // Holders passed over (failed, lost, refused).
  // A parent found behind: the holder before it, taken from as well.
  std::map<std::string, std::string> helpers_;
  SlowParentRule rule_;
  BehindRule behind_rule_;
  bool behind_ = false;           // This relay found behind its parent (BehindRule), for good.
  std::set<std::string> probed_;  // Parents judged (once each).
  std::pair<std::string, std::string> probe_;  // The parent, the holder probed for it.
  int64_t my_created_ = 0;                     // This relay's place in the registry's order.
  std::vector<std::pair<Checkpoint::Location, const std::byte*>> placed_;
  std::map<const TensorInfo*, std::byte*> data_of_;  // Where each tensor lands.
  std::unique_ptr<PeerServer> relay_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread follower_;
};

// Relays lingering after their own load (Linger, WaitForRelays).
struct Lingering {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
};
Lingering& Lingerers() {
  static Lingering* l = new Lingering();  // Never destroyed: detached threads use it.
  return *l;
}

}  // namespace

bool BehindRule::Behind(Clock::time_point now, const std::string& parent, uint64_t parent_held,
                        uint64_t mine) {
  if (behind_) return true;
  if (parent != parent_) {  // A new parent: start over.
    parent_ = parent;
    looks_.clear();
    in_a_row_ = 0;
    first_ = mine;
  }
  // From the first chunk in after it: not the time to connect to it.
  if (mine <= first_) return false;
  looks_.push_back({now, parent_held, mine});
  while (now - looks_.front().at > kKept) looks_.pop_front();
  // The base: the latest look at least a window old since which the parent
  // gained kMinChunks (a longer window where chunks are big for the rate).
  const Look* base = nullptr;
  for (auto it = looks_.rbegin(); it != looks_.rend() && !base; ++it) {
    if (now - it->at >= window_ && parent_held >= it->parent + kMinChunks) base = &*it;
  }
  if (!base) return false;  // Not judged yet.
  const uint64_t parent_gained = parent_held - base->parent;
  const uint64_t gained = mine > base->mine ? mine - base->mine : 0;
  const bool slower = parent_held > mine &&
                      static_cast<double>(gained) < kSlower * static_cast<double>(parent_gained);
  in_a_row_ = slower ? in_a_row_ + 1 : 0;
  behind_ = in_a_row_ >= 2;
  return behind_;
}

std::string WhyNotRelay(const PeerKey& key, const PeerLoadOptions& o) {
  if (!o.relay) return "relaying is off";
  if (o.registry.empty()) return "no registry";
  if (o.parallel.size != 1) return "a tensor-parallel rank's slices";
  if (o.device.type != DeviceType::kCpu) return "onto a device";
  if (!key.layout.empty() && o.parallel.size != 1) return "a sliced layout";
  return "";
}

Result<Relayed> RelayPull(const PeerKey& key, const PeerLoadOptions& options,
                          PeerLoadReport* report) {
  const auto t0 = Clock::now();
  TL_RETURN_IF_ERROR(key.Validate());
  Relay relay(key, options, report);
  Result<Relayed> r = relay.Run();
  report->source_ranks = 1;
  report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

void Linger(Relayed& relayed, int max_ms) {
  if (!relayed.relay) return;
  Lingering& l = Lingerers();
  {
    std::lock_guard<std::mutex> lock(l.mu);
    ++l.running;
  }
  std::thread([server = std::move(relayed.relay), children_left = std::move(relayed.children_left),
               max_ms]() mutable {
    const auto deadline = Clock::now() + milliseconds(max_ms);
    // Until no session has been open for half a second, or no relay that
    // registered after this one still receives (a child that died leaves its
    // sessions open; its registry entry goes with its lease).
    auto idle_since = Clock::now();
    auto asked = Clock::now() - std::chrono::seconds(1);
    while (Clock::now() < deadline && !PeerPullsStopped()) {
      if (server->active_sessions() > 0) idle_since = Clock::now();
      if (Clock::now() - idle_since >= milliseconds(500)) break;
      if (children_left && Clock::now() - asked >= milliseconds(200)) {
        asked = Clock::now();
        if (!children_left()) break;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    server.reset();
    Lingering& l = Lingerers();
    std::lock_guard<std::mutex> lock(l.mu);
    --l.running;
    l.cv.notify_all();
  }).detach();
}

Result<std::string> LocalAddressTowards(const std::string& url) {
  std::string host;
  int port = 0;
  TL_RETURN_IF_ERROR(remote::ParseHttpUrl(url, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return UnavailableError("cannot resolve " + host);
  // A UDP socket "connected" to the host: the kernel picks the route and the
  // local address, and nothing is sent.
  const int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
  std::string local;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      const void* a =
          ss.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof buf)) local = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  if (local.empty()) return UnavailableError("no route to " + host);
  return local;
}

}  // namespace tensorlift::sources

namespace tensorlift {

int WaitForRelays(int timeout_ms) {
  sources::Lingering& l = sources::Lingerers();
  std::unique_lock<std::mutex> lock(l.mu);
  l.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return l.running == 0; });
  return l.running;
}

}  // namespace tensorlift
