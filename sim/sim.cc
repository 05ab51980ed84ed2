#include "sim/sim.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "comm/communicator.h"
#include "comm/engine.h"
#include "comm/failure.h"
#include "comm/fingerprint.h"
#include "comm/waiter.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace braid::sim {

Topology Topology::uniform(int hosts, int perHost) { return {std::vector<int>(static_cast<std::size_t>(hosts), perHost), false}; }

int Topology::nranks() const { return std::accumulate(hostSizes.begin(), hostSizes.end(), 0); }

std::vector<int> Topology::hostLabels() const {
  std::vector<int> label;
  if (!interleave) {
    for (std::size_t h = 0; h < hostSizes.size(); ++h) label.insert(label.end(), static_cast<std::size_t>(hostSizes[h]), static_cast<int>(h));
    return label;
  }
  std::vector<int> left = hostSizes;
  for (std::size_t h = 0; label.size() < static_cast<std::size_t>(nranks()); h = (h + 1) % left.size())
    if (left[h] > 0) --left[h], label.push_back(static_cast<int>(h));
  return label;
}

std::string Topology::describe() const {
  const auto [lo, hi] = std::minmax_element(hostSizes.begin(), hostSizes.end());
  std::string s = std::to_string(hostSizes.size()) + (hostSizes.size() == 1 ? " host" : " hosts");
  s += *lo == *hi ? " x " + std::to_string(*lo) : " (" + std::to_string(*lo) + "-" + std::to_string(*hi) + " ranks)";
  return interleave ? s + ", ranks dealt round-robin" : s;
}

// The bytes one rank sends another on one channel, in order, up to the stream's capacity.
class World::Stream {
 public:
  explicit Stream(std::size_t capacity) : capacity_(capacity) {}
  std::size_t put(const void* data, std::size_t n) {
    n = std::min(n, capacity_ - size_);
    if (n == 0) return 0;
    if (buf_.size() < size_ + n) grow(size_ + n);
    const std::size_t tail = (head_ + size_) % buf_.size(), first = std::min(n, buf_.size() - tail);
    std::memcpy(buf_.data() + tail, data, first);
    std::memcpy(buf_.data(), static_cast<const std::byte*>(data) + first, n - first);
    size_ += n;
    return n;
  }
  bool stalled = false;  // delivers nothing (Fault)
  void clear() { head_ = size_ = 0; }
  std::span<const std::byte> peek() const {
    if (size_ == 0 || stalled) return {};
    return {buf_.data() + head_, std::min(size_, buf_.size() - head_)};
  }
  void consume(std::size_t n) {
    head_ = (head_ + n) % buf_.size();
    size_ -= n;
  }
  std::size_t get(void* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n && size_ > 0 && !stalled) {
      auto s = peek();
      const std::size_t k = std::min(s.size(), n - got);
      std::memcpy(static_cast<std::byte*>(dst) + got, s.data(), k);
      consume(k);
      got += k;
    }
    return got;
  }

 private:
  // Grown as data waits (most streams of a large world carry a few small messages): the ring is
  // laid out again from its head.
  void grow(std::size_t need) {
    std::vector<std::byte> bigger(std::min(capacity_, std::max({need, 2 * buf_.size(), std::size_t{256}})));
    const std::size_t n = size_;
    std::size_t off = 0;
    const bool wasStalled = std::exchange(stalled, false);
    while (size_ > 0) {
      auto s = peek();
      std::memcpy(bigger.data() + off, s.data(), s.size());
      off += s.size();
      consume(s.size());
    }
    buf_ = std::move(bigger);
    head_ = 0;
    size_ = n;
    stalled = wasStalled;
  }
  std::vector<std::byte> buf_;
  std::size_t capacity_, head_ = 0, size_ = 0;
};

// The ranks the next round passes: a rank whose pass moved (it may have more to do), and a rank
// that a peer's pass gave bytes to read or room to write. The others cannot move, and at 16,384
// ranks a round that passed them all would cost far more than the messages.
struct Wakes {
  std::vector<char> awake;
  std::vector<int> list;
  void wake(int r) {
    if (awake[static_cast<std::size_t>(r)]) return;
    awake[static_cast<std::size_t>(r)] = 1;
    list.push_back(r);
  }
};

namespace {

class SimChannel : public Channel {
 public:
  SimChannel(World::Stream& out, World::Stream& in, Wakes& wakes, int peer) : out_(out), in_(in), wakes_(wakes), peer_(peer) {}
  Result<std::size_t> trySend(const void* data, std::size_t n) override { return woke(out_.put(data, n)); }
  Result<std::span<const std::byte>> peek() override { return in_.peek(); }
  void consume(std::size_t n) override {
    in_.consume(n);
    woke(n);
  }
  Result<std::size_t> tryRecv(void* dst, std::size_t n) override { return woke(in_.get(dst, n)); }

