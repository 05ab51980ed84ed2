// Failure behaviour over real processes: mismatched collectives, a killed rank, API misuse, and bad
// initialization. Every case is bounded in time and checks the error text users will read.
#include <gtest/gtest.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <map>
#include <memory>
#include <mutex>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "comm/c_handle.h"
#include "tests/common/harness.h"
#include "transport/shm/shm_segment.h"

namespace braid::test {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Braid's entries in /dev/shm (all of them, any job).
int shmEntries() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind("braid-", 0) == 0;
    closedir(d);
  }
  return n;
}

class Failures : public ::testing::TestWithParam<std::string> {};

TEST_P(Failures, MismatchedCollectivesNameBothCallsOnEveryRank) {
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "30"});
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    std::vector<float> a(1024 * 3, 1.0f), b(1024 * 3);
    braidResult_t r = rank == 1 ? braidAllGather(a.data(), b.data(), 256, braidFloat32, comm, nullptr)
                                : braidAllReduce(a.data(), b.data(), 1024, braidFloat32, braidSum, comm, nullptr);
    std::string msg = braidGetLastError(comm);
    if (r != braidInvalidUsage) { report(rank, "expected invalid usage, got " + std::string(braidGetErrorString(r)) + ": " + msg); return 1; }
    if (!contains(msg, "allreduce(count=1024, float32, sum) as #1") || !contains(msg, "allgather(count=256, float32) as #1")) {
      report(rank, "message does not name both calls: " + msg);
      return 2;
    }
    // The communicator stays failed.
    r = braidAllReduce(a.data(), b.data(), 4, braidFloat32, braidSum, comm, nullptr);
    if (r == braidSuccess) { report(rank, "a call after the failure succeeded"); return 3; }
    braidResult_t async;
    braidCommGetAsyncError(comm, &async);
    if (async != braidInvalidUsage) { report(rank, "async error is not invalid usage"); return 4; }
    return 0;
  }, env, 60);
  expectEveryRankSucceeded(outcome);
}

TEST_P(Failures, SkippedCallIsDetectedBySequenceNumber) {
  // Rank 1 skips the barrier: its all-reduce meets rank 0's barrier, both numbered #1, and rank 0's
  // all-reduce (#2) never gets a partner. Every rank must learn of it; none may hang.
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "30"});
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    float x = 1, y = 0;
    braidResult_t r = braidSuccess;
    if (rank == 0) r = braidBarrier(comm);
    if (r == braidSuccess) r = braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr);
    std::string msg = braidGetLastError(comm);
    if (r != braidInvalidUsage) { report(rank, "expected invalid usage: " + msg); return 1; }
    if (!contains(msg, "rank 0 called barrier() as #1 but rank 1 called allreduce(count=1, float32, sum) as #1")) {
      report(rank, "message does not name both calls: " + msg);
      return 2;
    }
    return 0;
  }, env, 60);
  expectEveryRankSucceeded(outcome);
}

// Ranks 0 and 1 reduce to root 2 while rank 2 reduces to root 0 (the chain: BRAID_ALGO=ring).
Env rootMismatchEnv(const std::string& transport) {
  Env env = transportEnv(transport);
  env.push_back({"BRAID_TIMEOUT", "30"});
  env.push_back({"BRAID_ALGO", "ring"});
  return env;
}
braidResult_t mismatchedReduce(int rank, braidComm_t comm) {
  float x = 1, y = 0;
  return braidReduce(&x, &y, 1, braidFloat32, braidSum, rank == 2 ? 0 : 2, comm, nullptr);
}
bool namesBothReduces(const std::string& msg) {
  return contains(msg, "called reduce(count=1, float32, sum, root=2) as #1") &&
         contains(msg, "called reduce(count=1, float32, sum, root=0) as #1");
}

TEST_P(Failures, MismatchThatNoPlanReadsIsFoundWithinSixtyFourCalls) {
  // Ranks 0 and 1 reduce to root 2 while rank 2 reduces to root 0: with the chain, every rank only
  // sends or sends to a rank that does not read it, so all three calls succeed and two messages stay
  // unread in channels that the ring all-reduces after it never read. The periodic check of
  // unread messages (every 64th collective) must end it on every rank, naming both calls.
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    braidResult_t r = mismatchedReduce(rank, comm);
    if (r != braidSuccess) { report(rank, "the reduce itself failed; this test needs it to pass unnoticed"); return 1; }
    float x = 1, y = 0;
    for (int call = 2; call <= 70; ++call) {
      r = braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      std::string msg = braidGetLastError(comm);
      if (r != braidInvalidUsage || call != 64) { report(rank, "call " + std::to_string(call) + ": " + msg); return 2; }
      if (!namesBothReduces(msg)) { report(rank, "does not name both calls: " + msg); return 3; }
      return 0;
    }
    report(rank, "70 calls succeeded after the mismatch");
    return 4;
  }, rootMismatchEnv(GetParam()), 60);
  expectEveryRankSucceeded(outcome);
}

TEST_P(Failures, MismatchFoundAtDestroyReachesEveryRank) {
  // The reduce of the test above, followed at once by destroy: ranks 0 and 1 send to rank 2, and
  // rank 2 sends to rank 0, which does not read it. The calls may all succeed (then destroy must
  // fail, on every rank: rank 0 finds rank 2's message, and the others learn it during destroy's
  // farewell exchange instead of returning success), or a rank still waiting in the reduce meets a
  // peer's farewell. Either way every rank gets invalid usage naming both calls, within seconds.
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    double t0 = now();
    braidResult_t r = mismatchedReduce(rank, comm);
    const bool inCall = r != braidSuccess;
    if (!inCall) r = braidCommDestroy(comm);
    std::string msg = braidGetLastError(comm);
    const std::string where = inCall ? "reduce" : "destroy";
    if (r != braidInvalidUsage) {
      report(rank, where + ": expected invalid usage, got " + braidGetErrorString(r) + ": " + msg);
      return inCall ? 2 : -2;
    }
    if (!namesBothReduces(msg)) {
      report(rank, where + " does not name both calls: " + msg);
      return inCall ? 3 : -3;
    }
    if (now() - t0 > 10) { report(rank, where + " took " + std::to_string(now() - t0) + " s"); return inCall ? 4 : -4; }
    return -100;  // failed or destroyed already: exit without destroying
  }, rootMismatchEnv(GetParam()), 60);
  for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100);
}

