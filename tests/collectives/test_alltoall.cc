// All-to-all, all-to-allv and groups (braidGroupStart/End) over real processes and transports.
// Every element is checked: rank s sends rank d, at element i of its block, a value that differs
// by sender, destination and index and is exact in its type, so a block that lands in the wrong
// place, from the wrong rank, or shifted, is found. Buffers are misaligned by 1 to 3 bytes; counts
// include 0, 1, primes and blocks of 256 KiB and more (cut into one piece per channel).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "comm/c_handle.h"
#include "kernels/reduce.h"
#include "tests/common/harness.h"

namespace braid::test {
namespace {

// Values exact in the type: below 127 for int8, 251 for uint8 and bfloat16, 2039 for float16,
// 32749 for the 16-bit integers, 17 and 9 for the 8-bit floats (e4m3 holds the integers to 16,
// e5m2 to 8).
double value(DataType t, std::size_t from, std::size_t to, std::size_t i) {
  const std::size_t m = t == DataType::kInt8 ? 127
                        : t == DataType::kUint8 || t == DataType::kBfloat16 ? 251
                        : t == DataType::kFloat16 ? 2039
                        : t == DataType::kInt16 || t == DataType::kUint16 ? 32749
                        : t == DataType::kFloat8e4m3 ? 17
                        : t == DataType::kFloat8e5m2 ? 9
                                                  : 1000003;
  return static_cast<double>((from * 31 + to * 17 + i * 7) % m);
}

void fillBlock(std::byte* p, std::size_t count, DataType t, std::size_t from, std::size_t to) {
  for (std::size_t i = 0; i < count; ++i) kernels::storeFromDouble(p, i, t, value(t, from, to, i));
}

std::size_t wrongInBlock(const std::byte* p, std::size_t count, DataType t, std::size_t from, std::size_t to) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += kernels::loadAsDouble(p, i, t) != value(t, from, to, i);
  return wrong;
}

// "shm_3ranks": the name of a (transport, ranks) instance.
std::string paramName(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
}

std::string failure(braidComm_t comm, braidResult_t r) {
  return std::string(braidGetErrorString(r)) + ": " + braidGetLastError(comm);
}

// ------------------------------------------------------------------ all-to-all

// The parameter of the instances below: (transport, ranks).
class TransportRanks : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string transport() const { return std::get<0>(GetParam()); }
  int ranks() const { return std::get<1>(GetParam()); }
};

class AllToAll : public TransportRanks {};

TEST_P(AllToAll, EveryTypeCountAndPlacementIsExact) {
  const int n = ranks();
  auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
    const std::size_t nn = static_cast<std::size_t>(n), me = static_cast<std::size_t>(rank);
    long wrong = 0;
    int cases = 0;
    std::vector<std::byte> a, b;
    for (int ti = 0; ti < kNumDataTypes; ++ti) {
      const auto t = static_cast<DataType>(ti);
      const std::size_t es = dataTypeSize(t);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4097}, std::size_t{65537}}) {
        if (count == 65537 && ti % 3 != 0) continue;  // the large blocks for a sample of the types
        for (int inPlace = 0; inPlace < 2; ++inPlace) {
          const std::size_t shift = 1 + (count + static_cast<std::size_t>(ti)) % 3, bytes = count * es * nn;
          a.assign(bytes + 8, std::byte{0x5a});
          b.assign(bytes + 8, std::byte{0x5a});
          std::byte* send = a.data() + shift;
          std::byte* recv = inPlace ? send : b.data() + shift;
          for (std::size_t d = 0; d < nn; ++d) fillBlock(send + d * count * es, count, t, me, d);
          const braidResult_t r = braidAllToAll(send, recv, count, static_cast<braidDataType_t>(t), comm, nullptr);
          if (r != braidSuccess) {
            report(rank, "alltoall " + std::string(dataTypeName(t)) + " count " + std::to_string(count) + ": " + failure(comm, r));
            return 1;
          }
          for (std::size_t s = 0; s < nn; ++s) {
            const std::size_t w = wrongInBlock(recv + s * count * es, count, t, s, me);
            if (w) report(rank, "alltoall " + std::string(dataTypeName(t)) + " count " + std::to_string(count) +
                                    (inPlace ? " in place" : "") + ": " + std::to_string(w) + " wrong elements from rank " +
                                    std::to_string(s));
            wrong += static_cast<long>(w);
          }
          // Nothing written past the receive buffer.
          if (!inPlace && (b[shift - 1] != std::byte{0x5a} || b[shift + bytes] != std::byte{0x5a})) {
            report(rank, "alltoall wrote outside the receive buffer");
            return 3;
          }
          ++cases;
        }
      }
    }
    if (rank == 0) std::fprintf(stderr, "rank 0: %d all-to-all cases, %ld wrong elements\n", cases, wrong);
    return wrong ? 2 : 0;
  }, transportEnv(transport()), 300);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAll,
                         ::testing::Values(std::make_tuple("shm", 1), std::make_tuple("shm", 2), std::make_tuple("shm", 3),
                                           std::make_tuple("shm", 5), std::make_tuple("tcp", 2), std::make_tuple("tcp", 4)),
                         paramName);

