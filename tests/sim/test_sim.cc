// Braid's algorithms at scale in one process (sim/sim.h): the real plan builders and Engine
// over in-memory channels, every result checked exactly on every virtual rank against the pattern
// the other suites use (tools/pattern.h).
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sim/sim.h"
#include "tools/pattern.h"

namespace braid::sim {
namespace {

struct Case {
  CollKind kind;
  Algo algo;
  std::size_t count;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  bool inPlace = false;
  int channels = 2;
  std::size_t chunk = 4096;
  bool tuned = false;  // the tuner chooses algorithm, channels and chunk (World::runTuned)
};

std::string describe(const Case& c, const Topology& t) {
  Fingerprint f;
  f.kind = c.kind;
  f.dtype = c.dtype;
  f.op = c.op;
  f.count = c.count;
  f.root = c.kind == CollKind::kBroadcast || c.kind == CollKind::kReduce ? c.root : -1;
  return f.describe() + " by " + (c.tuned ? std::string("the tuner's choice") : algoName(c.algo)) +
         (c.inPlace ? " in place" : "") + " on " + t.describe();
}

// Runs `c` on every rank of `w` and checks every rank's output exactly. Returns "" or what failed.
std::string runAndCheck(World& w, const Case& c, std::uint64_t seed) {
  const int n = w.nranks();
  const std::size_t nn = static_cast<std::size_t>(n), es = dataTypeSize(c.dtype);
  const bool a2a = c.kind == CollKind::kAllToAll;
  const std::size_t inCount = c.kind == CollKind::kReduceScatter || a2a ? c.count * nn : c.count;
  const std::size_t outCount = c.kind == CollKind::kAllGather || a2a ? c.count * nn : c.count;
  // One allocation per rank, 1 byte past alignment: unaligned buffers, in and out of place.
  std::vector<std::vector<std::byte>> in(nn), out(nn);
  std::vector<CollArgs> calls(nn);
  for (std::size_t r = 0; r < nn; ++r) {
    out[r].assign(std::max(inCount, outCount) * es + 1, std::byte{0xee});
    std::byte* o = out[r].data() + 1;
    std::byte* i = o;
    if (!c.inPlace) {
      in[r].assign(inCount * es + 1, std::byte{0});
      i = in[r].data() + 1;
    } else if (c.kind == CollKind::kAllGather) {
      i = o + r * c.count * es;  // in place: this rank's block of the output
    }
    const int rank = static_cast<int>(r);
    if (c.kind == CollKind::kAllGather) pattern::fill(i, c.count, c.dtype, c.op, rank, r * c.count);
    else if (c.kind == CollKind::kBroadcast) { if (rank == c.root) pattern::fill(i, c.count, c.dtype, c.op, rank); }
    else pattern::fill(i, inCount, c.dtype, c.op, rank);
    CollArgs& a = calls[r];
    a.kind = c.kind;
    a.send = i;
    a.recv = c.inPlace && c.kind == CollKind::kReduceScatter ? static_cast<void*>(o + r * c.count * es) : o;
    a.count = c.count;
    a.dtype = c.dtype;
    a.op = c.op;
    a.root = c.root;
  }
  TunerChoice choice{};
  Status s = c.tuned ? w.runTuned(calls, seed, &choice) : w.run(calls, c.algo, c.channels, c.chunk, seed);
  if (!s.ok()) return s.toString() + (c.tuned ? std::string(" (the tuner chose ") + algoName(choice.algo) + ")" : "");
  for (std::size_t r = 0; r < nn; ++r) {
    const std::byte* o = static_cast<const std::byte*>(calls[r].recv);
    std::size_t wrong = 0;
    switch (c.kind) {
      case CollKind::kAllReduce: wrong = pattern::countWrong(o, c.count, c.dtype, c.op, n, 0); break;
      case CollKind::kReduceScatter: wrong = pattern::countWrong(o, c.count, c.dtype, c.op, n, r * c.count); break;
      case CollKind::kAllGather:
        for (std::size_t q = 0; q < nn; ++q)
          wrong += pattern::countWrong(o + q * c.count * es, c.count, c.dtype, c.op, n, q * c.count, static_cast<int>(q));
        break;
      case CollKind::kBroadcast: wrong = pattern::countWrong(o, c.count, c.dtype, c.op, n, 0, c.root); break;
      case CollKind::kReduce:
        if (static_cast<int>(r) == c.root) wrong = pattern::countWrong(o, c.count, c.dtype, c.op, n, 0);
        break;
      case CollKind::kAllToAll:  // block p: what rank p sent to this one
        for (std::size_t p = 0; p < nn; ++p)
          wrong += pattern::countWrong(o + p * c.count * es, c.count, c.dtype, c.op, n, r * c.count, static_cast<int>(p));
        break;
      default: break;
    }
    if (wrong) return "rank " + std::to_string(r) + ": " + std::to_string(wrong) + " wrong elements";
  }
  return "";
}

// The algorithms of each collective, all-to-all and barrier (hier applies where hosts hold several ranks; elsewhere the
// builder falls back to the ring, which is then what runs).
std::vector<Case> everyAlgorithm(std::size_t count, int n, std::size_t salt) {
  const int root = static_cast<int>(salt % static_cast<std::size_t>(n));
  const bool inPlace = salt % 2 == 1;
  const DataType t = salt % 3 == 0 ? DataType::kInt32 : salt % 3 == 1 ? DataType::kFloat32 : DataType::kBfloat16;
  const ReduceOp op = static_cast<ReduceOp>(salt % kNumReduceOps);
  std::vector<Case> v;
  for (Algo a : {Algo::kRing, Algo::kTree, Algo::kHier, Algo::kOneShot}) v.push_back({CollKind::kAllReduce, a, count, t, op, 0, inPlace});
  for (Algo a : {Algo::kRing, Algo::kHier, Algo::kBruck}) {
    v.push_back({CollKind::kAllGather, a, count, t, op, 0, inPlace});
    v.push_back({CollKind::kReduceScatter, a, count, t, op, 0, inPlace});
  }
  for (Algo a : {Algo::kTree, Algo::kRing}) {
    v.push_back({CollKind::kBroadcast, a, count, t, op, root, inPlace});
    v.push_back({CollKind::kReduce, a, count, t, op, root, inPlace});
  }
  v.push_back({CollKind::kAllToAll, Algo::kRing, count, t, op, 0, inPlace});
  v.push_back({CollKind::kBarrier, Algo::kRing, 0, t, op});
  return v;
}

// A host layout for n ranks: hosts of 4 and the rest on a last, smaller one; or, for odd n, one
// host; or hosts of 3 with ranks dealt round-robin.
Topology layoutFor(int n) {
  Topology t;
  if (n % 3 == 0) {
    t.hostSizes.assign(static_cast<std::size_t>(n / 3), 3);
    t.interleave = true;
  } else if (n % 2 == 1 && n < 16) {
    t.hostSizes = {n};
  } else {
    for (int left = n; left > 0; left -= 4) t.hostSizes.push_back(std::min(4, left));
  }
  return t;
}

TEST(Sim, EveryAlgorithmIsExactFromTwoTo64Ranks) {
  int cases = 0;
  for (int n = 2; n <= 64; ++n) {  // (one rank makes no plan: the communicator copies)
    const Topology t = layoutFor(n);
    World w(t);
    std::size_t salt = static_cast<std::size_t>(n);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, static_cast<std::size_t>(n) + 2, std::size_t{1031}})
      for (const Case& c : everyAlgorithm(count, n, salt++)) {
        const std::string err = runAndCheck(w, c, salt);
        ASSERT_EQ(err, "") << describe(c, t);
        ++cases;
      }
  }
  std::printf("%d cases exact\n", cases);
}