TEST_P(Failures, CallThatThePeerNeverMakesEndsWhenThePeerDestroys) {
  // Rank 1 skips the last all-reduce and destroys. Rank 0 must not wait for BRAID_TIMEOUT: rank 1's
  // farewell arrives where rank 0 waits (a ring, or beside the shm mailbox) and names both calls.
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "60"});
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    std::vector<float> a(4096, 1.0f), b(4096);
    for (int call = 1; call <= 3; ++call) {
      const std::size_t count = call == 1 ? 4096 : 2;  // #2 and #3 are small (the mailbox on shm)
      if (rank == 1 && call == 3) break;
      double t0 = now();
      braidResult_t r = braidAllReduce(a.data(), b.data(), count, braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      std::string msg = braidGetLastError(comm);
      if (rank != 0 || call != 3 || r != braidInvalidUsage) { report(rank, "call " + std::to_string(call) + ": " + msg); return 1; }
      if (!contains(msg, "called allreduce(count=2, float32, sum) as #3") ||
          !contains(msg, "called allreduce(count=2, float32, sum) as #2")) {
        report(rank, "does not name both calls: " + msg);
        return 2;
      }
      if (now() - t0 > 20) { report(rank, "found after " + std::to_string(now() - t0) + " s"); return 3; }
      return -100;  // the communicator failed: exit without destroying it
    }
    // Rank 1's destroy learns of the mismatch from rank 0, unless rank 0 (which hosts the store
    // here and exits as soon as its call failed) takes the store with it first: remote error.
    braidResult_t d = braidCommDestroy(comm);
    if (rank == 1 && d != braidSuccess && d != braidInvalidUsage && d != braidRemoteError) {
      report(rank, std::string("destroy: ") + braidGetLastError(comm));
      return -4;
    }
    return rank == 1 ? -100 : 5;
  }, env, 90);
  for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100);
}

TEST_P(Failures, DestroyOutlivesTheStoresHostOnceEveryCallWentThrough) {
  // Rank 0 hosts the store and dies (as a launcher stops it once another rank exited non-zero)
  // while rank 1 is in destroy, waiting for rank 2's goodbye. Rank 1's calls all went through: its
  // destroy succeeds, as it does when any other peer left, rather than fail for the store.
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "30"});
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    std::vector<float> a(4096, 1.0f), b(4096);
    if (braidAllReduce(a.data(), b.data(), a.size(), braidFloat32, braidSum, comm, nullptr) != braidSuccess) {
      report(rank, std::string("allreduce: ") + braidGetLastError(comm));
      return 1;
    }
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      raise(SIGKILL);
    }
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    if (braidCommDestroy(comm) != braidSuccess) {
      report(rank, std::string("destroy: ") + braidGetLastError(comm));
      return 2;
    }
    return kAlreadyDestroyed;
  }, env, 60);
  EXPECT_EQ(outcome[0].exitStatus, 128 + SIGKILL);
  EXPECT_EQ(outcome[1].exitStatus, 0);
  EXPECT_EQ(outcome[2].exitStatus, 0);
}

TEST_P(Failures, KilledRankIsNamedBySurvivorsWithinTenSeconds) {
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "60"});
  const int victim = 2;
  const int shmBefore = shmEntries();
  auto outcome = runRanks(4, [&](int rank, braidComm_t comm) {
    std::vector<float> a(4096, 1.0f), b(4096);
    for (int it = 0;; ++it) {
      if (rank == victim && it == 50) raise(SIGKILL);
      double t0 = now();
      braidResult_t r = braidAllReduce(a.data(), b.data(), a.size(), braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      double waited = now() - t0;
      std::string msg = braidGetLastError(comm);
      if (r != braidRemoteError) { report(rank, "expected remote error: " + msg); return 1; }
      if (!contains(msg, "rank " + std::to_string(victim) + " (")) { report(rank, "error does not name rank 2: " + msg); return 2; }
      if (!contains(msg, "allreduce")) { report(rank, "error does not name the collective: " + msg); return 3; }
      if (waited > 10) { report(rank, "took " + std::to_string(waited) + " s"); return 4; }
      return 0;
    }
  }, env, 60);
  for (int r = 0; r < 4; ++r) {
    if (r == victim) EXPECT_EQ(outcome[static_cast<std::size_t>(r)].exitStatus, 128 + SIGKILL);
    else EXPECT_EQ(outcome[static_cast<std::size_t>(r)].exitStatus, 0) << "rank " << r;
  }
  EXPECT_EQ(shmEntries(), shmBefore) << "segments left in /dev/shm after a rank was killed";
}