// ------------------------------------------------------------------ all-to-allv

// What rank s sends rank d: ragged, often zero, one pair far past 256 KiB (cut into pieces).
std::size_t raggedCount(std::size_t s, std::size_t d, int round) {
  if (s == 1 && d == 0 && round == 1) return 300007;
  return (s * 7 + d * 3 + static_cast<std::size_t>(round)) % 5 == 0 ? 0 : (s * 13 + d * 29 + static_cast<std::size_t>(round)) % 211;
}

class AllToAllv : public TransportRanks {};

TEST_P(AllToAllv, RaggedCountsAndGappedDisplacementsAreExact) {
  const int n = ranks();
  auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
    const std::size_t nn = static_cast<std::size_t>(n), me = static_cast<std::size_t>(rank);
    long wrong = 0;
    for (int round = 0; round < 3; ++round)
      for (const DataType t : {DataType::kFloat32, DataType::kInt8, DataType::kBfloat16, DataType::kFloat64}) {
        const std::size_t es = dataTypeSize(t);
        for (int inPlace = 0; inPlace < 2; ++inPlace) {
          // Blocks in reverse peer order with a gap of p+1 elements before block p, so that the
          // displacements are neither sorted nor dense.
          std::vector<std::size_t> sc(nn), sd(nn), rc(nn), rd(nn);
          std::size_t sendEnd = 0, recvEnd = 0;
          for (std::size_t k = nn; k-- > 0;) {
            sc[k] = raggedCount(me, k, round);
            rc[k] = raggedCount(k, me, round);
            sd[k] = sendEnd + k + 1;
            sendEnd = sd[k] + sc[k];
            rd[k] = recvEnd + 2 * k + 1;
            recvEnd = rd[k] + rc[k];
          }
          const std::size_t shift = 1 + static_cast<std::size_t>(round);
          std::vector<std::byte> a((std::max(sendEnd, recvEnd) + 1) * es + 8), b(recvEnd * es + 8);
          std::byte* send = a.data() + shift;
          std::byte* recv = inPlace ? send : b.data() + shift;
          for (std::size_t d = 0; d < nn; ++d) fillBlock(send + sd[d] * es, sc[d], t, me, d);
          const braidResult_t r = braidAllToAllv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(),
                                                 static_cast<braidDataType_t>(t), comm, nullptr);
          if (r != braidSuccess) {
            report(rank, "alltoallv round " + std::to_string(round) + ": " + failure(comm, r));
            return 1;
          }
          for (std::size_t s = 0; s < nn; ++s) {
            const std::size_t w = wrongInBlock(recv + rd[s] * es, rc[s], t, s, me);
            if (w) report(rank, "alltoallv " + std::string(dataTypeName(t)) + " round " + std::to_string(round) +
                                    (inPlace ? " in place" : "") + ": " + std::to_string(w) + " of " + std::to_string(rc[s]) +
                                    " elements from rank " + std::to_string(s) + " wrong");
            wrong += static_cast<long>(w);
          }
        }
      }
    return wrong ? 2 : 0;
  }, transportEnv(transport()), 300);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllv,
                         ::testing::Values(std::make_tuple("shm", 1), std::make_tuple("shm", 2), std::make_tuple("shm", 4),
                                           std::make_tuple("tcp", 3)),
                         paramName);