// Larger worlds on a sample: 1,024 ranks (128 hosts x 8) for every collective; 4,096 (512 hosts
// of 7 to 9 ranks) and 16,384 (2,048 hosts x 8) for every all-reduce algorithm, all-gather and
// reduce-scatter (log-step), broadcast, reduce and barrier, with counts small enough for 16,384
// ranks in one process. (The ring's and the hierarchical plans skip their empty blocks, so a
// small all-reduce there is a few messages a rank; their all-gather and reduce-scatter carry n-1
// blocks a rank, 268 million messages at 16,384 ranks, so the log-step ones run there.)
void runSample(const Topology& t, const std::vector<Case>& cases) {
  World w(t);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    const auto c0 = std::chrono::steady_clock::now();
    const std::string err = runAndCheck(w, c, 7);
    ASSERT_EQ(err, "") << describe(c, t);
    std::printf("  %s: %d rounds, %.2f s\n", describe(c, t).c_str(), w.lastRounds(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
  }
  std::printf("%s: %.1f s\n", t.describe().c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST(Sim, EveryCollectiveIsExactAt1024Ranks) {
  const int n = 1024;
  runSample(Topology::uniform(128, 8),
            {{CollKind::kAllReduce, Algo::kTree, 5, DataType::kFloat32, ReduceOp::kSum},
             {CollKind::kAllReduce, Algo::kHier, static_cast<std::size_t>(n) + 7, DataType::kInt32, ReduceOp::kMax},
             {CollKind::kAllReduce, Algo::kRing, 3, DataType::kFloat32, ReduceOp::kAvg, 0, true},
             {CollKind::kAllGather, Algo::kHier, 3, DataType::kInt8, ReduceOp::kSum},
             {CollKind::kReduceScatter, Algo::kHier, 2, DataType::kFloat32, ReduceOp::kSum},
             {CollKind::kBroadcast, Algo::kTree, 11, DataType::kFloat32, ReduceOp::kSum, n / 3},
             {CollKind::kReduce, Algo::kTree, 11, DataType::kInt32, ReduceOp::kSum, n - 1}});
}

TEST(Sim, EveryAllReduceAndTheLogStepGathersAreExactAt4096And16384Ranks) {
  Topology uneven;
  for (int h = 0; h < 512; ++h) uneven.hostSizes.push_back(7 + h % 3);
  const int u = uneven.nranks();  // 4,095
  runSample(uneven, {{CollKind::kAllReduce, Algo::kTree, 5, DataType::kFloat32, ReduceOp::kSum},
                     {CollKind::kAllReduce, Algo::kTree, 1, DataType::kInt32, ReduceOp::kMin, 0, true},
                     {CollKind::kAllReduce, Algo::kRing, 7, DataType::kFloat32, ReduceOp::kSum},
                     {CollKind::kAllReduce, Algo::kRing, 3, DataType::kInt32, ReduceOp::kMax, 0, true, 1},
                     {CollKind::kAllReduce, Algo::kHier, 11, DataType::kFloat32, ReduceOp::kAvg},
                     {CollKind::kAllReduce, Algo::kHier, 2, DataType::kInt32, ReduceOp::kMin, 0, true, 1},
                     {CollKind::kAllGather, Algo::kBruck, 1, DataType::kInt8, ReduceOp::kSum},
                     {CollKind::kAllGather, Algo::kBruck, 3, DataType::kInt32, ReduceOp::kSum, 0, true},
                     {CollKind::kReduceScatter, Algo::kBruck, 1, DataType::kInt32, ReduceOp::kSum},
                     {CollKind::kReduceScatter, Algo::kBruck, 2, DataType::kFloat32, ReduceOp::kAvg, 0, true},
                     {CollKind::kBroadcast, Algo::kTree, 11, DataType::kFloat32, ReduceOp::kSum, u / 3},
                     {CollKind::kReduce, Algo::kTree, 7, DataType::kInt32, ReduceOp::kSum, u - 1},
                     {CollKind::kBarrier, Algo::kTree, 0}});
  // 16,384 ranks: one count each (an all-gather's output is n elements a rank, n^2 in all).
  const int n = 16384;
  runSample(Topology::uniform(2048, 8),
            {{CollKind::kAllReduce, Algo::kTree, 5, DataType::kFloat32, ReduceOp::kSum},
             {CollKind::kAllReduce, Algo::kRing, 7, DataType::kFloat32, ReduceOp::kSum},
             {CollKind::kAllReduce, Algo::kHier, 11, DataType::kFloat32, ReduceOp::kAvg, 0, true},
             {CollKind::kAllGather, Algo::kBruck, 1, DataType::kInt8, ReduceOp::kSum, 0, true},
             {CollKind::kReduceScatter, Algo::kBruck, 1, DataType::kInt32, ReduceOp::kSum},
             {CollKind::kBroadcast, Algo::kTree, 11, DataType::kFloat32, ReduceOp::kSum, n / 3},
             {CollKind::kReduce, Algo::kTree, 7, DataType::kInt32, ReduceOp::kSum, n - 1},
             {CollKind::kBarrier, Algo::kTree, 0}});
}

// What the hierarchical all-reduce sends between hosts: 2(H-1)/H of the call's S bytes per host
// (each column's ring all-reduce moves 2(H-1)/H of its 1/L share), here where the count splits
// evenly over channels, columns and hosts.
TEST(Sim, HierarchicalAllReduceSendsTwoHMinusOneOverHOfTheDataPerHost) {
  for (auto [H, L] : {std::pair{8, 4}, {5, 3}}) {
    const Topology t = Topology::uniform(H, L);
    World w(t);
    const std::size_t count = static_cast<std::size_t>(2 * L * H * 3), bytes = count * 4;
    ASSERT_EQ(runAndCheck(w, {CollKind::kAllReduce, Algo::kHier, count, DataType::kFloat32, ReduceOp::kSum, 0, false, 2}, 3), "");
    std::vector<std::uint64_t> across(static_cast<std::size_t>(H), 0);
    for (const auto& [pair, l] : w.links()) {
      const int ha = w.layout().hostOf[static_cast<std::size_t>(pair.first)], hb = w.layout().hostOf[static_cast<std::size_t>(pair.second)];
      if (ha != hb) across[static_cast<std::size_t>(ha)] += l.bytes;
    }
    for (int h = 0; h < H; ++h)
      EXPECT_EQ(across[static_cast<std::size_t>(h)] * static_cast<std::uint64_t>(H), 2 * static_cast<std::uint64_t>(H - 1) * bytes)
          << t.describe() << ": host " << h;
  }
}

// What the tree all-reduce sends between hosts: each of its two trees (each with half the data)
// is built over the hosts' leaders, so a host sends its tree's part at most three times (up to
// its parent host, down to two child hosts): at most 3 S per host in all, whatever the ranks per
// host. (A heap over all ranks crossed a host's link on most edges: L times S for L ranks a host.)
TEST(Sim, TreeAllReduceCrossesEachHostsLinkAtMostThreeTimesItsData) {
  Topology uneven;
  for (int h = 0; h < 9; ++h) uneven.hostSizes.push_back(7 + h % 3);
  for (const Topology& t : {Topology::uniform(4, 8), Topology::uniform(16, 2), Topology::uniform(2, 8), uneven,
                            Topology{{3, 2, 3, 2}, true}}) {
    World w(t);
    const std::size_t count = 6000, bytes = count * 4;
    ASSERT_EQ(runAndCheck(w, {CollKind::kAllReduce, Algo::kTree, count, DataType::kFloat32, ReduceOp::kSum, 0, false, 2}, 3), "");
    std::vector<std::uint64_t> across(w.layout().hosts.size(), 0);
    for (const auto& [pair, l] : w.links()) {
      const int ha = w.layout().hostOf[static_cast<std::size_t>(pair.first)], hb = w.layout().hostOf[static_cast<std::size_t>(pair.second)];
      if (ha != hb) across[static_cast<std::size_t>(ha)] += l.bytes;
    }
    for (std::size_t h = 0; h < across.size(); ++h) EXPECT_LE(across[h], 3 * bytes) << t.describe() << ": host " << h;
  }
}

// What the tuner chooses, for every collective over sizes from 0 to 1 MiB a rank, on one host,
// across hosts of equal and unequal size, and one rank a host (shm within hosts, tcp across),
// with barrier and all-to-all: exact on every rank.
TEST(Sim, TheTunersChoicesAreExact) {
  int cases = 0;
  for (const Topology& t : {Topology::uniform(1, 8), Topology::uniform(4, 4), Topology{{4, 4, 3}, false},
                            Topology::uniform(16, 4), Topology::uniform(12, 1), Topology{{3, 2, 3, 2}, true}}) {
    World w(t);
    const std::size_t n = static_cast<std::size_t>(w.nranks());
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{65536}, std::size_t{262147}})
      for (CollKind k : {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter, CollKind::kBroadcast,
                         CollKind::kReduce, CollKind::kAllToAll, CollKind::kBarrier}) {
        const bool perRank = k == CollKind::kAllGather || k == CollKind::kReduceScatter || k == CollKind::kAllToAll;
        Case c{k, Algo::kRing, k == CollKind::kBarrier ? 0 : perRank ? count / n : count, DataType::kFloat32,
               count % 3 == 0 ? ReduceOp::kSum : ReduceOp::kMax, static_cast<int>(count % n), count == 1000};
        c.tuned = true;
        ASSERT_EQ(runAndCheck(w, c, count + static_cast<std::size_t>(k)), "") << describe(c, t);
        ++cases;
      }
  }
  std::printf("%d cases exact\n", cases);
}

// The plans' critical paths in messages (World::criticalPath), against the alpha terms of the
// tuner's cost model (comm/tuner.cc), on H hosts of L ranks (n = HL). Equal: ring all-reduce
// 2(n-1), ring all-gather and reduce-scatter n-1, hierarchical all-reduce 2(L-1) + 2(H-1) and
// all-gather and reduce-scatter (L-1) + (H-1), one-shot 1, the log-step all-gather and
// reduce-scatter ceil(log2 n), and on one host the chain n-1. Where
// they differ the model is the upper bound: the double binary tree is 2 floor(log2 n) deep, the
// model says 2 ceil(log2 n); across hosts both trees are built over hosts first, so 2 (floor(log2 H)
// + floor(log2 L)); a broadcast or reduce crosses the hosts' leaders first and then each
// host at once, so its chain is (H-1) + (L-1) and its tree floor(log2 H) + floor(log2 L) deep
// where the model counts n-1 and ceil(log2 n) (docs/architecture/algorithms.md).
TEST(Sim, CriticalPathsMatchTheTunersAlphaTerms) {
  auto log2floor = [](int x) { int k = 0; while ((2 << k) <= x) ++k; return k; };
  auto log2ceil = [](int x) { int k = 0; while ((1 << k) < x) ++k; return k; };
  for (auto [H, L] : {std::pair{1, 8}, {1, 5}, {8, 1}, {4, 4}, {16, 4}, {3, 8}, {32, 2}, {5, 3}, {3, 3}, {6, 5}}) {
    const Topology t = Topology::uniform(H, L);
    World w(t);
    const int n = H * L;
    auto path = [&](CollKind k, Algo a) {
      EXPECT_EQ(runAndCheck(w, {k, a, 1000}, 5), "") << algoName(a);
      return w.criticalPath();
    };
    const std::string at = t.describe();
    EXPECT_EQ(path(CollKind::kAllReduce, Algo::kRing), 2 * (n - 1)) << at;
    EXPECT_EQ(path(CollKind::kAllGather, Algo::kRing), n - 1) << at;
    EXPECT_EQ(path(CollKind::kReduceScatter, Algo::kRing), n - 1) << at;
    EXPECT_EQ(path(CollKind::kAllReduce, Algo::kOneShot), 1) << at;
    EXPECT_EQ(path(CollKind::kAllGather, Algo::kBruck), log2ceil(n)) << at;  // one step each, behind its fence
    EXPECT_EQ(path(CollKind::kReduceScatter, Algo::kBruck), log2ceil(n)) << at;
    const int tree = path(CollKind::kAllReduce, Algo::kTree);
    EXPECT_EQ(tree, H > 1 && L > 1 ? 2 * (log2floor(H) + log2floor(L)) : 2 * log2floor(n)) << at;
    EXPECT_LE(tree, 2 * log2ceil(n)) << at;
    if (H > 1 && L > 1) {  // (else the hierarchical builders run the ring)
      EXPECT_EQ(path(CollKind::kAllReduce, Algo::kHier), 2 * (L - 1) + 2 * (H - 1)) << at;
      EXPECT_EQ(path(CollKind::kAllGather, Algo::kHier), (L - 1) + (H - 1)) << at;
      EXPECT_EQ(path(CollKind::kReduceScatter, Algo::kHier), (L - 1) + (H - 1)) << at;
    }
    for (CollKind k : {CollKind::kBroadcast, CollKind::kReduce}) {
      const int chain = path(k, Algo::kRing), rooted = path(k, Algo::kTree);
      EXPECT_EQ(chain, H > 1 ? (H - 1) + (L - 1) : n - 1) << at;
      EXPECT_LE(chain, n - 1) << at;
      EXPECT_EQ(rooted, log2floor(H) + log2floor(L)) << at;
      EXPECT_LE(rooted, log2ceil(n)) << at;
    }
  }
}

// Faults, in virtual time (World::setFault): a rank that stops (as with SIGSTOP) partway into a
// call is named silent by every other rank, through the communicator's own path (Engine::timedOut,
// timeoutVerdict), for the ring, tree and hierarchical all-reduce, the ring all-gather and the
// barrier, at 64 and 1,024 ranks. The simulated BRAID_TIMEOUT (300 s) passes without a real wait.
TEST(Sim, AStoppedRankIsNamedSilentByEveryOtherRank) {
  for (const Topology& t : {Topology::uniform(16, 4), Topology::uniform(128, 8)}) {
    World w(t);
    const int n = w.nranks(), stop = n / 2 + 5;
    std::vector<Case> cases = {{CollKind::kAllReduce, Algo::kTree, 100},
                               {CollKind::kAllReduce, Algo::kRing, 1000},
                               {CollKind::kAllGather, Algo::kRing, 7},
                               {CollKind::kBarrier, Algo::kTree, 0}};
    if (n <= 64) cases.push_back({CollKind::kAllReduce, Algo::kHier, 1000});
    const std::string stopHost = "sim-h" + std::to_string(w.layout().hostOf[static_cast<std::size_t>(stop)]);
    // A tree's leaf that stops after its sends has given all the others need; the ring and the
    // hierarchical plans forward through every rank.
    for (int after : {0, 2})
      for (const Case& c : cases) {
        if (after > 0 && c.algo == Algo::kTree) continue;
        w.setFault({stop, after});
        const auto t0 = std::chrono::steady_clock::now();
        const std::string err = runAndCheck(w, c, 11);
        const double real = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string at = describe(c, t) + ", rank " + std::to_string(stop) + " stopped after " + std::to_string(after) + " messages";
        ASSERT_NE(err, "") << at;
        EXPECT_EQ(w.lastVirtualSec(), 300) << at;
        EXPECT_LT(real, 60) << at;
        // Every rank still in the call names the stopped rank silent; the only others it may name
        // are ranks that finished the call (they are outside it, as far as anyone can tell).
        std::set<int> finished;
        for (int r = 0; r < n; ++r)
          if (r != stop && w.lastStatuses()[static_cast<std::size_t>(r)].ok()) finished.insert(r);
        if (after == 0) { EXPECT_TRUE(finished.empty()) << at; }
        for (int r = 0; r < n; ++r) {
          const Status& st = w.lastStatuses()[static_cast<std::size_t>(r)];
          if (r == stop || st.ok()) continue;
          ASSERT_EQ(st.code(), Code::kTimeout) << at << ": rank " << r << ": " << st.toString();
          const std::string& m = st.message();
          const std::size_t from = m.find("timed out after 300 s: "), to = m.find(" silent (");
          ASSERT_TRUE(from != std::string::npos && to != std::string::npos) << at << ": rank " << r << ": " << st.toString();
          std::set<int> silent;
          const std::string list = m.substr(from, to - from);
          for (std::size_t at = list.find("rank "); at != std::string::npos; at = list.find("rank ", at + 5))
            if (at + 5 < list.size() && std::isdigit(static_cast<unsigned char>(list[at + 5]))) silent.insert(std::stoi(list.substr(at + 5)));
          ASSERT_TRUE(silent.count(stop)) << at << ": rank " << r << ": " << st.toString();
          silent.erase(stop);
          for (int q : silent) ASSERT_TRUE(finished.count(q)) << at << ": rank " << r << " names rank " << q << ": " << st.toString();
          const bool sameHost = w.layout().hostOf[static_cast<std::size_t>(r)] == w.layout().hostOf[static_cast<std::size_t>(stop)];
          if (!sameHost) { ASSERT_NE(list.find("rank " + std::to_string(stop) + " (host " + stopHost + ")"), std::string::npos) << st.toString(); }
        }
      }
  }
  World w(Topology::uniform(4, 4));  // and without the fault, the same world runs exact again
  w.setFault({});
  ASSERT_EQ(runAndCheck(w, {CollKind::kAllReduce, Algo::kRing, 1000}, 1), "");
}

// A channel that stalls (its stream delivers nothing): every rank times out and none is named
// silent; the rank behind the stall names the peer and channel it waits on.
TEST(Sim, AStalledChannelIsNamedByTheRankWaitingOnIt) {
  World w(Topology::uniform(4, 4));
  const std::vector<int>& ring = w.layout().ringOrder;
  const int from = ring[5], to = ring[6];
  w.setFault({-1, 0, from, to, 1});
  ASSERT_NE(runAndCheck(w, {CollKind::kAllReduce, Algo::kRing, 1000}, 2), "");
  const std::string named = "rank " + std::to_string(to) + " waited to receive from rank " + std::to_string(from) + " (sim, channel 1";
  for (int r = 0; r < w.nranks(); ++r) {
    const Status& st = w.lastStatuses()[static_cast<std::size_t>(r)];
    EXPECT_EQ(st.code(), Code::kTimeout) << "rank " << r << ": " << st.toString();
    EXPECT_EQ(st.message().find(" silent ("), std::string::npos) << "rank " << r << ": " << st.toString();
    if (r == to) { EXPECT_NE(st.message().find(named), std::string::npos) << st.toString(); }
  }
}

// Groups of sends and receives (World::runGroup: the communicator's own numbering and group plan),
// each rank posting its calls in an order drawn from the seed: shifts by 1, n/2 and n-1 with two
// messages to the same peer, a random permutation, every rank sending to rank 0, and every pair
// both ways. Counts differ per pair (0, primes, 1,031); every receive exact and nothing written
// past it.
struct P2p {
  int from, to;
  std::size_t count;
};

std::string runPairs(World& w, const std::vector<P2p>& msgs, std::uint64_t seed) {
  const std::size_t n = static_cast<std::size_t>(w.nranks());
  std::vector<std::vector<CollArgs>> calls(n);
  std::vector<std::vector<std::int32_t>> sendBufs(msgs.size()), recvBufs(msgs.size());
  auto value = [](const P2p& m, std::size_t i, std::size_t k) {
    return static_cast<std::int32_t>(m.from * 7919 + m.to * 131 + static_cast<int>(i % 1000) * 3 + static_cast<int>(k % 97));
  };
  for (std::size_t k = 0; k < msgs.size(); ++k) {
    const P2p& m = msgs[k];
    sendBufs[k].resize(m.count);
    for (std::size_t i = 0; i < m.count; ++i) sendBufs[k][i] = value(m, i, k);
    recvBufs[k].assign(m.count + 1, -1);  // one guard element past the end
    CollArgs s{CollKind::kSendRecv, sendBufs[k].data(), nullptr, m.count, DataType::kInt32, ReduceOp::kSum};
    s.peer = m.to, s.isSend = true;
    CollArgs r{CollKind::kSendRecv, nullptr, recvBufs[k].data(), m.count, DataType::kInt32, ReduceOp::kSum};
    r.peer = m.from;
    calls[static_cast<std::size_t>(m.from)].push_back(s);
    calls[static_cast<std::size_t>(m.to)].push_back(r);
  }
  // Each rank posts its calls in its own order; messages to one peer keep theirs (they match in order).
  std::mt19937_64 rng(seed);
  for (auto& mine : calls) {
    std::vector<CollArgs> shuffled;
    std::map<std::pair<int, bool>, std::vector<CollArgs>> byPeer;
    for (const CollArgs& c : mine) byPeer[{c.peer, c.isSend}].push_back(c);
    std::vector<std::pair<int, bool>> keys;
    for (const auto& [key, list] : byPeer)
      for (std::size_t i = 0; i < list.size(); ++i) keys.push_back(key);
    std::shuffle(keys.begin(), keys.end(), rng);
    std::map<std::pair<int, bool>, std::size_t> next;
    for (const auto& key : keys) shuffled.push_back(byPeer[key][next[key]++]);
    mine = shuffled;
  }
  Status st = w.runGroup(calls, seed);
  if (!st.ok()) return st.toString();
  for (std::size_t k = 0; k < msgs.size(); ++k) {
    for (std::size_t i = 0; i < msgs[k].count; ++i)
      if (recvBufs[k][i] != value(msgs[k], i, k))
        return "message " + std::to_string(k) + " (rank " + std::to_string(msgs[k].from) + " to " + std::to_string(msgs[k].to) +
               "): element " + std::to_string(i) + " wrong";
    if (recvBufs[k][msgs[k].count] != -1) return "message " + std::to_string(k) + ": written past its end";
  }
  return "";
}

TEST(Sim, SendRecvGroupsAreExact) {
  int groups = 0;
  for (const Topology& t : {Topology::uniform(4, 4), Topology{{3, 2, 3, 2}, true}, Topology::uniform(1, 7), Topology::uniform(128, 8)}) {
    World w(t);
    const int n = w.nranks();
    auto count = [](int from, int to) { return static_cast<std::size_t>((from * 7 + to * 3) % 13 == 5 ? 1031 : (from * 7 + to * 3) % 13); };
    std::vector<std::vector<P2p>> patterns;
    for (int k : {1, n / 2, n - 1}) {
      std::vector<P2p> shift;
      for (int r = 0; r < n; ++r)
        for (int twice = 0; twice < 2; ++twice) shift.push_back({r, (r + k) % n, count(r, twice)});
      patterns.push_back(shift);
    }
    std::vector<int> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(static_cast<std::uint64_t>(n)));
    std::vector<P2p> permuted, gather, everyPair;
    for (int r = 0; r < n; ++r) {
      if (perm[static_cast<std::size_t>(r)] != r) permuted.push_back({r, perm[static_cast<std::size_t>(r)], count(r, 1)});
      if (r != 0) gather.push_back({r, 0, count(r, 0)});
      for (int q = 0; q < n && n <= 16; ++q)
        if (q != r) everyPair.push_back({r, q, count(r, q)});
    }
    patterns.push_back(permuted);
    patterns.push_back(gather);
    if (!everyPair.empty()) patterns.push_back(everyPair);
    for (std::size_t p = 0; p < patterns.size(); ++p) {
      ASSERT_EQ(runPairs(w, patterns[p], p + 1), "") << t.describe() << ", pattern " << p;
      ++groups;
    }
  }
  std::printf("%d groups exact\n", groups);
}