 private:
  // The peer may move now: it has bytes to read, or room to write.
  std::size_t woke(std::size_t n) {
    if (n) wakes_.wake(peer_);
    return n;
  }
  World::Stream& out_;
  World::Stream& in_;
  Wakes& wakes_;
  int peer_;
};

class SimConnection : public Connection {
 public:
  explicit SimConnection(int peer) : peer_(peer) {}
  int peer() const override { return peer_; }
  std::string_view transport() const override { return "sim"; }
  int numChannels() const override { return static_cast<int>(channels_.size()); }
  Channel& channel(int i) override { return *channels_[static_cast<std::size_t>(i)]; }
  std::vector<std::unique_ptr<SimChannel>> channels_;

 private:
  int peer_;
};

Waiter& sharedWaiter() {  // Engine::pass never waits; EngineHost still hands one out
  static Waiter w(0, true);
  return w;
}

}  // namespace

// One virtual rank: its Workspace (the layout, scratch memory) and EngineHost (connections made
// on first use, to every channel a plan may name).
class World::Rank : public Workspace, public EngineHost {
 public:
  Rank(World& w, int rank) : world_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int nranks() const override { return world_.nranks(); }
  std::byte* scratch(std::size_t bytes) override {
    if (world_.untouchedScratch_) return world_.untouchedScratch_;  // World::planOnly
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }
  const std::vector<int>& ringOrder() const override { return world_.layout_.ringOrder; }
  int ringPosition(int r) const override { return world_.layout_.ringPos[static_cast<std::size_t>(r)]; }
  const std::vector<std::vector<int>>& hosts() const override { return world_.layout_.hosts; }
  int hostIndex(int r) const override { return world_.layout_.hostOf[static_cast<std::size_t>(r)]; }

  Connection* connection(int peer) override {
    auto& c = conns_[peer];
    if (!c) {
      c = std::make_unique<SimConnection>(peer);
      for (int ch = 0; ch < kMaxChannels; ++ch)
        c->channels_.push_back(
            std::make_unique<SimChannel>(world_.stream(rank_, peer, ch), world_.stream(peer, rank_, ch), *world_.wakes_, peer));
    }
    return c.get();
  }
  Waiter& waiter() override { return sharedWaiter(); }
  Status failure() override { return Status::Ok(); }
  bool failedFast() const override { return false; }
  double timeoutSec() const override { return world_.timeoutSec_; }
  std::string remoteHostOf(int peer) const override {
    const int h = world_.layout_.hostOf[static_cast<std::size_t>(peer)];
    return h == world_.layout_.hostOf[static_cast<std::size_t>(rank_)] ? "" : "sim-h" + std::to_string(h);
  }
  // What it waited for when its deadline passed; the verdict waits until every rank has said so
  // (World::timeOutWaitingRanks), as a communicator's rank waits for the others' notices.
  Status explainTimeout(const std::string& what, const std::string& detail, bool moving) override {
    waitedFor = {what, detail};
    this->moving = moving;
    return Status::Timeout(what + ": " + detail);
  }
  std::pair<std::string, std::string> waitedFor;
  bool moving = false;

  static constexpr int kMaxChannels = 16;
  Plan plan;
  bool done = false;
  bool stopped = false;
  bool oneShot = false;
  std::uint64_t seq = 0;
  SendRecvNumbers numbers;

 private:
  World& world_;
  int rank_;
  std::vector<std::byte> scratch_;
  std::map<int, std::unique_ptr<SimConnection>> conns_;
};

// Rank r's plan in the compact form the critical path needs, and its sends in the link counts.
void World::record(int r, const Plan& plan) {
  auto& msgs = msgs_[static_cast<std::size_t>(r)];
  auto& sendsTo = sendsTo_[static_cast<std::size_t>(r)];
  msgs.assign(static_cast<std::size_t>(plan.numOps()), Msg{false, -1, 0, -1, 0, 0});
  sendsTo.clear();
  plan.forEachMessage([&](const Op& op, int index, std::size_t position) {
    msgs[static_cast<std::size_t>(index)] = {op.kind == Op::kSend, op.peer, op.channel, op.dep, position, op.after};
    if (op.kind != Op::kSend) return;
    auto& q = sendsTo[{op.peer, op.channel}];
    if (q.size() <= position) q.resize(position + 1, -1);
    q[position] = index;
    LinkCount& l = links_[{r, op.peer}];
    ++l.messages;
    l.bytes += op.bytes;
  });
}