// A rank's own bad arguments are refused at once and leave the communicator usable; counts that
// two ranks disagree on end the communicator on both (the receiver at once, the sender at its
// next call if its part was done), naming the pair and the arrays.
TEST(AllToAllvErrors, BadArgumentsAreRefusedAndMismatchedCountsNamed) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    const std::size_t peer = static_cast<std::size_t>(1 - rank), me = static_cast<std::size_t>(rank);
    std::vector<float> send(64, 1.0f), recv(64, 0.0f);
    std::vector<std::size_t> sc(2, 4), sd{0, 4}, rc(2, 4), rd{0, 4};
    rc[me] = 3;  // sends itself 4, receives 3 from itself
    braidResult_t r = braidAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), braidFloat32, comm, nullptr);
    if (r != braidInvalidArgument || !std::strstr(braidGetLastError(comm), "sends itself 4 elements")) {
      report(rank, "self-mismatch: " + failure(comm, r));
      return 1;
    }
    r = braidAllToAllv(send.data(), nullptr, sd.data(), recv.data(), rc.data(), rd.data(), braidFloat32, comm, nullptr);
    if (r != braidInvalidArgument) {
      report(rank, "NULL counts: " + failure(comm, r));
      return 2;
    }
    rc[me] = 4;
    r = braidAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), braidFloat32, comm, nullptr);
    if (r != braidSuccess) {  // still usable
      report(rank, "valid call after the refused ones: " + failure(comm, r));
      return 3;
    }
    if (rank == 1) rc[peer] = 5;  // rank 0 sends 4, rank 1 expects 5
    r = braidAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), braidFloat32, comm, nullptr);
    // Rank 0's part may be done before rank 1 reads the header: it learns at its next call.
    if (rank == 0 && r == braidSuccess) r = braidBarrier(comm);
    const std::string msg = braidGetLastError(comm);
    if (r == braidSuccess) {
      report(rank, "mismatched counts succeeded");
      return 4;
    }
    if (msg.find("alltoallv(float32) #") == std::string::npos ||
        msg.find("rank 0's sendcounts[1] must equal rank 1's recvcounts[0]") == std::string::npos) {
      report(rank, "mismatch not named: " + msg);
      return 5;
    }
    return 0;  // the communicator has ended; destroying it returns at once
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// A Work callback may make calls on its own communicator and wait for them, as a DDP comm hook does
// (powerSGD: its future's callback starts an all-reduce and waits on it). Here each callback makes
// a second all-reduce, waits on it, and then a blocking barrier; both ranks' results are exact and
// nothing waits for BRAID_TIMEOUT (the callback ran on the worker, which used to hold the queue
// until its callbacks returned: the nested wait never ended).
TEST(WorkCpp, CallbackMayCallItsCommunicatorAndWait) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    std::vector<float> x(1000, static_cast<float>(rank + 1)), y(1000, static_cast<float>(10 * (rank + 1)));
    std::atomic<int> stage{0};
    Status inner = Status::Internal("callback not run"), barrier = Status::Internal("callback not run");
    const auto t0 = std::chrono::steady_clock::now();
    Work w = comm.allReduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    w.onDone([&](const Status& s) {
      if (!s.ok()) { inner = s; stage = 3; return; }
      Work second = comm.allReduce(y.data(), y.data(), y.size(), DataType::kFloat32, ReduceOp::kSum);
      inner = second.wait();
      barrier = comm.barrier().wait();
      stage = 3;
    });
    for (int i = 0; i < 20000 && stage.load() != 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const Status outer = w.wait();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (stage.load() != 3 || !outer.ok() || !inner.ok() || !barrier.ok() || took > 10) {
      report(rank, "after " + std::to_string(took) + " s: outer " + outer.toString() + ", inner " + inner.toString() +
                       ", barrier " + barrier.toString());
      return 1;
    }
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] != 3.0f || y[i] != 30.0f) { report(rank, "wrong sums"); return 2; }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// A Work callback may drop its communicator's last handle, as torch frees a process group from a
// future's callback: the communicator then ends on the worker once the call is over (it neither
// joins the worker from itself, which aborted the process, nor ends under the running call). The
// callback runs on the worker here (nobody waits on the work), and the parent communicator the
// child was split from goes on working.
TEST(WorkCpp, CallbackMayDropItsCommunicatorsLastHandle) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator parent(c->impl);
    auto split = parent.split(0, rank);
    if (!split.ok() || !split->has_value()) { report(rank, "split: " + split.status().toString()); return 1; }
    auto child = std::make_unique<Communicator>(std::move(**split));
    std::vector<float> x(1000, static_cast<float>(rank + 1));
    std::atomic<bool> done{false};
    std::thread::id ranOn;
    Status result = Status::Internal("callback not run");
    child->allReduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum).onDone([&](const Status& s) {
      result = s;
      ranOn = std::this_thread::get_id();
      child.reset();  // the last handle
      done = true;
    });
    for (int i = 0; i < 20000 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!done.load() || !result.ok()) { report(rank, "callback: " + result.toString()); return 2; }
    if (ranOn == std::this_thread::get_id()) { report(rank, "the callback ran on the caller's thread, not the worker"); return 3; }
    for (float v : x)
      if (v != 3.0f) { report(rank, "wrong sums"); return 4; }
    std::vector<float> y(7, static_cast<float>(rank));
    const Status after = parent.allReduce(y.data(), y.data(), y.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    if (!after.ok() || y[6] != 1.0f) { report(rank, "parent afterwards: " + after.toString()); return 5; }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// Communicator::finishQueued returns only once every queued call has run, with the calls their
// callbacks queued meanwhile (a chain of 5: each callback queues the next all-reduce and does not
// wait for it), and its callbacks have returned: what braid_torch does at interpreter exit.
TEST(WorkCpp, FinishQueuedRunsWhatCallbacksQueueToo) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    constexpr int kChain = 5;
    std::vector<std::vector<float>> bufs(kChain, std::vector<float>(4096, static_cast<float>(rank + 1)));
    std::atomic<int> ran{0};
    std::function<void(int)> queue = [&](int i) {
      comm.allReduce(bufs[i].data(), bufs[i].data(), bufs[i].size(), DataType::kFloat32, ReduceOp::kSum)
          .onDone([&, i](const Status& s) {
            if (!s.ok()) return;
            if (i + 1 < kChain) queue(i + 1);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow callback is waited for too
            ++ran;
          });
    };
    queue(0);
    comm.finishQueued();
    if (ran.load() != kChain) { report(rank, "finishQueued returned after " + std::to_string(ran.load()) + " of 5 calls"); return 1; }
    for (const auto& b : bufs)
      for (float v : b)
        if (v != 3.0f) { report(rank, "wrong sums"); return 2; }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// The C++ API: allToAll and allToAllv as Work on the communicator's worker, whose vectors need not
// outlive the call, and Work::onDone: called once with the result, on the finishing thread or at
// once when the work is already done.
TEST(AllToAllCpp, WorkAndOnDoneCallbacks) {
  auto outcome = runRanks(3, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    const std::size_t nn = 3, me = static_cast<std::size_t>(rank), count = 5000;
    std::vector<float> send(count * nn), recv(count * nn, -1.0f);
    for (std::size_t d = 0; d < nn; ++d)
      fillBlock(reinterpret_cast<std::byte*>(send.data() + d * count), count, DataType::kFloat32, me, d);
    std::atomic<int> calls{0};
    Status seen = Status::Internal("not called");
    Work w = comm.allToAll(send.data(), recv.data(), count, DataType::kFloat32);
    w.onDone([&](const Status& s) {
      seen = s;
      ++calls;
    });
    Status s = w.wait();
    for (int i = 0; i < 1000 && calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!s.ok() || calls.load() != 1 || !seen.ok()) {
      report(rank, "allToAll: " + s.toString() + ", callback called " + std::to_string(calls.load()) + " times with " +
                       seen.toString());
      return 1;
    }
    for (std::size_t q = 0; q < nn; ++q)
      if (wrongInBlock(reinterpret_cast<std::byte*>(recv.data() + q * count), count, DataType::kFloat32, q, me)) return 2;
    bool ranAtOnce = false;
    w.onDone([&](const Status& st) { ranAtOnce = st.ok(); });
    if (!ranAtOnce) return 3;
    // allToAllv with vectors that are gone before the work runs: rank r sends r+1+d elements to d.
    Work v;
    std::vector<double> vs(64), vr(64, -1);
    {
      std::vector<std::size_t> sc(nn), sd(nn), rc(nn), rd(nn);
      for (std::size_t d = 0, off = 0; d < nn; ++d, off += 8) {
        sc[d] = me + 1 + d;
        sd[d] = off;
        rc[d] = d + 1 + me;
        rd[d] = off;
        for (std::size_t i = 0; i < sc[d]; ++i) vs[off + i] = static_cast<double>(me * 100 + d * 10 + i);
      }
      v = comm.allToAllv(vs.data(), sc, sd, vr.data(), rc, rd, DataType::kFloat64);
    }
    s = v.wait();
    if (!s.ok()) {
      report(rank, "allToAllv: " + s.toString());
      return 4;
    }
    for (std::size_t q = 0; q < nn; ++q)
      for (std::size_t i = 0; i < q + 1 + me; ++i)
        if (vr[q * 8 + i] != static_cast<double>(q * 100 + me * 10 + i)) return 5;
    return 0;
  }, {}, 60);
  expectEveryRankSucceeded(outcome);
}

