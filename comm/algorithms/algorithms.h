// Algorithms turn one collective call into a Plan (comm/engine.h). One file per family:
// ring.cc (all-reduce, all-gather, reduce-scatter), hier.cc (all-reduce, all-gather and reduce-scatter
// across hosts), bruck.cc (all-gather and reduce-scatter in log2 n steps), tree.cc (double binary tree all-reduce, and the
// rooted broadcast/reduce over a binary tree or a chain, and send/recv), oneshot.cc (small all-reduce:
// everyone sends everyone its input), direct.cc (zero-copy all-reduce on braidMemAlloc memory),
// alltoall.cc (all-to-all and all-to-allv).
// Every rank builds the same message structure from the same arguments; nothing here knows which
// transport a peer uses.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/engine.h"

namespace braid {

enum class Algo { kRing, kTree, kOneShot, kHier, kBruck };
const char* algoName(Algo a);

// All-to-allv: per peer, how many elements go to it and from where in the send buffer, how many
// come from it and to where in the receive buffer (MPI_Alltoallv's four arrays, in elements).
struct AllToAllvCounts {
  std::vector<std::size_t> sendCounts, sendDispls, recvCounts, recvDispls;
  // The elements of the send (receive) buffer the call touches: max of displ + count.
  std::size_t sendExtent() const;
  std::size_t recvExtent() const;
};

struct CollArgs {
  CollKind kind;
  const void* send;
  void* recv;
  std::size_t count;  // as the user passed it
  DataType dtype;
  ReduceOp op;
  int root = -1;
  int peer = -1;          // send/recv
  bool isSend = false;    // send/recv
  int tag = 0;            // send/recv: must equal the matching call's tag (messages match in order)
  std::shared_ptr<const AllToAllvCounts> v = nullptr;  // all-to-allv (shared: queued calls keep it alive)
};

// Where an algorithm runs: this rank, how many, how many channels to spread data over, and
// persistent scratch memory (grown on demand, kept across calls).
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual std::byte* scratch(std::size_t bytes) = 0;
  // The rings' order: the rank at each position, each host's ranks at consecutive positions (so a
  // ring crosses each host boundary once per direction), and each rank's position.
  virtual const std::vector<int>& ringOrder() const = 0;
  virtual int ringPosition(int rank) const = 0;
  // Each host's ranks in rank order, hosts in the order of their lowest rank (hosts may hold
  // different numbers of ranks), and which of them holds `rank`.
  virtual const std::vector<std::vector<int>>& hosts() const = 0;
  virtual int hostIndex(int rank) const = 0;
  // The fewest and the most ranks any host holds (the hierarchical algorithms' columns and whether
  // they apply). These count the hosts; the communicator answers from what it kept at set-up.
  virtual int smallestHost() const;
  virtual int largestHost() const;
};

// The hosts and the rings' order from each rank's host label (any numbers; ranks with the same
// label share a host): hosts numbered in the order of their lowest rank, each host's ranks in rank
// order, and the rings visiting each host's ranks consecutively. What a communicator keeps at
// set-up for its Workspace (dispatch.cc), and what the simulator lays out (sim/).
struct RankLayout {
  std::vector<std::vector<int>> hosts;
  std::vector<int> hostOf, ringOrder, ringPos;
};
RankLayout layOutRanks(const std::vector<int>& hostLabelOf);

// The bytes a call moves in all: count elements, times the ranks for all-gather, reduce-scatter
// and all-to-all (whose count is per rank); for all-to-allv the elements this rank sends.
inline std::size_t callBytes(const CollArgs& a, int nranks) {
  const std::size_t es = dataTypeSize(a.dtype);
  if (a.kind == CollKind::kAllToAllv) {
    std::size_t elems = 0;
    if (a.v)
      for (std::size_t c : a.v->sendCounts) elems += c;
    return elems * es;
  }
  const std::size_t bytes = a.count * es;
  const bool perRank = a.kind == CollKind::kAllGather || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kAllToAll;
  return perRank ? bytes * static_cast<std::size_t>(nranks) : bytes;
}

// Elements [off, off+len) of part i when `total` is split into `parts` nearly equal parts.
struct Range {
  std::size_t off;
  std::size_t len;
};
inline Range split(std::size_t total, std::size_t parts, std::size_t i) {
  std::size_t base = total / parts, rem = total % parts;
  return {i * base + (i < rem ? i : rem), base + (i < rem ? 1 : 0)};
}