int World::criticalPath() const {
  const std::size_t n = ranks_.size();
  const auto& msgs = msgs_;
  const auto& sendsTo = sendsTo_;
  // Depth of each message, memoized, by an explicit stack (chains are as long as 2n messages).
  std::vector<std::vector<int>> depth(n);
  for (std::size_t r = 0; r < n; ++r) depth[r].assign(msgs[r].size(), -1);
  int longest = 0;
  std::vector<std::pair<int, int>> stack;
  for (std::size_t r0 = 0; r0 < n; ++r0)
    for (std::size_t i0 = 0; i0 < msgs[r0].size(); ++i0) {
      stack.push_back({static_cast<int>(r0), static_cast<int>(i0)});
      while (!stack.empty()) {
        const auto [r, i] = stack.back();
        const Msg& m = msgs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        int& d = depth[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        if (d >= 0) {
          stack.pop_back();
          continue;
        }
        // What this message waits for: its local dependency, and for a receive, its send.
        std::pair<int, int> need[2] = {{-1, -1}, {-1, -1}};
        if (m.dep >= 0) need[0] = {r, m.dep};
        if (!m.send) {
          const auto& q = sendsTo[static_cast<std::size_t>(m.peer)].at({r, m.channel});
          need[1] = {m.peer, q.at(m.position)};
        }
        bool ready = true;
        int best = 0;
        for (int k = 0; k < m.after; ++k) {  // behind a fence: every earlier op of this rank
          const int nd = depth[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
          if (nd < 0) {
            stack.push_back({r, k});
            ready = false;
          } else {
            best = std::max(best, nd);
          }
        }
        for (int k = 0; k < 2; ++k) {
          if (need[k].first < 0) continue;
          const int nd = depth[static_cast<std::size_t>(need[k].first)][static_cast<std::size_t>(need[k].second)];
          if (nd < 0) {
            stack.push_back(need[k]);
            ready = false;
          } else {
            best = std::max(best, nd + (k == 1 ? 1 : 0));
          }
        }
        if (!ready) continue;
        d = best;
        longest = std::max(longest, d);
        stack.pop_back();
      }
    }
  return longest;
}

World::World(const Topology& t, std::size_t streamBytes)
    : layout_(layOutRanks(t.hostLabels())), streamBytes_(streamBytes), msgs_(layout_.hostOf.size()), sendsTo_(layout_.hostOf.size()),
      wakes_(std::make_unique<Wakes>()) {
  wakes_->awake.assign(layout_.hostOf.size(), 0);
  for (int r = 0; r < nranks(); ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  makeTuner(linkClassOf("shm", true), linkClassOf("tcp", false), Config{});
}

LinkClass linkClassOf(std::string_view transport, bool sameHost, const Config& config) {
  PeerInfo a, b;
  a.host = b.host = "sim-h0";
  a.bootId = b.bootId = "sim";
  if (!sameHost) b.host = "sim-h1";
  for (const auto& t : makeTransports(config))
    if (t->name() == transport) return t->linkClass(a, b);
  return LinkClass{};
}

void World::setLinks(const LinkClass& withinHosts, const LinkClass& acrossHosts, const Config& config) {
  makeTuner(withinHosts, acrossHosts, config);
}

void World::makeTuner(const LinkClass& within, const LinkClass& across, const Config& config) {
  HostShape shape = hostShape(layout_.hosts);
  shape.local = within;
  const LinkClass slowest = layout_.hosts.size() > 1 ? LinkClass::slower(within, across) : within;
  // The one-shot is a candidate only where a communicator would connect every pair at creation.
  tuner_ = Tuner(config, nranks(), config.nsocks, slowest, shape, connectsEveryPair(config, nranks()) || layout_.hosts.size() == 1);
}

Status World::runTuned(const std::vector<CollArgs>& calls, std::uint64_t seed, TunerChoice* choice) {
  const CollArgs& a = calls.front();
  const TunerChoice t = tuner_.choose(a.kind, callBytes(a, nranks()));
  if (choice) *choice = t;
  // All-to-all cuts its blocks by the channels a large call gets, as Comm::execute does.
  const bool a2a = a.kind == CollKind::kAllToAll || a.kind == CollKind::kAllToAllv;
  return run(calls, t.algo, a2a ? tuner_.choose(CollKind::kAllToAll, std::size_t{1} << 30).channels : t.channels, t.chunk, seed);
}

World::~World() = default;

World::Stream& World::stream(int from, int to, int channel) {
  auto& s = streams_[{from, to, channel}];
  if (!s) s = std::make_unique<Stream>(streamBytes_);
  return *s;
}

Status World::run(const std::vector<CollArgs>& calls, Algo algo, int channels, std::size_t chunk, std::uint64_t seed) {
  const int n = nranks();
  for (int r = 0; r < n; ++r) {
    Rank& rank = *ranks_[static_cast<std::size_t>(r)];
    const CollArgs& a = calls[static_cast<std::size_t>(r)];
    Fingerprint fp = callFingerprint(a);
    fp.seq = ++rank.seq;
    rank.plan.reset(fp, 0x5157, r, n, chunk);
    rank.oneShot = buildPlan(a, rank, algo, channels, channels, rank.plan);
    record(r, rank.plan);
  }
  return drive(&calls, seed);
}

Status World::runGroup(const std::vector<std::vector<CollArgs>>& calls, std::uint64_t seed) {
  const int n = nranks();
  for (int r = 0; r < n; ++r) {
    Rank& rank = *ranks_[static_cast<std::size_t>(r)];
    const std::vector<CollArgs>& mine = calls[static_cast<std::size_t>(r)];
    std::vector<const CollArgs*> group;
    std::vector<Fingerprint> fps;
    std::size_t largest = 0;
    for (const CollArgs& a : mine) {
      group.push_back(&a);
      fps.push_back(rank.numbers.number(a, r));
      largest = std::max(largest, a.count * dataTypeSize(a.dtype));
    }
    rank.plan.reset(fps.empty() ? Fingerprint{} : fps[0], 0x5157, r, n, tuner_.choose(CollKind::kSendRecv, largest).chunk);
    buildSendRecvGroup(group, fps, rank.plan);
    rank.oneShot = false;
    record(r, rank.plan);
  }
  return drive(nullptr, seed);
}

Status World::drive(const std::vector<CollArgs>* calls, std::uint64_t seed) {
  const int n = nranks();
  for (auto& rank : ranks_) rank->done = rank->stopped = false;
  // Each run starts on empty streams (a failed run leaves messages behind, as a failed
  // communicator does) and with only the fault's stream stalled.
  for (auto& [key, stream] : streams_) {
    stream->clear();
    stream->stalled = std::get<0>(key) == fault_.stallFrom && std::get<1>(key) == fault_.stallTo && std::get<2>(key) == fault_.stallChannel;
  }
  if (fault_.stallFrom >= 0) stream(fault_.stallFrom, fault_.stallTo, fault_.stallChannel).stalled = true;
  statuses_.assign(static_cast<std::size_t>(n), Status::Ok());
  virtualSec_ = 0;
  // The rank that stops: once its finished messages reach fault_.stopAfter.
  auto finished = [](const Plan& plan) {
    int k = 0;
    plan.forEachMessage([&](const Op& op, int, std::size_t) { k += op.complete; });
    return k;
  };
  int stopped = -1;
  if (fault_.stopRank >= 0 && fault_.stopAfter == 0) {
    stopped = fault_.stopRank;
    ranks_[static_cast<std::size_t>(stopped)]->stopped = true;
  }
  std::mt19937_64 rng(seed);
  std::vector<int> order;
  Wakes& wakes = *wakes_;
  wakes.list.clear();
  std::fill(wakes.awake.begin(), wakes.awake.end(), 0);
  for (int r = 0; r < n; ++r) wakes.wake(r);
  int left = n - (stopped >= 0);
  lastRounds_ = 0;
  while (left > 0) {
    ++lastRounds_;
    order.swap(wakes.list);
    wakes.list.clear();
    for (int r : order) wakes.awake[static_cast<std::size_t>(r)] = 0;
    std::sort(order.begin(), order.end());  // the order woken in is not the seed's
    std::shuffle(order.begin(), order.end(), rng);
    bool moved = false;
    for (int r : order) {
      Rank& rank = *ranks_[static_cast<std::size_t>(r)];
      if (rank.done || rank.stopped) continue;
      bool m = false;
      auto done = Engine::pass(rank.plan, rank, &m);
      if (!done.ok()) return statuses_[static_cast<std::size_t>(r)] = done.status();
      moved |= m;
      if (m) wakes.wake(r);
      if (r == fault_.stopRank && finished(rank.plan) >= fault_.stopAfter) {
        rank.stopped = true, stopped = r, --left;
        continue;
      }
      if (*done) {
        rank.done = true;
        --left;
        moved = true;
        if (rank.oneShot) finishOneShotAllReduce((*calls)[static_cast<std::size_t>(r)], rank);
      }
    }
    if (!moved) {
      timeOutWaitingRanks(stopped);
      for (const Status& st : statuses_)
        if (!st.ok()) return st;
    }
  }
  if (stopped >= 0) statuses_[static_cast<std::size_t>(stopped)] = Status::Timeout("rank " + std::to_string(stopped) + " was stopped");
  return Status::Ok();
}

Result<std::uint64_t> World::planOnly(const CollArgs& shape, Algo algo, int channels, std::size_t chunk, std::uint64_t maxMessages) {
  const int n = nranks();
  const std::size_t bytes = std::max(callBytes(shape, n), std::size_t{1});
  // Address space no page of which is ever touched: send and receive buffers, then room for any
  // scratch a builder asks for (at most n times the call).
  const std::size_t reserve = (static_cast<std::size_t>(n) + 4) * ((bytes + 4095) & ~std::size_t{4095});
  void* base = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    return Status::SystemError("could not reserve " + std::to_string(reserve >> 20) + " MiB of address space for the plans' buffers");
  untouched_ = static_cast<std::byte*>(base);
  untouchedScratch_ = untouched_ + 2 * ((bytes + 4095) & ~std::size_t{4095});
  CollArgs a = shape;
  a.send = untouched_;
  a.recv = untouched_ + ((bytes + 4095) & ~std::size_t{4095});
  std::uint64_t total = 0;
  Plan plan;
  // First a sample of 16 ranks spread over the world: when n times the most of them is over the
  // limit, that estimate is the answer and nothing more is built.
  std::uint64_t most = 0;
  for (int k = 0; k < std::min(n, 16); ++k) {
    const int r = static_cast<int>(static_cast<long long>(k) * (n - 1) / std::max(1, std::min(n, 16) - 1));
    plan.reset(callFingerprint(a), 0x5157, r, n, chunk);
    buildPlan(a, *ranks_[static_cast<std::size_t>(r)], algo, channels, channels, plan);
    most = std::max(most, static_cast<std::uint64_t>(plan.numOps()));
  }
  if (most * static_cast<std::uint64_t>(n) > maxMessages) total = most * static_cast<std::uint64_t>(n);
  for (int r = 0; r < n && total <= maxMessages; ++r) {
    plan.reset(callFingerprint(a), 0x5157, r, n, chunk);
    buildPlan(a, *ranks_[static_cast<std::size_t>(r)], algo, channels, channels, plan);
    total += static_cast<std::uint64_t>(plan.numOps());
    if (total <= maxMessages) record(r, plan);
  }
  munmap(base, reserve);
  untouched_ = untouchedScratch_ = nullptr;
  if (total > maxMessages) {  // unfinished: keep nothing of it
    for (auto& m : msgs_) m.clear();
    for (auto& q : sendsTo_) q.clear();
  }
  return total;
}

void World::resetCounts() {
  links_.clear();
  for (auto& m : msgs_) m.clear();
  for (auto& q : sendsTo_) q.clear();
}

// Every rank still in the call waits until its deadline (virtual time moves on by BRAID_TIMEOUT),
// says what it waited for (Engine::timedOut, as Engine::run does), and then judges with what the
// others said, as a communicator's rank does with the store's notices.
void World::timeOutWaitingRanks(int stopped) {
  virtualSec_ += timeoutSec_;
  std::map<int, std::string> said;
  std::vector<int> waiting;
  for (int r = 0; r < nranks(); ++r) {
    Rank& rank = *ranks_[static_cast<std::size_t>(r)];
    if (rank.done || rank.stopped) continue;
    rank.waitedFor = {};
    statuses_[static_cast<std::size_t>(r)] = Engine::timedOut(rank.plan, rank, false);
    said[r] = rank.waitedFor.first + "\n" + rank.waitedFor.second;
    waiting.push_back(r);
  }
  for (int r : waiting) {
    Rank& rank = *ranks_[static_cast<std::size_t>(r)];
    const TimeoutView me{r, nranks(), timeoutSec_, [&](int p) { return rank.remoteHostOf(p); }};
    statuses_[static_cast<std::size_t>(r)] = timeoutVerdict(me, rank.waitedFor.first, rank.waitedFor.second, rank.moving, said);
    rank.done = true;  // failed
  }
  if (stopped >= 0)
    statuses_[static_cast<std::size_t>(stopped)] = Status::Timeout("rank " + std::to_string(stopped) + " was stopped");
}

}  // namespace braid::sim