// Counts that disagree across 256 KiB, where the two ends would cut the block into different
// numbers of pieces: the receiver still names the pair at the first header, and the sender
// fails at its next call; neither succeeds with half a block.
// Chains of all-reduces on 2 ranks, each reducing what the one before wrote: call k's element i
// must be (3 + 2 (i mod 5)) 2^k (exact: doublings of small integers), and a call run before the
// one it reads from would read the -1s. chainInput is rank's input to call 0.
std::vector<float> chainInput(int rank, std::size_t count) {
  std::vector<float> base(count);
  for (std::size_t i = 0; i < count; ++i) base[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
  return base;
}
// 0, or reports the first wrong element on this rank and returns `code`.
int checkChain(int rank, const std::vector<std::vector<float>>& bufs, int code) {
  for (std::size_t k = 0; k < bufs.size(); ++k)
    for (std::size_t i = 0; i < bufs[k].size(); ++i)
      if (bufs[k][i] != std::ldexp(static_cast<float>(3 + 2 * static_cast<int>(i % 5)), static_cast<int>(k)))
        return report(rank, "call " + std::to_string(k) + " element " + std::to_string(i) + " is " +
                                std::to_string(bufs[k][i])), code;
  return 0;
}

// Work::wait runs a call that has not started on the waiting thread when it is next in line:
// calls still run in the order they were made, whichever Work is waited on first, and each result
// is exact. (Which thread runs a call is a race with the worker, so only the order is checked, and
// that some calls ran here: the waits right after their call.)
TEST(AllToAllCpp, WaitingRunsCallsInOrderWhicheverIsWaitedFirst) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    constexpr int kCalls = 24;
    constexpr std::size_t kCount = 4099;
    const std::vector<float> base = chainInput(rank, kCount);
    std::vector<std::vector<float>> bufs(kCalls, std::vector<float>(kCount, -1.0f));
    std::vector<Work> works(kCalls);
    // Callbacks run after wait() returns (WorkState::finish wakes the waiters first): what they
    // touch must outlive this body, hence the shared counter.
    auto ranHere = std::make_shared<std::atomic<int>>(0);
    const std::thread::id me = std::this_thread::get_id();
    for (int k = 0; k < kCalls; ++k) {
      const float* in = k == 0 ? base.data() : bufs[k - 1].data();
      works[k] = comm.allReduce(in, bufs[k].data(), kCount, DataType::kFloat32, ReduceOp::kSum);
      works[k].onDone([ranHere, me](const Status&) {
        if (std::this_thread::get_id() == me) ranHere->fetch_add(1);
      });
      if (k % 3 == 0) {  // waited at once: usually run here
        if (Status s = works[k].wait(); !s.ok()) return report(rank, "wait: " + s.toString()), 1;
      }
    }
    for (int k = kCalls - 1; k >= 0; --k)  // the rest, last first
      if (Status s = works[k].wait(); !s.ok()) return report(rank, "wait: " + s.toString()), 2;
    if (int rc = checkChain(rank, bufs, 3)) return rc;
    std::printf("rank %d: %d of %d calls ran on the waiting thread\n", rank, ranHere->load(), kCalls);
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

// Destroy with asynchronous calls queued and never waited on: they run first, in order, on every
// rank, then destroy succeeds and each result is exact. (Before destroy waited for the queue, they
// mostly ran anyway, the worker taking execMu_ back before destroy could; the last handle's drop,
// ~Comm, failed them and left the peer waiting: tests/torch's check_destroy_with_unwaited_work.)
TEST(AllToAllCpp, DestroyRunsQueuedCallsFirst) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    constexpr int kCalls = 12;
    constexpr std::size_t kCount = (1 << 18) + 3;
    const std::vector<float> base = chainInput(rank, kCount);
    std::vector<std::vector<float>> bufs(kCalls, std::vector<float>(kCount, -1.0f));
    std::vector<Work> works(kCalls);
    for (int k = 0; k < kCalls; ++k)
      works[k] = comm.allReduce(k == 0 ? base.data() : bufs[k - 1].data(), bufs[k].data(), kCount, DataType::kFloat32,
                                ReduceOp::kSum);
    if (braidResult_t r = braidCommDestroy(c); r != braidSuccess)
      return report(rank, std::string("destroy: ") + braidGetLastError(c)), 1;
    for (int k = 0; k < kCalls; ++k)
      if (!works[k].test()) return report(rank, "call " + std::to_string(k) + " not done after destroy"), 2;
    if (int rc = checkChain(rank, bufs, 3)) return rc;
    return kAlreadyDestroyed;
  });
  expectEveryRankSucceeded(outcome);
}