// A send and its receive that disagree on the count fail the receiving rank with both calls
// named (the engine's header check), and a receive nobody sends to times out in virtual time
// naming the peer it waits for; the world then runs exact groups again.
TEST(Sim, MismatchedAndUnmatchedSendRecvAreNamed) {
  World w(Topology::uniform(2, 4));
  std::vector<std::vector<CollArgs>> calls(8);
  std::vector<std::int32_t> out(6, 1), in(6, 0);
  CollArgs s{CollKind::kSendRecv, out.data(), nullptr, 5, DataType::kInt32, ReduceOp::kSum};
  s.peer = 6, s.isSend = true;
  CollArgs r{CollKind::kSendRecv, nullptr, in.data(), 6, DataType::kInt32, ReduceOp::kSum};
  r.peer = 1;
  calls[1].push_back(s);
  calls[6].push_back(r);
  EXPECT_NE(w.runGroup(calls, 1).toString(), "");
  const Status& bad = w.lastStatuses()[6];
  EXPECT_EQ(bad.code(), Code::kInvalidUsage) << bad.toString();
  EXPECT_NE(bad.message().find("count=5"), std::string::npos) << bad.toString();
  EXPECT_NE(bad.message().find("count=6"), std::string::npos) << bad.toString();

  World w2(Topology::uniform(2, 4));
  std::vector<std::vector<CollArgs>> lonely(8);
  r.peer = 5;
  lonely[3].push_back(r);
  EXPECT_FALSE(w2.runGroup(lonely, 2).ok());
  const Status& waited = w2.lastStatuses()[3];
  EXPECT_EQ(waited.code(), Code::kTimeout) << waited.toString();
  EXPECT_NE(waited.message().find("rank 3 waited to receive from rank 5 (sim, channel 0, host sim-h1)"), std::string::npos)
      << waited.toString();
  EXPECT_EQ(runPairs(w2, {{0, 7, 13}, {7, 0, 0}, {3, 5, 1031}}, 3), "");
}

}  // namespace
}  // namespace braid::sim