TEST_P(Failures, StoppedRankTimesOutAfterBraidTimeoutAndIsNamed) {
  Env env = transportEnv(GetParam());
  env.push_back({"BRAID_TIMEOUT", "3"});
  const int silent = 2;
  auto outcome = runRanks(4, [&](int rank, braidComm_t comm) {
    std::vector<float> a(1024, 1.0f), b(1024);
    for (int it = 0;; ++it) {
      if (rank == silent && it == 20) raise(SIGSTOP);
      double t0 = now();
      braidResult_t r = braidAllReduce(a.data(), b.data(), a.size(), braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      double waited = now() - t0;
      std::string msg = braidGetLastError(comm);
      int status = 0;
      if (r != braidTimeout) { report(rank, "expected timeout: " + msg); status = 1; }
      else if (!contains(msg, "rank 2 is silent")) { report(rank, "the silent rank is not named: " + msg); status = 2; }
      else if (waited < 3.0 || waited > 9.0) { report(rank, "returned after " + std::to_string(waited) + " s"); status = 3; }
      if (rank == 0) {
        std::fprintf(stderr, "rank 0 saw: %s\n", msg.c_str());
        kill(comm->impl->pidOf(silent), SIGKILL);  // end the stopped rank
      }
      return -(status ? status : 100);  // the communicator has failed: exit without destroying it
    }
  }, env, 60);
  for (int r = 0; r < 4; ++r) {
    if (r == silent) EXPECT_EQ(outcome[static_cast<std::size_t>(r)].exitStatus, 128 + SIGKILL);
    else EXPECT_EQ(outcome[static_cast<std::size_t>(r)].exitStatus, 100) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Failures, ::testing::Values("shm", "ib", "tcp"));

// Every API function with bad input returns invalid argument and leaves the communicator usable.
TEST(Misuse, BadArgumentsAreRejectedAndTheCommunicatorStaysUsable) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[16];
    for (float& o : out) o = -7;  // a rejected call must not write anything
    const std::size_t huge = SIZE_MAX / 2;
    struct Case { const char* what; braidResult_t got; };
    int dummyStream = 0;
    Case cases[] = {
        {"allreduce NULL send", braidAllReduce(nullptr, out, 4, braidFloat32, braidSum, comm, nullptr)},
        {"allreduce NULL recv", braidAllReduce(buf, nullptr, 4, braidFloat32, braidSum, comm, nullptr)},
        {"allreduce bad dtype", braidAllReduce(buf, out, 4, static_cast<braidDataType_t>(42), braidSum, comm, nullptr)},
        {"allreduce bad op", braidAllReduce(buf, out, 4, braidFloat32, static_cast<braidRedOp_t>(9), comm, nullptr)},
        {"allreduce overflow", braidAllReduce(buf, out, huge, braidFloat32, braidSum, comm, nullptr)},
        {"allreduce stream", braidAllReduce(buf, out, 4, braidFloat32, braidSum, comm, &dummyStream)},
        {"allgather overflow", braidAllGather(buf, out, SIZE_MAX / 2 + 1, braidInt8, comm, nullptr)},
        {"reducescatter NULL", braidReduceScatter(nullptr, out, 4, braidFloat32, braidSum, comm, nullptr)},
        {"broadcast root -1", braidBroadcast(buf, out, 4, braidFloat32, -1, comm, nullptr)},
        {"broadcast root 2", braidBroadcast(buf, out, 4, braidFloat32, 2, comm, nullptr)},
        {"reduce root 5", braidReduce(buf, out, 4, braidFloat32, braidSum, 5, comm, nullptr)},
        {"send peer 7", braidSend(buf, 4, braidFloat32, 7, comm, nullptr)},
        {"send to self", braidSend(buf, 4, braidFloat32, rank, comm, nullptr)},
        {"recv NULL", braidRecv(nullptr, 4, braidFloat32, 1 - rank, comm, nullptr)},
        {"NULL comm", braidAllReduce(buf, out, 4, braidFloat32, braidSum, nullptr, nullptr)},
        {"count NULL", braidCommCount(comm, nullptr)},
        // More NULL pointers.
        {"user rank NULL", braidCommUserRank(comm, nullptr)},
        {"async error NULL", braidCommGetAsyncError(comm, nullptr)},
        {"count of NULL comm", braidCommCount(nullptr, &dummyStream)},
        {"allgather NULL recv", braidAllGather(buf, nullptr, 4, braidFloat32, comm, nullptr)},
        {"reduce NULL send", braidReduce(nullptr, out, 4, braidFloat32, braidSum, 0, comm, nullptr)},
        {"send NULL", braidSend(nullptr, 4, braidFloat32, 1 - rank, comm, nullptr)},
        {"broadcast NULL recv", braidBroadcast(buf, nullptr, 4, braidFloat32, 0, comm, nullptr)},
        {"barrier NULL comm", braidBarrier(nullptr)},
        {"unique id NULL", braidGetUniqueId(nullptr)},
        {"id to string NULL", braidUniqueIdToString(nullptr, reinterpret_cast<char*>(out), sizeof(out))},
        {"id from string NULL", braidUniqueIdFromString(nullptr, nullptr)},
        {"mem alloc NULL", braidMemAlloc(nullptr, 64)},
        // Unknown dtype or op (negative too), on every collective that takes them.
        {"allreduce dtype -1", braidAllReduce(buf, out, 4, static_cast<braidDataType_t>(-1), braidSum, comm, nullptr)},
        {"allreduce op -1", braidAllReduce(buf, out, 4, braidFloat32, static_cast<braidRedOp_t>(-1), comm, nullptr)},
        {"allgather bad dtype", braidAllGather(buf, out, 4, braidNumTypes, comm, nullptr)},
        {"reducescatter bad op", braidReduceScatter(buf, out, 2, braidFloat32, braidNumOps, comm, nullptr)},
        {"broadcast bad dtype", braidBroadcast(buf, out, 4, static_cast<braidDataType_t>(99), 0, comm, nullptr)},
        {"reduce bad op", braidReduce(buf, out, 4, braidFloat32, static_cast<braidRedOp_t>(77), 0, comm, nullptr)},
        {"send bad dtype", braidSend(buf, 4, static_cast<braidDataType_t>(braidNumTypes + 3), 1 - rank, comm, nullptr)},
        {"recv bad dtype", braidRecv(out, 4, static_cast<braidDataType_t>(-5), 1 - rank, comm, nullptr)},
        // Root or peer out of range.
        {"reduce root -1", braidReduce(buf, out, 4, braidFloat32, braidSum, -1, comm, nullptr)},
        {"recv peer -1", braidRecv(out, 4, braidFloat32, -1, comm, nullptr)},
        {"recv peer 2", braidRecv(out, 4, braidFloat32, 2, comm, nullptr)},
        {"send peer INT_MAX", braidSend(buf, 4, braidFloat32, 0x7fffffff, comm, nullptr)},
        // count * element size (* ranks) overflows.
        {"reducescatter overflow", braidReduceScatter(buf, out, SIZE_MAX / 2 + 1, braidInt8, braidSum, comm, nullptr)},
        {"broadcast overflow", braidBroadcast(buf, out, huge, braidFloat64, 0, comm, nullptr)},
        {"reduce overflow", braidReduce(buf, out, huge, braidInt32, braidSum, 0, comm, nullptr)},
        {"send overflow", braidSend(buf, huge, braidFloat64, 1 - rank, comm, nullptr)},
        {"recv overflow", braidRecv(out, SIZE_MAX, braidInt32, 1 - rank, comm, nullptr)},
        // Send and receive buffers that overlap without being in place: refused, nothing sent.
        {"allreduce recv = send + 1", braidAllReduce(out, out + 1, 4, braidFloat32, braidSum, comm, nullptr)},
        {"allreduce recv = send - 1", braidAllReduce(out + 1, out, 4, braidFloat32, braidSum, comm, nullptr)},
        {"allgather at the wrong offset", braidAllGather(out + 2 * rank + 1, out, 2, braidFloat32, comm, nullptr)},
        {"allgather at the other rank's offset", braidAllGather(out + 2 * (1 - rank), out, 2, braidFloat32, comm, nullptr)},
        {"reducescatter at the wrong offset", braidReduceScatter(out, out + 2 * rank + 1, 2, braidFloat32, braidSum, comm, nullptr)},
        {"reducescatter recv = send", braidReduceScatter(out + 2, out + 2 + 2 * (1 - rank), 2, braidFloat32, braidSum, comm, nullptr)},
        {"broadcast on the root, recv = send + 3", braidBroadcast(out, out + 3, 4, braidFloat32, rank, comm, nullptr)},
        {"reduce on the root, recv = send + 1", braidReduce(out, out + 1, 4, braidFloat32, braidSum, rank, comm, nullptr)},
        {"alltoall recv = send + 1", braidAllToAll(out, out + 1, 2, braidFloat32, comm, nullptr)},
    };
    const std::string overlapText = braidGetLastError(nullptr);
    int bad = 0;
    for (const Case& c : cases) {
      if (c.got != braidInvalidArgument) {
        report(rank, std::string(c.what) + ": got " + braidGetErrorString(c.got));
        ++bad;
      }
    }
    if (std::string(braidGetLastError(nullptr)).empty()) { report(rank, "no last error text"); ++bad; }
    for (int i = 0; i < 16; ++i)
      if (out[i] != -7 || (i < 8 && buf[i] != static_cast<float>(i + 1))) { report(rank, "a rejected call wrote a buffer"); ++bad; break; }
    braidResult_t async = braidInternalError;
    if (braidCommGetAsyncError(comm, &async) != braidSuccess || async != braidSuccess) {
      report(rank, "bad arguments left an asynchronous error");
      ++bad;
    }
    if (!contains(overlapText, "overlap") || !contains(overlapText, "in place") || !contains(overlapText, "nothing was sent")) {
      report(rank, "the last overlap refusal says: " + overlapText);
      ++bad;
    }
    // The exact in-place layouts are still accepted and exact (out: 16 floats, 2 ranks).
    for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(i + rank);
    if (braidAllReduce(out, out, 4, braidFloat32, braidSum, comm, nullptr) != braidSuccess || out[3] != 2 * 3 + 1) ++bad;
    for (int i = 0; i < 4; ++i) out[2 * rank + i % 2] = static_cast<float>(10 * rank + i % 2);
    if (braidAllGather(out + 2 * rank, out, 2, braidFloat32, comm, nullptr) != braidSuccess || out[2] != 10 || out[1] != 1) {
      report(rank, "in-place allgather");
      ++bad;
    }
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(i);
    if (braidReduceScatter(out, out + 2 * rank, 2, braidFloat32, braidSum, comm, nullptr) != braidSuccess ||
        out[2 * rank] != static_cast<float>(2 * (2 * rank))) {
      report(rank, "in-place reducescatter");
      ++bad;
    }
    for (float& o : out) o = -7;
    // Zero-count calls with NULL buffers are fine.
    if (braidAllReduce(nullptr, nullptr, 0, braidFloat32, braidSum, comm, nullptr) != braidSuccess) ++bad;
    // Still usable: a real all-reduce gives the right answer.
    float one = 1, sum = 0;
    if (braidAllReduce(&one, &sum, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess || sum != 2) {
      report(rank, "communicator unusable after bad input: " + std::string(braidGetLastError(comm)));
      ++bad;
    }
    return bad;
  });
  expectEveryRankSucceeded(outcome);
}