// A call nobody waits on starts on its own, whether the worker is woken for each call (spare
// cores) or by its timer (ranks outnumbering their CPUs: here both pinned to one), and a wait on
// the last of several queued calls leaves them all done, in order. Nothing else calls Braid while
// a rank polls: a lost wake-up would leave the call queued and miss the 10 s bound (a queue that
// does not arm the timer fails it).
class UnwaitedCalls : public ::testing::TestWithParam<bool> {};
TEST_P(UnwaitedCalls, StartOnTheirOwnAndAWaitRunsThoseBeforeIt) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  struct Restore {
    const cpu_set_t& to;
    ~Restore() { sched_setaffinity(0, sizeof(to), &to); }
  } restore{saved};
  if (GetParam()) {  // (the ranks inherit it)
    int first = 0;
    while (!CPU_ISSET(first, &saved)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  }
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    constexpr std::size_t kCount = 1027;
    const std::vector<float> base = chainInput(rank, kCount);
    std::vector<std::vector<float>> bufs(4, std::vector<float>(kCount, -1.0f));
    // One waited on at once first: the worker has started and gone to sleep by the next.
    if (Status s = comm.allReduce(base.data(), bufs[0].data(), kCount, DataType::kFloat32, ReduceOp::kSum).wait(); !s.ok())
      return report(rank, "wait: " + s.toString()), 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Work first = comm.allReduce(bufs[0].data(), bufs[1].data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!first.test() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (!first.test()) return report(rank, "a call nobody waited on did not finish within 10 s"), 1;
    Work second = comm.allReduce(bufs[1].data(), bufs[2].data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    Work third = comm.allReduce(bufs[2].data(), bufs[3].data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    if (Status s = third.wait(); !s.ok()) return report(rank, "wait: " + s.toString()), 2;
    if (!second.test()) return report(rank, "the call queued before the one waited on is not done"), 3;
    return checkChain(rank, bufs, 4);
  });
  expectEveryRankSucceeded(outcome);
}
INSTANTIATE_TEST_SUITE_P(Workers, UnwaitedCalls, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "oversubscribed" : "spare_cores"; });

