// Braid's simulator: N virtual ranks in one process, each running the real plan builders
// (comm/algorithms, through buildPlan) and the real Engine (Engine::pass), over in-memory channels,
// driven by one thread. The order in which ranks make their passes is drawn from a seed, so a
// failure replays exactly. Nothing waits on a clock: when a full round moves nothing, the run has
// deadlocked and says which ranks wait on what.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/status.hpp"
#include "comm/algorithms/algorithms.h"
#include "base/config.h"
#include "comm/engine.h"
#include "comm/tuner.h"

namespace braid::sim {

struct Wakes;  // the ranks a round passes (sim.cc)

// Hosts and their ranks: hostSizes[h] ranks on host h. Ranks are numbered host after host, or,
// with `interleave`, dealt out in turn (rank r on the (r mod H)-th host that still has room), as a
// launcher that places ranks round-robin does.
struct Topology {
  std::vector<int> hostSizes;
  bool interleave = false;
  static Topology uniform(int hosts, int perHost);
  int nranks() const;
  std::vector<int> hostLabels() const;  // per rank
  std::string describe() const;         // "2048 hosts x 8", "3 hosts (7-9 ranks)"
};

// What crossed one ordered pair of ranks: messages and payload bytes (headers and padding apart).
struct LinkCount {
  std::uint64_t messages = 0, bytes = 0;
};

// What goes wrong in the next run. Time is virtual: a round of passes in which nothing moves is
// BRAID_TIMEOUT passing for every rank still waiting, and each then fails as a communicator's rank
// would (Engine::timedOut, timeoutVerdict: the ranks that did not say they waited are named silent).
struct Fault {
  // This rank stops, as a process stopped with SIGSTOP, in the pass that finishes its
  // `stopAfter`-th message (0: before its first pass). -1: none.
  int stopRank = -1;
  int stopAfter = 0;
  // The stream from `stallFrom` to `stallTo` on `stallChannel` delivers nothing (the sender may
  // still fill it). -1: none.
  int stallFrom = -1, stallTo = -1, stallChannel = 0;
};

// What `transport` ("shm", "tcp", "ib") gives a pair of ranks on one host or on two: its own
// Transport::linkClass, as a communicator asks it.
LinkClass linkClassOf(std::string_view transport, bool sameHost, const Config& config = Config{});

class World {
 public:
  // streamBytes: what each (sender, receiver, channel) stream holds before a send must wait, as a
  // transport's staging ring does.
  explicit World(const Topology& t, std::size_t streamBytes = 64u << 10);
  ~World();
  int nranks() const { return static_cast<int>(layout_.hostOf.size()); }
  const RankLayout& layout() const { return layout_; }

  // One collective on every rank (calls[r] is rank r's), each rank's plan built by `algo` over
  // `channels` with pieces of `chunk` bytes, and run until every rank is done. The order of the
  // ranks' passes is a permutation drawn from `seed` each round. Counts each plan's messages
  // (links()). Returns the first rank's failure: when a round moves nothing (a deadlock, or a
  // Fault), BRAID_TIMEOUT passes in virtual time and every waiting rank times out as it would in
  // a communicator, naming what it waited for and the silent ranks (lastStatuses()).
  Status run(const std::vector<CollArgs>& calls, Algo algo, int channels, std::size_t chunk, std::uint64_t seed);
  // One group of sends and receives on every rank (calls[r]: rank r's, in the order it posts
  // them; none: it takes no part), numbered and planned as a communicator does
  // (SendRecvNumbers, buildSendRecvGroup) with the tuner's send/recv pieces, and run as run()
  // runs a collective.
  Status runGroup(const std::vector<std::vector<CollArgs>>& calls, std::uint64_t seed);
  // The same with what the tuner chooses (comm/tuner.cc), as every rank of a communicator would:
  // from the call's kind and bytes, the ranks' layout over hosts, and the link classes within and
  // across hosts (by default shm's and tcp's, transport/). Returns the choice through *choice.
  Status runTuned(const std::vector<CollArgs>& calls, std::uint64_t seed, TunerChoice* choice = nullptr);
  // The link classes the tuner sees within and across hosts, and the settings it tunes with
  // (BRAID_ALGO, BRAID_CHUNKSIZE, BRAID_NSOCKS); by default shm's and tcp's (linkClassOf) and
  // Config's defaults. choose(): what it picks for a call of `bytes` (callBytes).
  void setLinks(const LinkClass& withinHosts, const LinkClass& acrossHosts, const Config& config = Config{});
  const TunerChoice& choose(CollKind kind, std::size_t bytes) { return tuner_.choose(kind, bytes); }
  // The fault the next runs meet (Fault{} for none), and the BRAID_TIMEOUT their ranks have.
  void setFault(const Fault& f) { fault_ = f; }
  void setTimeoutSec(double s) { timeoutSec_ = s; }
  // Each rank's outcome of the last run (a stopped rank's says where it stopped), and the virtual
  // seconds it took (BRAID_TIMEOUT for each time the world stood still).
  const std::vector<Status>& lastStatuses() const { return statuses_; }
  double lastVirtualSec() const { return virtualSec_; }