// After destroy (and after abort) the handle stays valid: every call returns invalid usage, does
// nothing, and says why; destroying or aborting again is invalid usage too.
// Two threads calling collectives on one communicator at once: their calls could pair with the other
// rank's calls of the other thread and return mixed data with success. Here rank 0's first thread
// waits inside an all-reduce that rank 1 makes late, and each rank's second thread makes one of the
// same shape meanwhile (rank 1's second thread comes first there: it would meet rank 0's first). Rank 0 refuses its second thread (invalid
// usage naming both calls); the call it was running fails too, and so does everything on rank 1:
// no call returns success. (Threads that take turns without overlapping cannot be told apart from
// one thread: include/braid/braid.h says what Braid cannot check.)
TEST(Misuse, TwoThreadsAtOnceAreRefusedNamingBothCalls) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    std::atomic<int> succeeded{0};
    std::string refusal;
    braidResult_t second = braidSuccess;
    auto first = [&] {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
      std::vector<float> x(1024, static_cast<float>(rank));
      if (braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, comm, nullptr) == braidSuccess) ++succeeded;
    };
    auto other = [&] {  // the same shape: nothing but the thread tells the two calls apart
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 0 ? 150 : 300));
      std::vector<float> y(1024, 100.0f);
      second = braidAllReduce(y.data(), y.data(), y.size(), braidFloat32, braidSum, comm, nullptr);
      if (second == braidSuccess) ++succeeded;
      else refusal = braidGetLastError(nullptr);
    };
    std::thread a(first), b(other);
    a.join();
    b.join();
    float z = 1;
    const braidResult_t later = braidAllReduce(&z, &z, 1, braidFloat32, braidSum, comm, nullptr);
    int bad = 0;
    if (succeeded) { report(rank, std::to_string(succeeded.load()) + " of the overlapping calls returned success"); ++bad; }
    if (later == braidSuccess) { report(rank, "a call after the refusal succeeded"); ++bad; }
    if (rank == 0 && (second != braidInvalidUsage || !contains(refusal, "two threads called one communicator at once") ||
                      !contains(refusal, "allreduce(count=1024, float32) on thread") ||
                      !contains(refusal, "while allreduce(count=1024, float32) ran on thread") ||
                      !contains(refusal, "braidCommSplit"))) {
      report(rank, "the second thread got " + std::string(braidGetErrorString(second)) + ": " + refusal);
      ++bad;
    }
    braidCommAbort(comm);
    return bad ? bad : kAlreadyDestroyed;
  }, {{"BRAID_TIMEOUT", "20"}}, 120);
  expectEveryRankSucceeded(outcome);
}