TEST(AllToAllvErrors, MismatchedLargeBlocksAreNamed) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    const std::size_t peer = static_cast<std::size_t>(1 - rank), me = static_cast<std::size_t>(rank);
    std::vector<float> send(200000, 1.0f), recv(200000, 0.0f);
    std::vector<std::size_t> sc(2, 0), sd(2, 0), rc(2, 0), rd(2, 0);
    sc[peer] = rank == 0 ? 80000 : 10;  // rank 0 sends 320,000 bytes (cut in pieces)...
    rc[peer] = rank == 1 ? 40000 : 10;  // ...where rank 1 expects 160,000 (one piece)
    sc[me] = rc[me] = 3;
    sd[me] = 100000;
    rd[me] = 100000;
    braidResult_t r = braidAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), braidFloat32,
                                     comm, nullptr);
    if (rank == 0 && r == braidSuccess) r = braidBarrier(comm);
    const std::string msg = braidGetLastError(comm);
    if (r == braidSuccess || msg.find("rank 0 sends rank 1 80000 elements where rank 1 expects 40000") == std::string::npos) {
      report(rank, "large mismatch: " + failure(comm, r));
      return 1;
    }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// ------------------------------------------------------------------ groups

// Every rank posts all its sends (4 MiB each, far past what a transport buffers) before any
// receive. Called one by one this deadlocks: each rank's first send waits for a peer that is
// itself sending. In a group they run together and every element arrives.
class Groups : public TransportRanks {};

TEST_P(Groups, SendsBeforeReceivesInAnyOrderComplete) {
  const int n = ranks();
  auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
    const std::size_t nn = static_cast<std::size_t>(n), me = static_cast<std::size_t>(rank);
    for (std::size_t count : {std::size_t{0}, std::size_t{13}, std::size_t{(1u << 20) + 1}}) {
      std::vector<std::vector<float>> out(nn), in(nn);
      if (braidGroupStart() != braidSuccess) return 1;
      // Sends first, to the peers in an order that differs by rank; then the receives.
      for (std::size_t k = 1; k < nn; ++k) {
        const std::size_t p = (me + nn - k) % nn;
        out[p].resize(count + 1);
        fillBlock(reinterpret_cast<std::byte*>(out[p].data() + 1), count, DataType::kFloat32, me, p);
        const braidResult_t r = braidSend(out[p].data() + 1, count, braidFloat32, static_cast<int>(p), comm, nullptr);
        if (r != braidSuccess) {
          report(rank, "grouped send: " + failure(comm, r));
          return 2;
        }
      }
      for (std::size_t p = 0; p < nn; ++p) {
        if (p == me) continue;
        in[p].assign(count + 1, -1.0f);
        const braidResult_t r = braidRecv(in[p].data() + 1, count, braidFloat32, static_cast<int>(p), comm, nullptr);
        if (r != braidSuccess) {
          report(rank, "grouped recv: " + failure(comm, r));
          return 3;
        }
      }
      const braidResult_t r = braidGroupEnd();
      if (r != braidSuccess) {
        report(rank, "braidGroupEnd: " + failure(comm, r));
        return 4;
      }
      for (std::size_t p = 0; p < nn; ++p) {
        if (p == me) continue;
        const std::size_t w = wrongInBlock(reinterpret_cast<std::byte*>(in[p].data() + 1), count, DataType::kFloat32, p, me);
        if (w) {
          report(rank, std::to_string(w) + " wrong elements from rank " + std::to_string(p) + " at count " + std::to_string(count));
          return 5;
        }
      }
    }
    return 0;
  }, transportEnv(transport()), 120);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Groups,
                         ::testing::Values(std::make_tuple("shm", 2), std::make_tuple("shm", 4), std::make_tuple("tcp", 3)),
                         paramName);