// Calls f(s) for each step of one phase of a ring all-reduce (ring.cc; the hierarchical one's
// ring across hosts, hier.cc) worth building at position p,
// where step s sends block p + shift - s and receives block p + shift - 1 - s: every step, or,
// below n elements a channel (split leaves blocks len.. empty, and both ends skip them), only those
// that send or receive one of the first `len` blocks, in order. At 16,384 ranks an 8-byte call
// then builds a few steps, not 32,766.
template <class F>
void forBusySteps(int n, int p, int shift, std::size_t len, bool skipping, F f) {
  if (!skipping || 2 * len >= static_cast<std::size_t>(n)) {
    for (int s = 0; s < n - 1; ++s) f(s);
    return;
  }
  thread_local std::vector<int> steps;  // (reused: building a plan allocates nothing once warm)
  steps.clear();
  for (std::size_t i = 0; i < len; ++i)
    for (int back : {0, 1}) {
      const long long k = (static_cast<long long>(p) + shift - back - static_cast<long long>(i)) % n;
      const auto s = static_cast<int>(k < 0 ? k + n : k);
      if (s < n - 1) steps.push_back(s);
    }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (int s : steps) f(s);
}

void buildRingAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// Hierarchical all-reduce, all-gather and reduce-scatter (hier.cc): within each host and across
// hosts in columns of local ranks. They apply when there are several hosts and one holds more than
// one rank (hosts of unequal size fold their extra ranks into the smallest host's columns).
bool hierApplies(const Workspace& ws);
// This rank's place in the tree of a broadcast or reduce from `root` (buildRooted): its parent (-1:
// the root) and children, hosts' leaders first. The tree spans the hosts' leaders, then each host.
struct RootedLinks {
  int parent;
  std::vector<int> children;
};
RootedLinks rootedLinks(const Workspace& ws, int root, Algo shape);
void buildHierAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// Hierarchical all-gather (hier.cc): all-gather across hosts within each column of local ranks,
// then within each host.
void buildHierAllGather(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// Hierarchical reduce-scatter (hier.cc): within each host by columns, then across hosts in each column.
void buildHierReduceScatter(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// All-to-all and all-to-allv (comm/algorithms/alltoall.cc): every rank sends its block for each
// peer straight to it, all at once, and copies its own; in place, the send side is copied first.
void buildAllToAll(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
void buildRingAllGather(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// ceil(log2 n) steps, one channel (bruck.cc).
void buildBruckAllGather(const CollArgs& a, Workspace& ws, Plan& plan);
void buildBruckReduceScatter(const CollArgs& a, Workspace& ws, Plan& plan);
void buildRingReduceScatter(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
void buildTreeAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan);
// Broadcast and reduce: `shape` kTree is a binary tree, kRing a pipelined chain.
void buildRooted(const CollArgs& a, Workspace& ws, Algo shape, int channels, Plan& plan);
void buildSendRecv(const CollArgs& a, Plan& plan);
// One-shot all-reduce (oneshot.cc): the plan exchanges inputs; finish reduces them once it has run.
void buildOneShotAllReduce(const CollArgs& a, Workspace& ws, Plan& plan);
void finishOneShotAllReduce(const CollArgs& a, Workspace& ws);

// The fingerprint of a call from its arguments (dispatch.cc): kind, type, count, and the op and
// root where they matter; the caller numbers it (seq) and, for send/recv, names the pair.
Fingerprint callFingerprint(const CollArgs& a);

// Sends and receives are numbered per peer and direction (dispatch.cc): a rank's k-th send to a
// peer meets that peer's k-th receive from it, whatever collectives or other pairs came between.
class SendRecvNumbers {
 public:
  // The call's fingerprint with the pair (root: the receiver, sender), its tag and its number.
  Fingerprint number(const CollArgs& a, int rank);

 private:
  std::map<int, std::uint64_t> sends_, recvs_;  // peer -> calls so far
};

// A group of sends and receives as one plan (dispatch.cc): the engine moves every peer's queues
// together, so the group finishes whatever order each rank posted its calls in. Each message
// carries its own call's fingerprint (fps[i]), so a peer may match a grouped send with a plain recv.
void buildSendRecvGroup(const std::vector<const CollArgs*>& calls, const std::vector<Fingerprint>& fps, Plan& plan);

// The plan of one call by `algo` (dispatch.cc): ring, tree or hier (where hierApplies, else the
// ring) for the all-reduce, all-gather and reduce-scatter, a tree or chain for broadcast and
// reduce, all-to-all over `allToAllChannels` (both ends of a pair must cut a block alike: the
// channels a large call gets, not this rank's total, which differs by rank in all-to-allv). True
// for a one-shot all-reduce, which finishOneShotAllReduce completes once the plan has run.
bool buildPlan(const CollArgs& a, Workspace& ws, Algo algo, int channels, int allToAllChannels, Plan& plan);

}  // namespace braid