TEST(Misuse, CallsAfterDestroyOrAbortAreInvalidUsage) {
  for (bool abortIt : {false, true}) {
    auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
      // Both ranks are past init (an abort during the other's init would fail that init instead).
      if (braidBarrier(comm) != braidSuccess) { report(rank, "barrier failed"); return 1; }
      braidResult_t r = abortIt ? braidCommAbort(comm) : braidCommDestroy(comm);
      if (r != braidSuccess) { report(rank, "destroy/abort failed: " + std::string(braidGetLastError(nullptr))); return 1; }
      float x = 3, y = -7;
      int n = -1;
      braidResult_t async = braidSuccess;
      struct Case { const char* what; braidResult_t got; };
      Case cases[] = {
          {"allreduce", braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr)},
          {"allgather", braidAllGather(&x, &y, 1, braidFloat32, comm, nullptr)},
          {"broadcast", braidBroadcast(&x, &y, 1, braidFloat32, 0, comm, nullptr)},
          {"send", braidSend(&x, 1, braidFloat32, 1 - rank, comm, nullptr)},
          {"recv", braidRecv(&y, 1, braidFloat32, 1 - rank, comm, nullptr)},
          {"barrier", braidBarrier(comm)},
          {"destroy again", braidCommDestroy(comm)},
          {"abort again", braidCommAbort(comm)},
      };
      int bad = 0;
      for (const Case& c : cases)
        if (c.got != braidInvalidUsage) { report(rank, std::string(c.what) + ": got " + braidGetErrorString(c.got)); ++bad; }
      if (!contains(braidGetLastError(comm), "destroyed or aborted")) { report(rank, std::string("message: ") + braidGetLastError(comm)); ++bad; }
      if (y != -7) { report(rank, "a call after destroy/abort wrote its buffer"); ++bad; }
      // Queries either still answer or say invalid usage; they never crash.
      braidResult_t q = braidCommCount(comm, &n);
      if (q != braidSuccess && q != braidInvalidUsage) { report(rank, "count after destroy"); ++bad; }
      q = braidCommGetAsyncError(comm, &async);
      if (q != braidSuccess && q != braidInvalidUsage) { report(rank, "async error after destroy"); ++bad; }
      return bad ? -bad : -100;  // already destroyed: the harness must not destroy it again
    });
    for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100) << (abortIt ? "abort" : "destroy");
  }
}

// A /dev/shm too small for the rings (Docker's 64 MB, simulated with a file size limit) is a clear
// error at creation that names the ways out, never a SIGBUS later.
TEST(Init, TooLittleSharedMemoryIsAClearErrorNotACrash) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  auto limited = forkRanks(2, [&](int proc) {
    setenv("BRAID_TIMEOUT", "20", 1);
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1 << 20, 1 << 20};  // files (and shm segments) of at most 1 MiB
    setrlimit(RLIMIT_FSIZE, &lim);
    braidUniqueId id;
    if (proc == 0) {
      braidGetUniqueId(&id);
      if (write(fds[1], &id, sizeof(id)) != sizeof(id)) return 9;
    } else if (read(fds[0], &id, sizeof(id)) != sizeof(id)) {
      return 9;
    }
    braidComm_t comm;
    braidResult_t r = braidCommInitRank(&comm, 2, id, proc);
    std::string msg = braidGetLastError(nullptr);
    if (r == braidSuccess) { report(proc, "init succeeded with 4 MiB segments under a 1 MiB limit"); return 1; }
    if (!contains(msg, "/dev/shm") || !contains(msg, "BRAID_SHM_DISABLE")) { report(proc, msg); return 2; }
    return 0;
  }, 60);
  expectEveryRankSucceeded(limited);
}

// A free TCP port on loopback (bound, read, closed: the kernel does not hand it out again at once).
int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Destroy, then create again from the environment at once, as elastic restarts and test suites do:
// the same MASTER_ADDR:MASTER_PORT and secret every time, no pause. A rank that reaches the previous
// communicator's store (still waiting for slower ranks to leave) must move on to the next one.
class Reinit : public ::testing::TestWithParam<int> {};

// What torchrun or braid run gives a rank: its place, and where rank 0's store listens.
void launchedAs(int rank, int n, const std::string& port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  setenv("BRAID_SECRET", "failures-test-secret-0123456789abcdef", 1);
}