// A grouped send meets plain receives; a nested group runs at the outermost end; a bad argument
// inside a group is refused at once and the rest of the group still runs; collectives in a group
// run after its sends and receives, in call order; braidGroupEnd without a start is an error.
TEST(GroupRules, NestingMixingCollectivesAndErrors) {
  auto outcome = runRanks(3, [&](int rank, braidComm_t comm) {
    const int right = (rank + 1) % 3, left = (rank + 2) % 3;
    if (braidGroupEnd() != braidInvalidUsage) {
      report(rank, "braidGroupEnd without a start succeeded");
      return 1;
    }
    // Rank 0 groups two sends to rank 1, which receives them one by one.
    std::vector<int> m1(100, rank), m2(7, rank + 10), g1(100, -1), g2(7, -1);
    if (rank == 0) {
      braidGroupStart();
      braidSend(m1.data(), m1.size(), braidInt32, 1, comm, nullptr);
      braidSend(m2.data(), m2.size(), braidInt32, 1, comm, nullptr);
      if (braidGroupEnd() != braidSuccess) return 2;
    } else if (rank == 1) {
      if (braidRecv(g1.data(), g1.size(), braidInt32, 0, comm, nullptr) != braidSuccess ||
          braidRecv(g2.data(), g2.size(), braidInt32, 0, comm, nullptr) != braidSuccess)
        return 3;
      if (g1 != std::vector<int>(100, 0) || g2 != std::vector<int>(7, 10)) {
        report(rank, "plain receives of grouped sends got the wrong data");
        return 4;
      }
    }
    // Nested: nothing runs at the inner end. A ring exchange, an all-reduce and an all-gather.
    std::vector<double> ringIn(5, -1), ringOut(5, rank), sum(9, rank + 1), gathered(3 * 4, -1), mine(4, rank * 2);
    braidGroupStart();
    braidGroupStart();
    if (braidAllReduce(sum.data(), sum.data(), sum.size(), braidFloat64, braidSum, comm, nullptr) != braidSuccess) return 5;
    if (braidSend(ringOut.data(), ringOut.size(), braidFloat64, right, comm, nullptr) != braidSuccess) return 6;
    // Refused at once (a peer outside the communicator), and not part of the group.
    if (braidSend(ringOut.data(), 1, braidFloat64, 7, comm, nullptr) != braidInvalidArgument) return 7;
    if (braidRecv(ringIn.data(), ringIn.size(), braidFloat64, left, comm, nullptr) != braidSuccess) return 10;
    if (braidGroupEnd() != braidSuccess) return 8;
    if (ringIn[0] != -1 || sum[0] != rank + 1) {
      report(rank, "a call ran at the inner braidGroupEnd");
      return 9;
    }
    if (braidAllGather(mine.data(), gathered.data(), mine.size(), braidFloat64, comm, nullptr) != braidSuccess) return 11;
    const braidResult_t r = braidGroupEnd();
    if (r != braidSuccess) {
      report(rank, "outer braidGroupEnd: " + failure(comm, r));
      return 12;
    }
    if (ringIn != std::vector<double>(5, left) || sum != std::vector<double>(9, 6)) {
      report(rank, "the group's ring exchange or all-reduce is wrong");
      return 13;
    }
    for (int q = 0; q < 3; ++q)
      for (int i = 0; i < 4; ++i)
        if (gathered[static_cast<std::size_t>(q * 4 + i)] != q * 2) {
          report(rank, "the group's all-gather is wrong");
          return 14;
        }
    // The communicator goes on as usual after the groups.
    double x = 1, y = 0;
    if (braidAllReduce(&x, &y, 1, braidFloat64, braidSum, comm, nullptr) != braidSuccess || y != 3) return 15;
    return 0;
  }, {}, 60);
  expectEveryRankSucceeded(outcome);
}