  // Builds every rank's plan of one call (every rank's CollArgs is `shape` with buffers of its
  // own) and counts it (links(), criticalPath()) without running it: for worlds and sizes whose
  // data would not fit in memory. Buffers and scratch are address space no page of which is
  // touched: a builder only records pointers. Builds nothing more (and keeps nothing) once the
  // plans would hold more than maxMessages messages: n times the most of 16 ranks' plans, or the
  // plans built so far. Returns the messages of all plans (or that estimate, or the count when it
  // stopped), or why the address space could not be reserved.
  Result<std::uint64_t> planOnly(const CollArgs& shape, Algo algo, int channels, std::size_t chunk, std::uint64_t maxMessages);
  // Per ordered pair (sender, receiver), over every run since the last resetCounts().
  const std::map<std::pair<int, int>, LinkCount>& links() const { return links_; }
  void resetCounts();
  // Rounds of passes the last run took (a round passes each unfinished rank that may move: one
  // whose last pass moved, or whose streams got bytes or room since).
  int lastRounds() const { return lastRounds_; }
  // The last run's (or planOnly's) critical path in messages (the alpha steps of the cost model): the longest
  // chain in which each message is received before the next one is sent (a send that forwards
  // what a receive finished, Op::dep, or waits for every earlier op, Plan::fence) or a receive
  // waits for its sender. Messages queued one
  // after another on a link add no step (they go out back to back).
  int criticalPath() const;

  class Rank;   // (sim.cc)
  class Stream;

 private:
  RankLayout layout_;
  std::size_t streamBytes_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::map<std::pair<int, int>, LinkCount> links_;
  int lastRounds_ = 0;
  Fault fault_;
  double timeoutSec_ = 300;
  std::vector<Status> statuses_;
  double virtualSec_ = 0;
  // Runs the plans built until every rank is done or timed out (calls: for one-shot all-reduces).
  Status drive(const std::vector<CollArgs>* calls, std::uint64_t seed);
  // Nothing moved in a whole round: every unfinished rank's deadline passes; fills statuses_.
  void timeOutWaitingRanks(int stopped);
  Tuner tuner_;
  void makeTuner(const LinkClass& within, const LinkClass& across, const Config& config);
  // The last plans, compact: per rank its messages (by op index) and its sends per (peer,
  // channel) in order, which is how a receive finds the send it waits for.
  struct Msg {
    bool send;
    int peer, channel, dep;
    std::size_t position;
    int after;  // it waits for every op before this index (Plan::fence)
  };
  std::vector<std::vector<Msg>> msgs_;
  std::vector<std::map<std::pair<int, int>, std::vector<int>>> sendsTo_;
  void record(int r, const Plan& plan);
  std::byte* untouched_ = nullptr;         // planOnly's reserved buffers
  std::byte* untouchedScratch_ = nullptr;
  friend class Rank;
  Stream& stream(int from, int to, int channel);
  std::map<std::tuple<int, int, int>, std::unique_ptr<Stream>> streams_;
  std::unique_ptr<Wakes> wakes_;
};

}  // namespace braid::sim