TEST_P(Reinit, DestroyThenCreateFromTheEnvironment200Times) {
  const int n = GetParam();
  const std::string port = std::to_string(freePort());
  auto outcome = forkRanks(n, [&](int proc) {
    launchedAs(proc, n, port);
    setenv("BRAID_TIMEOUT", "20", 1);
    for (int round = 0; round < 200; ++round) {
      braidComm_t comm;
      if (braidCommInitFromEnv(&comm) != braidSuccess) {
        report(proc, "round " + std::to_string(round) + ": " + braidGetLastError(nullptr));
        return 1;
      }
      float x = static_cast<float>(proc + round);
      if (braidAllReduce(&x, &x, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess ||
          x != static_cast<float>(n * round + n * (n - 1) / 2)) {
        report(proc, "round " + std::to_string(round) + ": all-reduce gave " + std::to_string(x) + ": " + braidGetLastError(comm));
        return 2;
      }
      if (braidCommDestroy(comm) != braidSuccess) return 3;
    }
    return 0;
  }, 240);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Reinit, ::testing::Values(2, 4), [](const auto& info) {
  return std::to_string(info.param) + "ranks";
});

// Too few file descriptors for the tcp connections (2 a peer): every rank fails at once, naming
// ulimit -n, what it needs and what it may open, rather than a connection timing out after
// BRAID_TIMEOUT and blaming the network. With room under the hard limit the soft one is raised.
TEST(Init, TooFewFileDescriptorsFailEveryRankAtOnceNamingUlimit) {
  constexpr int n = 16;
  for (bool hardToo : {true, false}) {
    const std::string port = std::to_string(freePort());
    auto outcome = forkRanks(n, [&](int proc) {
      launchedAs(proc, n, port);
      setenv("BRAID_SHM_DISABLE", "1", 1);
      setenv("BRAID_IB_DISABLE", "1", 1);
      setenv("BRAID_TIMEOUT", "60", 1);
      rlimit lim{};
      getrlimit(RLIMIT_NOFILE, &lim);
      lim.rlim_cur = 32;
      if (hardToo) lim.rlim_max = 32;
      if (setrlimit(RLIMIT_NOFILE, &lim) != 0) { report(proc, "setrlimit failed"); return 9; }
      const double t0 = now();
      braidComm_t comm;
      braidResult_t r = braidCommInitFromEnv(&comm);
      const double took = now() - t0;
      const std::string msg = braidGetLastError(nullptr);
      if (!hardToo) {
        if (r != braidSuccess) { report(proc, "with room under the hard limit: " + msg); return 1; }
        float x = 1;
        r = braidAllReduce(&x, &x, 1, braidFloat32, braidSum, comm, nullptr);
        braidCommDestroy(comm);
        return r == braidSuccess && x == n ? 0 : 2;
      }
      if (r == braidSuccess) { report(proc, "init succeeded under ulimit -n 32"); braidCommDestroy(comm); return 3; }
      if (took > 10 || !contains(msg, "ulimit -n") || !contains(msg, "may open 32") || !contains(msg, "needs") ||
          contains(msg, "firewall")) {
        report(proc, "took " + std::to_string(took) + " s: " + msg);
        return 4;
      }
      return 0;
    }, 120);
    SCOPED_TRACE(hardToo ? "soft and hard limit 32" : "soft limit 32, hard limit higher");
    expectEveryRankSucceeded(outcome);
  }
}

// Segments of a process killed before it could unlink them (SIGKILL, or SIGTERM during setup) are
// removed by the next sweep; those of a live process, of another pid namespace, and names Braid
// cannot read are left alone.
TEST(Init, SegmentsOfDeadProcessesAreRemovedAndLiveOnesKept) {
  (void)ShmSegment::removeLeftovers();  // whatever earlier runs left
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int i = 0; i < 3; ++i) {
      auto seg = ShmSegment::create(ShmSegment::nameFor("sweep-test-" + std::to_string(i)), 64 << 10);
      if (!seg.ok()) _exit(1);
      std::shared_ptr<ShmSegment> leak = *seg;
      new std::shared_ptr<ShmSegment>(leak);  // never destroyed: the segment outlives the process
    }
    char ok = 1;
    if (write(fds[1], &ok, 1) != 1) _exit(1);
    pause();  // until SIGKILL
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(fds[0], &ok, 1), 1);
  auto mine = ShmSegment::create(ShmSegment::nameFor("sweep-test-live"), 64 << 10);
  ASSERT_TRUE(mine.ok()) << mine.status().toString();
  // The same pid as the child in another pid namespace, and a name of no known form.
  const std::string other = "/braid-pid" + std::to_string(child) + "@1-sweep-test-otherns";
  const std::string odd = "/braid-sweep-test-noform";
  for (const std::string& n : {other, odd}) {
    int fd = shm_open(n.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  const int before = shmEntries();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_EQ(shmEntries(), before) << "the child's segments must outlive it for this test to mean anything";
  const ShmSegment::Leftovers gone = ShmSegment::removeLeftovers();
  EXPECT_EQ(gone.removed, 3);
  EXPECT_EQ(gone.removedPids, std::to_string(child));
  EXPECT_GE(gone.removedBytes, 3u * (64 << 10));
  EXPECT_GE(gone.live, 1);
  EXPECT_GE(gone.unknown, 2);
  EXPECT_EQ(shmEntries(), before - 3);
  for (const std::string& n : {other, odd}) EXPECT_EQ(shm_unlink(n.c_str()), 0) << n << " was removed";
}

// Resident memory of this process, in KiB.
long rssKiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::atol(line + 6);
  if (f) std::fclose(f);
  return kib;
}