// The C++ API's batch: every rank sends 4 MiB to both neighbours before it receives; one Work for
// the batch. A bad entry fails the Work at once, naming the entry, and the communicator goes on.
TEST(GroupRules, CppSendRecvBatchCompletesInAnyOrder) {
  auto outcome = runRanks(3, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    const int right = (rank + 1) % 3, left = (rank + 2) % 3;
    const std::size_t big = (1u << 20) + 5;
    std::vector<float> toRight(big, static_cast<float>(rank * 10)), toLeft(big, static_cast<float>(rank * 10 + 1));
    std::vector<float> fromLeft(big, -1), fromRight(big, -1);
    Work bad = comm.sendRecvBatch({{PeerOp::kSend, toRight.data(), 1, DataType::kFloat32, 9}});
    const Status b = bad.wait();
    if (b.code() != Code::kInvalidArgument || b.message().find("sendRecvBatch, entry 0") == std::string::npos) {
      report(rank, "bad entry: " + b.toString());
      return 1;
    }
    Work w = comm.sendRecvBatch({{PeerOp::kSend, toRight.data(), big, DataType::kFloat32, right},
                                 {PeerOp::kSend, toLeft.data(), big, DataType::kFloat32, left},
                                 {PeerOp::kRecv, fromLeft.data(), big, DataType::kFloat32, left},
                                 {PeerOp::kRecv, fromRight.data(), big, DataType::kFloat32, right}});
    const Status s = w.wait();
    if (!s.ok()) {
      report(rank, "batch: " + s.toString());
      return 2;
    }
    if (fromLeft != std::vector<float>(big, static_cast<float>(left * 10)) ||
        fromRight != std::vector<float>(big, static_cast<float>(right * 10 + 1))) {
      report(rank, "batch delivered the wrong data");
      return 3;
    }
    return 0;
  }, {}, 60);
  expectEveryRankSucceeded(outcome);
}

// A grouped send whose size its receiver does not expect: the receiver's group fails naming both
// calls; the sender's small send was handed to the transport already, so it learns at its next
// call (a barrier), with the same error. Both within the timeout.
TEST(GroupRules, AMismatchInsideAGroupIsNamedOnBothRanks) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    std::vector<float> buf(64, 1.0f);
    braidGroupStart();
    if (rank == 0) braidSend(buf.data(), 10, braidFloat32, 1, comm, nullptr);
    else braidRecv(buf.data(), 11, braidFloat32, 0, comm, nullptr);
    braidResult_t r = braidGroupEnd();
    if (rank == 0 && r == braidSuccess) r = braidBarrier(comm);
    const std::string msg = braidGetLastError(comm);
    if (r == braidSuccess) {
      report(rank, "mismatched grouped send/recv succeeded");
      return 1;
    }
    if (msg.find("send/recv(count=1") == std::string::npos || msg.find("rank 0->1") == std::string::npos) {
      report(rank, "mismatch not named: " + msg);
      return 2;
    }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// Tags (PeerOp::tag): messages between two ranks still match in call order, as NCCL's do, and
// each one carries its tag. Sends tagged 3 and 4 meet receives tagged 3 and 4 in one batch; then a
// send tagged 5 that meets a receive tagged 6 fails on both ranks, naming the tags.
TEST(GroupRules, CppTagsMatchInOrderAndADifferentTagIsNamed) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    const int peer = 1 - rank;
    std::vector<std::int32_t> a(7, 30 + rank), b(7, 40 + rank), gotA(7, -1), gotB(7, -1);
    std::vector<PeerOp> ops;
    if (rank == 0) {
      ops = {{PeerOp::kSend, a.data(), 7, DataType::kInt32, peer, 3}, {PeerOp::kSend, b.data(), 7, DataType::kInt32, peer, 4}};
    } else {
      ops = {{PeerOp::kRecv, gotA.data(), 7, DataType::kInt32, peer, 3}, {PeerOp::kRecv, gotB.data(), 7, DataType::kInt32, peer, 4}};
    }
    const Status s = comm.sendRecvBatch(ops).wait();
    if (!s.ok()) {
      report(rank, "tagged batch: " + s.toString());
      return 1;
    }
    if (rank == 1 && (gotA != std::vector<std::int32_t>(7, 30) || gotB != std::vector<std::int32_t>(7, 40))) {
      report(rank, "tagged batch delivered the wrong data");
      return 2;
    }
    Status bad = comm.sendRecvBatch({{rank == 0 ? PeerOp::kSend : PeerOp::kRecv, rank == 0 ? a.data() : gotA.data(), 7,
                                      DataType::kInt32, peer, rank == 0 ? 5 : 6}}).wait();
    if (bad.ok()) bad = comm.barrier().wait();  // the sender learns at its next call
    const std::string msg = bad.message();
    if (bad.ok() || msg.find("tag=6") == std::string::npos || msg.find("has tag 5") == std::string::npos) {
      report(rank, "a different tag was not named: " + bad.toString());
      return 3;
    }
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 60);
  expectEveryRankSucceeded(outcome);
}

}  // namespace
}  // namespace braid::test
