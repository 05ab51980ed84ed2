// Randomized reliability trials over real processes, shm and tcp:
//  - Mismatch: ranks run a few agreed collectives, then one rank's call differs in one field
//    (collective, dtype, count, op, root) or that rank skips a call. Every rank must end with an
//    error that names both calls; none may hang or accept a wrong result.
//  - Kill: a rank is SIGKILLed at a random moment of a loop of mixed collectives. Every survivor must
//    return a remote error naming the dead rank, the collective and its sequence number within 10 s;
//    no hang, no crash, nothing left in /dev/shm.
// The seed is printed; STRESS_SEED=<n> repeats a run. STRESS_TRIALS=<n> sets the number of trials of
// each test (default 30 mismatch trials and 10 kill trials; the long run uses 200 kill trials).
// These two variables belong to this test only; Braid itself never reads them.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "comm/communicator.h"
#include "base/config.h"
#include "tests/common/harness.h"

namespace braid::test {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

int trialsOr(int fallback) {
  const char* v = environmentValue("STRESS_TRIALS");
  return v && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

std::uint64_t seedFor(const char* test) {
  const char* v = environmentValue("STRESS_SEED");
  std::uint64_t seed = v ? std::strtoull(v, nullptr, 10) : static_cast<std::uint64_t>(std::random_device{}()) ^
                                                               static_cast<std::uint64_t>(now() * 1e6);
  std::fprintf(stderr, "%s: seed %llu (STRESS_SEED=%llu repeats this run)\n", test,
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

std::set<std::string> shmEntries() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("braid-", 0) == 0) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// ------------------------------------------------------------------ calls and their data

enum Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kBarrier, kNumKinds };
const char* kKindNames[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "barrier"};
const braidDataType_t kTypes[] = {braidInt8, braidInt32, braidFloat32, braidFloat64};
const char* kTypeNames[] = {"int8", "int32", "float32", "float64"};
const braidRedOp_t kOps[] = {braidSum, braidMax, braidMin};
const char* kOpNames[] = {"sum", "max", "min"};

struct Call {
  int kind = kAllReduce;
  int type = 0;  // index into kTypes
  std::size_t count = 1;
  int op = 0;    // index into kOps
  int root = 0;
  int data = 0;  // which data the call carries (its position in the agreed sequence)

  bool reduces() const { return kind == kAllReduce || kind == kReduceScatter || kind == kReduce; }
  bool rooted() const { return kind == kBroadcast || kind == kReduce; }
  // As comm/fingerprint.cc describes a call in its errors.
  std::string describe() const {
    if (kind == kBarrier) return "barrier()";
    std::string s = std::string(kKindNames[kind]) + "(count=" + std::to_string(count) + ", " + kTypeNames[type];
    if (reduces()) s += std::string(", ") + kOpNames[op];
    if (rooted()) s += ", root=" + std::to_string(root);
    return s + ")";
  }
  bool sameAs(const Call& o) const { return describe() == o.describe(); }
};

std::size_t typeSize(int type) { return type == 0 ? 1 : type == 3 ? 8 : 4; }

// Small integers, exact in every type and in every sum of up to 8 ranks (<= 8 * 7 fits int8).
double value(int rank, int data, std::size_t i) { return static_cast<double>((rank * 3 + data * 5 + i) % 7 + 1); }

void store(int type, std::vector<std::byte>& buf, std::size_t i, double v) {
  std::byte* p = buf.data() + i * typeSize(type);
  switch (type) {
    case 0: { auto x = static_cast<std::int8_t>(v); std::memcpy(p, &x, 1); break; }
    case 1: { auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); break; }
    case 2: { auto x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    default: std::memcpy(p, &v, 8);
  }
}

double load(int type, const std::vector<std::byte>& buf, std::size_t i) {
  const std::byte* p = buf.data() + i * typeSize(type);
  switch (type) {
    case 0: { std::int8_t x; std::memcpy(&x, p, 1); return x; }
    case 1: { std::int32_t x; std::memcpy(&x, p, 4); return x; }
    case 2: { float x; std::memcpy(&x, p, 4); return x; }
    default: { double x; std::memcpy(&x, p, 8); return x; }
  }
}

double combine(int op, int n, int data, std::size_t i) {
  double acc = value(0, data, i);
  for (int q = 1; q < n; ++q) {
    double v = value(q, data, i);
    acc = op == 0 ? acc + v : op == 1 ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

// Runs `c` on this rank as if every rank made the same call. On success, checks the result; a wrong
// one is reported in *wrong.
braidResult_t runCall(const Call& c, int rank, int n, braidComm_t comm, std::string* wrong) {
  const std::size_t es = typeSize(c.type);
  const std::size_t sendElems = c.kind == kReduceScatter ? c.count * n : c.count;
  const std::size_t recvElems = c.kind == kAllGather ? c.count * n : c.count;
  std::vector<std::byte> send(sendElems * es), recv(recvElems * es);
  for (std::size_t i = 0; i < sendElems; ++i) store(c.type, send, i, value(rank, c.data, i));
  const braidDataType_t t = kTypes[c.type];
  const braidRedOp_t op = kOps[c.op];
  braidResult_t r = braidSuccess;
  switch (c.kind) {
    case kAllReduce: r = braidAllReduce(send.data(), recv.data(), c.count, t, op, comm, nullptr); break;
    case kAllGather: r = braidAllGather(send.data(), recv.data(), c.count, t, comm, nullptr); break;
    case kReduceScatter: r = braidReduceScatter(send.data(), recv.data(), c.count, t, op, comm, nullptr); break;
    case kBroadcast: r = braidBroadcast(send.data(), recv.data(), c.count, t, c.root, comm, nullptr); break;
    case kReduce: r = braidReduce(send.data(), recv.data(), c.count, t, op, c.root, comm, nullptr); break;
    default: r = braidBarrier(comm);
  }
  if (r != braidSuccess) return r;
  for (std::size_t i = 0; i < recvElems && wrong->empty(); ++i) {
    double want = 0;
    switch (c.kind) {
      case kAllReduce: want = combine(c.op, n, c.data, i); break;
      case kAllGather: want = value(static_cast<int>(i / c.count), c.data, i % c.count); break;
      case kReduceScatter: want = combine(c.op, n, c.data, rank * c.count + i); break;
      case kBroadcast: want = value(c.root, c.data, i); break;
      case kReduce: if (rank != c.root) return r; want = combine(c.op, n, c.data, i); break;
      default: return r;
    }
    double got = load(c.type, recv, i);
    if (got != want)
      *wrong = c.describe() + " returned success with element " + std::to_string(i) + " = " + std::to_string(got) +
               " instead of " + std::to_string(want);
  }
  return r;
}

Call randomCall(std::mt19937_64& rng, int n, int data) {
  Call c;
  c.kind = static_cast<int>(rng() % kNumKinds);
  c.type = static_cast<int>(rng() % 4);
  c.count = 1 + rng() % 3000;
  c.op = static_cast<int>(rng() % 3);
  c.root = static_cast<int>(rng() % static_cast<std::uint64_t>(n));
  c.data = data;
  if (!c.reduces()) c.op = 0;
  if (!c.rooted()) c.root = 0;
  if (c.kind == kBarrier) { c.type = 0; c.count = 0; }
  return c;
}

// ------------------------------------------------------------------ mismatch trials

enum Divergence { kChangeKind, kChangeType, kChangeCount, kChangeOp, kChangeRoot, kSkip, kNumDivergences };
const char* kDivergenceNames[] = {"collective", "dtype", "count", "op", "root", "skipped call"};

struct MismatchTrial {
  std::string transport, algo;
  int n = 2, odd = 0, at = 0;  // `odd` is the rank that differs, in call number `at` (0-based)
  Divergence how = kChangeKind;
  std::vector<Call> agreed;    // what every other rank calls
  Call changed;                // what `odd` calls instead of agreed[at] (unused for kSkip)
};

MismatchTrial makeMismatch(std::mt19937_64& rng, int trial) {
  MismatchTrial t;
  t.transport = trial % 2 ? "tcp" : "shm";
  const char* algos[] = {"auto", "ring", "tree"};
  t.algo = algos[rng() % 3];
  t.n = 2 + static_cast<int>(rng() % 4);  // 2..5
  t.odd = static_cast<int>(rng() % static_cast<std::uint64_t>(t.n));
  t.how = static_cast<Divergence>(rng() % kNumDivergences);
  t.at = 1 + static_cast<int>(rng() % 3);
  // Agreed calls, each different from the one before (so that a skipped call shows as a mismatch
  // and not as a silently shifted sequence, which no library could tell from a correct one).
  const int total = t.at + 3;
  for (int i = 0; i < total; ++i) {
    Call c;
    do c = randomCall(rng, t.n, i); while (i > 0 && c.sameAs(t.agreed.back()));
    t.agreed.push_back(c);
  }
  // The last call is an all-reduce: every rank receives in it, so no rank can finish the trial
  // without having heard of the failure.
  t.agreed.back().kind = kAllReduce;
  t.agreed.back().root = 0;
  if (t.agreed.back().sameAs(t.agreed[t.agreed.size() - 2])) t.agreed.back().count += 1;
  Call& base = t.agreed[static_cast<std::size_t>(t.at)];
  // Make the divergent field applicable to the call it changes.
  if (t.how == kChangeOp && !base.reduces()) { base.kind = kAllReduce; base.root = 0; if (base.count == 0) base.count = 7; }
  if (t.how == kChangeRoot && (!base.rooted() || t.n < 2)) { base.kind = kBroadcast; base.op = 0; if (base.count == 0) base.count = 7; }
  if ((t.how == kChangeType || t.how == kChangeCount) && base.kind == kBarrier) { base.kind = kAllGather; base.count = 5; }
  for (std::size_t i = 1; i < t.agreed.size(); ++i)  // edits above must keep neighbours different
    if (t.agreed[i].sameAs(t.agreed[i - 1])) t.agreed[i].count += 1;
  Call c = base;
  switch (t.how) {
    case kChangeKind: {
      int k;
      do k = static_cast<int>(rng() % kNumKinds); while (k == base.kind);
      c.kind = k;
      if (!c.reduces()) c.op = 0;
      if (!c.rooted()) c.root = 0;
      if (k == kBarrier) { c.type = 0; c.count = 0; }
      else if (c.count == 0) c.count = 5;
      break;
    }
    case kChangeType: c.type = (c.type + 1 + static_cast<int>(rng() % 3)) % 4; break;
    case kChangeCount: c.count = c.count + 1 + rng() % 100; break;
    case kChangeOp: c.op = (c.op + 1 + static_cast<int>(rng() % 2)) % 3; break;
    case kChangeRoot: c.root = (c.root + 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(t.n - 1))) % t.n; break;
    default: break;
  }
  t.changed = c;
  return t;
}

std::vector<Call> callsOf(const MismatchTrial& t, int rank) {
  std::vector<Call> mine = t.agreed;
  if (rank == t.odd) {
    if (t.how == kSkip) mine.erase(mine.begin() + t.at);
    else mine[static_cast<std::size_t>(t.at)] = t.changed;
  }
  return mine;
}

// Checks "rank A called X as #i but rank B called Y as #j": both are calls those ranks really made
// as their i-th and j-th, and they differ. Which two calls meet first depends on timing (a rank that
// only sends may finish its call and meet the mismatch one call later), so any true pair counts.
// Finds "rank A called X as #i but rank B called Y as #j: every rank" in msg (X and Y end at the
// first " as #" after them). A hand-written matcher: GCC 12's std::regex trips -Wmaybe-uninitialized
// in sanitizer builds.
bool findPair(const std::string& msg, int ranks[2], std::string calls[2], int seqs[2]) {
  auto number = [&](std::size_t& at, int* out) {
    std::size_t end = at;
    while (end < msg.size() && std::isdigit(static_cast<unsigned char>(msg[end]))) ++end;
    if (end == at || end - at > 9) return false;
    *out = std::stoi(msg.substr(at, end - at));
    at = end;
    return true;
  };
  auto literal = [&](std::size_t& at, const char* text) {
    if (msg.compare(at, std::strlen(text), text) != 0) return false;
    at += std::strlen(text);
    return true;
  };
  auto call = [&](std::size_t& at, std::string* out) {
    std::size_t end = msg.find(" as #", at);
    if (end == std::string::npos || end == at) return false;
    *out = msg.substr(at, end - at);
    at = end + 5;
    return true;
  };
  for (std::size_t start = msg.find("rank "); start != std::string::npos; start = msg.find("rank ", start + 1)) {
    std::size_t at = start + 5;
    if (number(at, &ranks[0]) && literal(at, " called ") && call(at, &calls[0]) && number(at, &seqs[0]) &&
        literal(at, " but rank ") && number(at, &ranks[1]) && literal(at, " called ") && call(at, &calls[1]) &&
        number(at, &seqs[1]) && literal(at, ": every rank"))
      return true;
  }
  return false;
}

std::string checkNamesBothCalls(const MismatchTrial& t, const std::string& msg) {
  int ranks[2], seqs[2];
  std::string calls[2];
  if (!findPair(msg, ranks, calls, seqs)) return "the error does not name two calls";
  for (int k = 0; k < 2; ++k) {
    if (ranks[k] < 0 || ranks[k] >= t.n) return "names a rank that does not exist";
    std::vector<Call> theirs = callsOf(t, ranks[k]);
    if (seqs[k] < 1 || seqs[k] > static_cast<int>(theirs.size()) ||
        theirs[static_cast<std::size_t>(seqs[k] - 1)].describe() != calls[k])
      return "rank " + std::to_string(ranks[k]) + " did not call " + calls[k] + " as #" + std::to_string(seqs[k]);
  }
  if (calls[0] == calls[1] && seqs[0] == seqs[1]) return "the two calls it names are the same";
  return "";
}

// Exit codes of a rank besides 0 (a call failed with the promised error).
constexpr int kFoundAtDestroy = 30;  // every call succeeded; destroy reported the mismatch
constexpr int kCleanExit = 31;       // every call succeeded (with right results) and so did destroy

// Returns 0 when a call of this rank failed with the error the library promises.
int mismatchRank(const MismatchTrial& t, int rank, braidComm_t comm) {
  std::vector<Call> mine = callsOf(t, rank);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    std::string wrong;
    braidResult_t r = runCall(mine[i], rank, t.n, comm, &wrong);
    if (!wrong.empty()) { report(rank, "silently wrong: " + wrong); return 20; }
    if (r == braidSuccess) continue;
    std::string msg = braidGetLastError(comm);
    if (r != braidInvalidUsage) {
      report(rank, std::string("expected invalid usage, got ") + braidGetErrorString(r) + ": " + msg);
      return 11;
    }
    std::string why = checkNamesBothCalls(t, msg);
    if (!why.empty()) { report(rank, why + ": " + msg); return 12; }
    // A rank that lags may learn of it before it even reaches the mismatched call (the others finished
    // its previous call without it); that is fine as long as the error names the two calls.
    return 0;
  }
  // Every call succeeded with the right result: possible when the mismatched messages sit in
  // channels that no later call of this rank reads (two ranks that disagree on a reduce's root and
  // both only send). Destroy must then fail: a rank that holds such a message reports it, and the
  // others learn it in destroy's farewell exchange.
  braidResult_t d = braidCommDestroy(comm);
  if (d == braidSuccess) return -kCleanExit;
  std::string msg = braidGetLastError(comm);
  std::string why = d == braidInvalidUsage ? checkNamesBothCalls(t, msg) : "expected invalid usage";
  if (!why.empty()) { report(rank, "destroy: " + why + ": " + msg); return -14; }
  return -kFoundAtDestroy;
}

TEST(Stress, RandomMismatchesFailOnEveryRankNamingBothCalls) {
  const int trials = trialsOr(30);
  std::mt19937_64 rng(seedFor("Stress.RandomMismatches"));
  int hangs = 0, bad = 0, atTimeout = 0, atDestroy = 0, cleanRanks = 0;
  double worst = 0;
  for (int trial = 0; trial < trials; ++trial) {
    MismatchTrial t = makeMismatch(rng, trial);
    Env env = transportEnv(t.transport);
    // Short: when no rank reads the other's header (each waits on a channel the other never
    // writes), the mismatch surfaces only when the ranks time out and compare their calls.
    env.push_back({"BRAID_TIMEOUT", "3"});
    env.push_back({"BRAID_ALGO", t.algo});
    std::string what = "trial " + std::to_string(trial) + ": " + std::to_string(t.n) + " ranks, " + t.transport + ", " +
                       t.algo + ", rank " + std::to_string(t.odd) + " differs in the " + kDivergenceNames[t.how] +
                       " of call #" + std::to_string(t.at + 1) + " (" + t.agreed[static_cast<std::size_t>(t.at)].describe() +
                       (t.how == kSkip ? std::string(" skipped") : " -> " + t.changed.describe()) + ")";
    const int failedBefore = bad;
    double t0 = now();
    auto outcome = runRanks(t.n, [&](int rank, braidComm_t comm) { return mismatchRank(t, rank, comm); }, env, 40);
    double took = now() - t0;
    worst = std::max(worst, took);
    atTimeout += took >= 3.0;  // found only when the ranks timed out and compared their calls
    int reported = 0, clean = 0;
    for (std::size_t r = 0; r < outcome.size(); ++r) {
      const int st = outcome[r].exitStatus;
      hangs += outcome[r].timedOut;
      reported += st == 0 || st == kFoundAtDestroy;
      clean += st == kCleanExit;
      if (st != 0 && st != kFoundAtDestroy) {  // a clean exit too: every rank must learn of the mismatch
        ++bad;
        ADD_FAILURE() << what << ": rank " << r
                      << (outcome[r].timedOut ? " hung"
                          : st == kCleanExit ? " saw every call and destroy succeed"
                                             : " exited with " + std::to_string(st));
      }
    }
    cleanRanks += clean;
    for (auto& o : outcome) if (o.exitStatus == kFoundAtDestroy) { ++atDestroy; break; }
    if (!reported) { ++bad; ADD_FAILURE() << what << ": no rank reported the mismatch"; }
    if (bad != failedBefore) std::fprintf(stderr, "failed in %s\n", what.c_str());
  }
  std::fprintf(stderr, "Stress.RandomMismatches: %d trials (%d found only at BRAID_TIMEOUT, %d only at destroy; %d ranks "
               "saw every call and destroy succeed, with right results), %d failures, %d hangs, slowest trial %.2f s\n",
               trials, atTimeout, atDestroy, cleanRanks, bad, hangs, worst);
  EXPECT_EQ(hangs, 0);
}

// ------------------------------------------------------------------ kill trials

struct KillShared {
  std::atomic<double> killedAt;
  double errorAfter[8];   // seconds from the kill to the survivor's error (-1: none)
};

TEST(Stress, KilledRankIsNamedBySurvivorsWithCollectiveAndSequenceNumber) {
  const int trials = trialsOr(10);
  std::mt19937_64 rng(seedFor("Stress.KilledRank"));
  auto* shared = static_cast<KillShared*>(
      mmap(nullptr, sizeof(KillShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  std::vector<double> delays;
  int hangs = 0, crashes = 0, leaks = 0, wrongErrors = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const std::string transport = trial % 2 ? "tcp" : "shm";
    const std::string algo = (trial / 2) % 2 ? "tree" : "ring";
    // Over shm, half the trials let cross-memory attach take the large all-gathers and broadcasts
    // (as on a host with a core per rank) and half keep them on the rings (as when ranks outnumber
    // the cores), whatever this host has: each path must name the dead rank.
    const bool cma = transport == "shm" && (trial / 4) % 2 == 1;
    const int n = 2 + static_cast<int>(rng() % 7);  // 2..8
    const int victim = static_cast<int>(rng() % static_cast<std::uint64_t>(n));
    const int killAfterUs = static_cast<int>(rng() % 150000);
    const std::uint64_t callSeed = rng();
    std::string what = "trial " + std::to_string(trial) + ": " + std::to_string(n) + " ranks, " + transport + ", " +
                       algo + (cma ? " (cross-memory attach)" : "") + ", rank " + std::to_string(victim) + " killed " +
                       std::to_string(killAfterUs / 1000) +
                       " ms after init";
    shared->killedAt = 0;
    for (double& d : shared->errorAfter) d = -1;
    Env env = transportEnv(transport);
    env.push_back({"BRAID_TIMEOUT", "30"});
    env.push_back({"BRAID_ALGO", algo});
    const std::set<std::string> shmBefore = shmEntries();
    auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
      comm->impl->setOversubscribed(!cma);
      if (rank == victim) {
        std::thread([&] {
          std::this_thread::sleep_for(std::chrono::microseconds(killAfterUs));
          shared->killedAt = now();
          raise(SIGKILL);
        }).detach();
      }
      std::mt19937_64 calls(callSeed);  // the same sequence on every rank
      for (int i = 0; i < 1000000; ++i) {
        Call c = randomCall(calls, n, i % 5);
        c.count = c.kind == kBarrier ? 0 : 1 + c.count % 1024 * (i % 7 == 0 ? 64 : 1);
        std::string wrong;
        braidResult_t r = runCall(c, rank, n, comm, &wrong);
        if (!wrong.empty()) { report(rank, "silently wrong: " + wrong); return 20; }
        if (r == braidSuccess) continue;
        double at = now();
        std::string msg = braidGetLastError(comm);
        if (shared->killedAt.load() == 0) { report(rank, "failed before the kill: " + msg); return 21; }
        shared->errorAfter[rank] = at - shared->killedAt.load();
        const std::string seq = "#" + std::to_string(i + 1);
        if (r != braidRemoteError) { report(rank, std::string("expected remote error, got ") + braidGetErrorString(r) + ": " + msg); return 22; }
        if (!contains(msg, "rank " + std::to_string(victim) + " ")) { report(rank, "the dead rank is not named: " + msg); return 23; }
        if (!contains(msg, kKindNames[c.kind]) || !contains(msg, seq)) {
          report(rank, "the call (" + c.describe() + " " + seq + ") is not named: " + msg);
          return 24;
        }
        return 0;
      }
      return 25;
    }, env, 60);
    for (int r = 0; r < n; ++r) {
      const RankOutcome& o = outcome[static_cast<std::size_t>(r)];
      hangs += o.timedOut;
      if (r == victim) {
        EXPECT_EQ(o.exitStatus, 128 + SIGKILL) << what;
        continue;
      }
      if (o.exitStatus >= 128 && !o.timedOut) ++crashes;
      if (o.exitStatus != 0 && o.exitStatus < 128) ++wrongErrors;
      EXPECT_EQ(o.exitStatus, 0) << what << ": rank " << r << (o.timedOut ? " hung" : "");
      double d = shared->errorAfter[r];
      if (d >= 0) {
        delays.push_back(d);
        EXPECT_LT(d, 10.0) << what << ": rank " << r << " took " << d << " s to report the dead rank";
      }
    }
    std::set<std::string> shmAfter = shmEntries();
    for (const std::string& name : shmAfter)
      if (!shmBefore.count(name)) {
        // Another job's segments live only during its set-up; ours would stay.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (shmEntries().count(name)) { ++leaks; ADD_FAILURE() << what << ": /dev/shm/" << name << " left behind"; }
      }
  }
  munmap(shared, sizeof(KillShared));
  std::sort(delays.begin(), delays.end());
  double median = delays.empty() ? 0 : delays[delays.size() / 2], max = delays.empty() ? 0 : delays.back();
  std::fprintf(stderr,
               "Stress.KilledRank: %d trials, %zu survivor errors, kill to error median %.3f s, max %.3f s; "
               "%d hangs, %d crashes, %d wrong or missing errors, %d /dev/shm leaks\n",
               trials, delays.size(), median, max, hangs, crashes, wrongErrors, leaks);
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(crashes, 0);
  EXPECT_EQ(leaks, 0);
}

}  // namespace
}  // namespace braid::test