// A destroyed (or aborted) communicator's C handle stays allocated, so that a late call on it is
// invalid usage rather than a use after free; what the communicator held must not stay with it
// (the flight recorder's entries alone were ~300 KiB). Created and destroyed 300 times, and split
// 300 times, the process grows by a few KiB a communicator at most.
TEST(Init, ClosedCommunicatorsKeepAlmostNothing) {
  auto outcome = forkRanks(1, [&](int) {
    launchedAs(0, 1, std::to_string(freePort()));
    auto cycle = [](int n, bool split) {
      for (int i = 0; i < n; ++i) {
        braidComm_t comm, part;
        if (braidCommInitFromEnv(&comm) != braidSuccess) return false;
        if (split && braidCommSplit(comm, 0, 0, &part) == braidSuccess) {
          float x = 1;
          braidAllReduce(&x, &x, 1, braidFloat32, braidSum, part, nullptr);
          i % 2 ? braidCommDestroy(part) : braidCommAbort(part);
        }
        i % 3 ? braidCommDestroy(comm) : braidCommAbort(comm);
      }
      return true;
    };
    if (!cycle(50, true)) return 9;  // warm-up: the allocator's arenas, the first thread's stacks
    const long before = rssKiB();
    if (!cycle(300, true)) return 9;
    const double perComm = static_cast<double>(rssKiB() - before) / 600;
    std::printf("%.1f KiB more resident memory per closed communicator (300 created, 300 split off)\n", perComm);
    if (perComm > 16) { report(0, "closed communicators keep " + std::to_string(perComm) + " KiB each"); return 1; }
    return 0;
  }, 120);
  expectEveryRankSucceeded(outcome);
}

// Two processes both given RANK=0: the one that cannot host the store says that this may be why,
// not only that the address is in use.
TEST(Init, TwoProcessesGivenRankZeroAreToldSo) {
  const std::string port = std::to_string(freePort());
  auto outcome = forkRanks(2, [&](int proc) {
    launchedAs(0, 2, port);
    setenv("BRAID_TIMEOUT", "2", 1);
    if (proc == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the other hosts the store
    braidComm_t comm;
    if (braidCommInitFromEnv(&comm) == braidSuccess) { braidCommDestroy(comm); return 1; }
    const std::string msg = braidGetLastError(nullptr);
    if (proc == 0) return 0;  // it waited for a rank 1 that never came
    if (!contains(msg, "Address already in use") || !contains(msg, "also given rank 0") || !contains(msg, "own RANK")) {
      report(proc, msg);
      return 2;
    }
    return 0;
  }, 60);
  expectEveryRankSucceeded(outcome);
}

// A call whose data is still moving when BRAID_TIMEOUT (which bounds the whole call) runs out says
// so, with the bytes moved, instead of calling a rank silent.
TEST(Init, TimeoutWhileDataStillMovesSaysSoAndNamesNoSilentRank) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    // 1 GiB over tcp: far more than 0.2 s here. Left unwritten (its values do not matter): filling
    // it would take one rank longer than the limit allows the other to wait in the barrier.
    const std::size_t count = std::size_t{256} << 20;
    std::unique_ptr<float[]> data(new float[count]);
    std::span<float> big(data.get(), count);
    // Both ranks at the timed call together, so that data flows from its start: rank 1 (10.2 s)
    // waits in a barrier for rank 0 (0.2 s), which comes late and so never waits there.
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (braidBarrier(comm) != braidSuccess) { report(rank, "barrier: " + std::string(braidGetLastError(comm))); return 3; }
    // (Again, up to 20 times, on a machine that moves 1 GiB within the limit.)
    braidResult_t r = braidSuccess;
    for (int i = 0; i < 20 && r == braidSuccess; ++i)
      r = braidAllReduce(big.data(), big.data(), big.size(), braidFloat32, braidSum, comm, nullptr);
    const std::string msg = braidGetLastError(comm);
    // Rank 0, with the short limit, times out; rank 1 learns of it (with rank 0's code and words).
    if (r != braidTimeout && (rank == 0 || r != braidRemoteError)) {
      report(rank, std::string("got ") + braidGetErrorString(r) + ": " + msg);
      return 1;
    }
    // A rank that timed out itself describes its own call; the other may learn of it from that one.
    if (r == braidTimeout && (!contains(msg, "though its data was still moving") || !contains(msg, "no rank is silent") ||
                              !contains(msg, "bytes of its whole part of the call") || !contains(msg, "within 0.2 s") ||
                              contains(msg, "silent (stopped"))) {
      report(rank, msg);
      return 2;
    }
    braidCommAbort(comm);
    return kAlreadyDestroyed;
  }, {{"BRAID_TIMEOUT", "{rank}0.2"}, {"BRAID_SHM_DISABLE", "1"}, {"BRAID_IB_DISABLE", "1"}}, 120);  // 0.2 s, 10.2 s
  expectEveryRankSucceeded(outcome);
}

// The rendezvous store serves a number of requests and bytes per rank that does not grow with the
// ranks: no rank reads every rank's PeerInfo from it (the roster travels along the set-up tree), only
// those of the peers it connects. Over tcp, one rank a host (BRAID_HOSTID) so that the peers
// connected at creation are the algorithms' neighbours, at 16, 32 and 64 ranks: the count and the
// bytes per rank stay the same, within what only rank 0 (the trees' root) adds.
TEST(Init, StoreRequestsAndBytesPerRankDoNotGrowWithTheRanks) {
  std::map<int, double> requests, bytes;
  for (int n : {16, 32, 64}) {
    const std::string file = "/tmp/braid-store-requests-" + std::to_string(getpid()) + "-" + std::to_string(n);
    Env env = transportEnv("tcp");
    env.push_back({"BRAID_HOSTID", "host{rank}"});
    auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
      if (braidBarrier(comm) != braidSuccess) return 1;  // every rank's set-up requests have arrived
      if (rank == 0) {
        const long long served = comm->impl->storeRequests(), moved = comm->impl->storeBytes();
        std::FILE* f = std::fopen(file.c_str(), "w");
        if (!f || served < 0 || moved < 0) return 2;
        std::fprintf(f, "%lld %lld\n", served, moved);
        std::fclose(f);
      }
      return 0;
    }, env, 180);
    expectEveryRankSucceeded(outcome);
    long long served = -1, moved = -1;
    if (std::FILE* f = std::fopen(file.c_str(), "r")) {
      if (std::fscanf(f, "%lld %lld", &served, &moved) != 2) served = -1;
      std::fclose(f);
    }
    std::remove(file.c_str());
    ASSERT_GT(served, 0) << n << " ranks";
    requests[n] = static_cast<double>(served) / n;
    bytes[n] = static_cast<double>(moved) / n;
    std::printf("%d ranks: %lld store requests for the set-up (%.2f a rank), %lld bytes (%.0f a rank)\n", n, served,
                requests[n], moved, bytes[n]);
  }
  // Each rank's reading every PeerInfo (~300 B) would add 4,800 B a rank from 16 to 32 ranks.
  EXPECT_LE(requests[64], requests[16] + 0.5);
  EXPECT_LE(bytes[64], bytes[16] * 1.15);
}

TEST(Init, RankOutOfRangeAndZeroRanksAreInvalidArguments) {
  braidUniqueId id;
  std::memset(&id, 0, sizeof(id));
  braidComm_t comm;
  EXPECT_EQ(braidCommInitRank(&comm, 2, id, 5), braidInvalidArgument);
  EXPECT_EQ(braidCommInitRank(&comm, 0, id, 0), braidInvalidArgument);
  EXPECT_EQ(braidCommInitRank(&comm, -3, id, 0), braidInvalidArgument);
  EXPECT_EQ(braidCommInitRank(nullptr, 2, id, 0), braidInvalidArgument);
  EXPECT_EQ(braidCommInitRank(&comm, 2, id, 0), braidInvalidArgument);  // not a unique id
}

TEST(Init, TheSameRankTwiceIsRejected) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  auto outcome = forkRanks(3, [&](int proc) {
    setenv("BRAID_TIMEOUT", "10", 1);
    braidUniqueId id;
    if (proc == 0) {
      braidGetUniqueId(&id);
      for (int i = 0; i < 2; ++i) if (write(fds[1], &id, sizeof(id)) != sizeof(id)) return 9;
    } else if (read(fds[0], &id, sizeof(id)) != sizeof(id)) {
      return 9;
    }
    braidComm_t comm;
    int rank = proc == 0 ? 0 : 1;  // processes 1 and 2 both claim rank 1
    braidResult_t r = braidCommInitRank(&comm, 2, id, rank);
    if (r == braidSuccess) { braidCommDestroy(comm); return 0; }
    std::string msg = braidGetLastError(nullptr);
    return contains(msg, "joined twice") ? 10 : (report(proc, msg), 11);
  }, 60);
  int ok = 0, twice = 0;
  for (auto& o : outcome) { ok += o.exitStatus == 0; twice += o.exitStatus == 10; }
  EXPECT_EQ(twice, 1) << "exactly one process should be told that rank 1 joined twice";
  EXPECT_EQ(ok, 2);
}

TEST(Init, UnreachableStoreFailsWithinTheTimeoutAndNamesTheAddress) {
  braidUniqueId id;
  ASSERT_EQ(braidUniqueIdFromString("127.0.0.1:1/00112233445566778899aabbccddeeff", &id), braidSuccess);
  auto outcome = forkRanks(1, [&](int) {
    setenv("BRAID_TIMEOUT", "2", 1);
    braidComm_t comm;
    double t0 = now();
    braidResult_t r = braidCommInitRank(&comm, 2, id, 1);
    double took = now() - t0;
    std::string msg = braidGetLastError(nullptr);
    if (r == braidSuccess || took > 6 || !contains(msg, "127.0.0.1:1") || !contains(msg, "MASTER_ADDR")) {
      report(1, "took " + std::to_string(took) + " s: " + msg);
      return 1;
    }
    return 0;
  }, 30);
  EXPECT_EQ(outcome[0].exitStatus, 0);
}

// CommOptions::timeoutSec bounds one communicator's waits (the torch backend passes the process
// group's timeout this way); BRAID_TIMEOUT, when set, still wins; a bad value is an invalid argument.
TEST(Init, CommOptionsTimeoutBoundsTheCommunicatorAndBraidTimeoutWins) {
  braidUniqueId id;
  ASSERT_EQ(braidUniqueIdFromString("127.0.0.1:1/00112233445566778899aabbccddeeff", &id), braidSuccess);
  struct Case { const char* env; double option; double lo, hi; Code code; };
  const Case cases[] = {
      {nullptr, 1.5, 1.4, 5.0, Code::kSystemError},  // the option alone (the default would be 300 s)
      {"1", 60.0, 0.9, 4.5, Code::kSystemError},   // BRAID_TIMEOUT overrides the option
      {nullptr, -1.0, 0.0, 0.5, Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto outcome = forkRanks(1, [&](int) {
      if (c.env) setenv("BRAID_TIMEOUT", c.env, 1);
      else unsetenv("BRAID_TIMEOUT");
      CommOptions options;
      options.timeoutSec = c.option;
      double t0 = now();
      auto comm = Communicator::fromUniqueId(id, 2, 1, options);
      double took = now() - t0;
      if (comm.ok() || comm.status().code() != c.code || took < c.lo || took > c.hi) {
        report(1, "took " + std::to_string(took) + " s: " + (comm.ok() ? "ok" : comm.status().toString()));
        return 1;
      }
      return 0;
    }, 30);
    EXPECT_EQ(outcome[0].exitStatus, 0) << "BRAID_TIMEOUT=" << (c.env ? c.env : "(unset)") << ", option " << c.option;
  }
}

}  // namespace
}  // namespace braid::test
