// Every collective on CUDA device buffers through the C API, ordered with a stream: ranks are real
// processes sharing one GPU (tests/common/harness.h), over shm and tcp. Every dtype x op x
// in-place/out-of-place x count (0, 1, 7, 4097 and, sampled, 1M+3), buffers shifted by 0 to 3 bytes,
// each element checked exactly against the CPU reference (tools/pattern.h).
// Stream ordering is what each case observes: the input is written by a kernel that first sleeps
// (launchDelayedCopy) over a poisoned buffer just before the call, and the output is read by another
// kernel (launchSnapshot) queued just after it; the host looks only at that snapshot. A call that ran
// early would reduce poison; a stream that resumed early would snapshot stale memory.
// Without a usable GPU the program prints why and exits 77 (SKIP).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "braid/ddp.hpp"
#include "comm/c_handle.h"
#include "tests/common/harness.h"
#include "tests/gpu/gpu_util.h"
#include "tools/pattern.h"

namespace braid::test {
namespace {

const std::size_t kCounts[] = {0, 1, 7, 4097};
constexpr std::size_t kBig = (1u << 20) + 3;
constexpr unsigned kDelayUs = 300;

std::string cudaText(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

// One rank's device memory: a (send side), b (receive side), src (staging for the delayed copy),
// snap (the snapshot), each `cap` bytes plus slack for the shifts.
struct Dev {
  cudaStream_t stream = nullptr;
  std::byte *a = nullptr, *b = nullptr, *src = nullptr, *snap = nullptr;
  std::size_t cap = 0;
  std::vector<std::byte> host, got;
  std::string error;

  bool ensure(std::size_t bytes) {
    if (!stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return fail("stream");
    if (bytes <= cap) return true;
    for (std::byte* p : {a, b, src, snap}) cudaFree(p);
    cap = bytes;
    for (std::byte** p : {&a, &b, &src, &snap})
      if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(p), cap + 64); e != cudaSuccess) return fail("cudaMalloc: " + cudaText(e));
    host.resize(cap + 64);
    got.resize(cap + 64);
    return true;
  }
  bool fail(const std::string& what) {
    error = what;
    return false;
  }
  // Poisons [dst, dst+bytes) and then writes pattern data there with a delayed kernel, all on the stream.
  // The data waits at src + srcOff until the kernel copies it: calls queued back to back without a
  // synchronization in between need regions of their own.
  bool put(std::byte* dst, std::size_t count, DataType t, ReduceOp op, int rank, std::size_t first = 0, std::size_t srcOff = 0) {
    const std::size_t bytes = count * dataTypeSize(t);
    if (!bytes) return true;
    pattern::fill(host.data(), count, t, op, rank, first);
    if (cudaMemcpy(src + srcOff, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return fail("upload");
    if (cudaMemsetAsync(dst, 0xEE, bytes, stream) != cudaSuccess) return fail("poison");
    launchDelayedCopy(dst, src + srcOff, bytes, kDelayUs, stream);
    return cudaGetLastError() == cudaSuccess || fail("delayed copy launch");
  }
  // Poisons an output region on the stream (so that a result that never arrives is seen).
  bool poison(std::byte* dst, std::size_t bytes) { return !bytes || cudaMemsetAsync(dst, 0xEE, bytes, stream) == cudaSuccess || fail("poison"); }
  // Snapshots [p, p+bytes) with a kernel right after the call, waits, and returns the host copy.
  const std::byte* take(const std::byte* p, std::size_t bytes) {
    if (bytes) launchSnapshot(snap, p, bytes, stream);
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      fail("cudaStreamSynchronize: " + cudaText(e));
      return nullptr;
    }
    if (bytes && cudaMemcpy(got.data(), snap, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      fail("download");
      return nullptr;
    }
    return got.data();
  }
};

std::string caseName(const char* coll, DataType t, ReduceOp op, std::size_t count, bool inPlace) {
  return std::string(coll) + " " + dataTypeName(t) + " " + reduceOpName(op) + " count=" + std::to_string(count) +
         (inPlace ? " in-place" : " out-of-place");
}

long runCase(int rank, int n, braidComm_t comm, Dev& d, DataType t, ReduceOp op, std::size_t count, bool inPlace,
             std::size_t shift) {
  const std::size_t es = dataTypeSize(t);
  const auto ct = static_cast<braidDataType_t>(t);
  const auto cop = static_cast<braidRedOp_t>(op);
  const std::size_t nn = static_cast<std::size_t>(n), rr = static_cast<std::size_t>(rank);
  if (!d.ensure(count * es * nn + 64)) {
    report(rank, d.error);
    return -1;
  }
  long wrong = 0;
  bool ok = true;
  // Checks the result code, then `count` elements of the snapshot of `out` with `verify`.
  auto check = [&](const char* coll, braidResult_t res, const std::byte* out, std::size_t bytes, auto verify) {
    if (res != braidSuccess) {
      report(rank, caseName(coll, t, op, count, inPlace) + ": " + braidGetErrorString(res) + ": " + braidGetLastError(comm));
      return ok = false;
    }
    const std::byte* h = d.take(out, bytes);
    if (!h) {
      report(rank, caseName(coll, t, op, count, inPlace) + ": " + d.error);
      return ok = false;
    }
    std::size_t w = verify(h);
    if (w) report(rank, caseName(coll, t, op, count, inPlace) + ": " + std::to_string(w) + " wrong elements");
    wrong += static_cast<long>(w);
    return true;
  };

  // all-reduce
  std::byte* s = d.a + shift;
  std::byte* r = inPlace ? s : d.b + shift + 1;
  if (!d.put(s, count, t, op, rank) || (!inPlace && !d.poison(r, count * es))) return report(rank, d.error), -1;
  braidResult_t res = braidAllReduce(s, r, count, ct, cop, comm, d.stream);
  check("allreduce", res, r, count * es, [&](const std::byte* h) { return pattern::countWrong(h, count, t, op, n, 0); });
  if (!ok) return -1;

  // reduce-scatter
  std::byte* out = inPlace ? s + rr * count * es : d.b + shift + 2;
  if (!d.put(s, count * nn, t, op, rank) || (!inPlace && !d.poison(out, count * es))) return report(rank, d.error), -1;
  res = braidReduceScatter(s, out, count, ct, cop, comm, d.stream);
  check("reducescatter", res, out, count * es, [&](const std::byte* h) { return pattern::countWrong(h, count, t, op, n, rr * count); });
  if (!ok) return -1;

  // all-gather
  std::byte* gathered = d.b + shift;
  std::byte* mine = inPlace ? gathered + rr * count * es : d.a + shift + 3;
  if (!d.poison(gathered, count * es * nn) || !d.put(mine, count, t, op, rank, rr * count)) return report(rank, d.error), -1;
  res = braidAllGather(mine, gathered, count, ct, comm, d.stream);
  check("allgather", res, gathered, count * es * nn, [&](const std::byte* h) {
    std::size_t w = 0;
    for (std::size_t q = 0; q < nn; ++q) w += pattern::countWrong(h + q * count * es, count, t, op, n, q * count, static_cast<int>(q));
    return w;
  });
  if (!ok) return -1;

  // broadcast and reduce, root cycling with the count
  const int root = static_cast<int>(count % nn);
  s = d.a + shift;
  r = inPlace ? s : d.b + shift + 1;
  if (rank == root ? !d.put(s, count, t, op, root) : !d.poison(r, count * es)) return report(rank, d.error), -1;
  if (rank == root && !inPlace && !d.poison(r, count * es)) return report(rank, d.error), -1;
  res = braidBroadcast(s, r, count, ct, root, comm, d.stream);
  check("broadcast", res, r, count * es, [&](const std::byte* h) { return pattern::countWrong(h, count, t, op, n, 0, root); });
  if (!ok) return -1;
  if (!d.put(s, count, t, op, rank) || (!inPlace && !d.poison(r, count * es))) return report(rank, d.error), -1;
  res = braidReduce(s, r, count, ct, cop, root, comm, d.stream);
  check("reduce", res, r, rank == root ? count * es : 0,
        [&](const std::byte* h) { return rank == root ? pattern::countWrong(h, count, t, op, n, 0) : 0; });
  if (!ok) return -1;

  // send/recv around the ring (out of place): even ranks send first
  if (n > 1) {
    const int to = (rank + 1) % n, from = (rank + n - 1) % n;
    s = d.a + shift;
    r = d.b + shift + 1;
    if (!d.put(s, count, t, op, rank) || !d.poison(r, count * es)) return report(rank, d.error), -1;
    auto doSend = [&] { return braidSend(s, count, ct, to, comm, d.stream); };
    auto doRecv = [&] { return braidRecv(r, count, ct, from, comm, d.stream); };
    braidResult_t x = rank % 2 == 0 ? doSend() : doRecv();
    braidResult_t y = x == braidSuccess ? (rank % 2 == 0 ? doRecv() : doSend()) : x;
    check("send/recv", y, r, count * es, [&](const std::byte* h) { return pattern::countWrong(h, count, t, op, n, 0, from); });
    if (!ok) return -1;
  }
  return wrong;
}

// (transport, ranks, CUDA IPC): with IPC on (the default) every collective with elements, and over shm
// every send/recv of at least BRAID_BUFFSIZE (1 MiB: the large count's), must have read the peers'
// buffers directly; with it off, all of them are staged through host memory.
class GpuCollectives : public ::testing::TestWithParam<std::tuple<std::string, int, bool>> {};

TEST_P(GpuCollectives, EveryTypeOpAndCountIsExactAndStreamOrdered) {
  const std::string transport = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  const bool ipc = std::get<2>(GetParam());
  Env env = transportEnv(transport);
  env.push_back({"BRAID_TIMEOUT", "60"});
  env.push_back({"BRAID_CUDA_IPC", ipc ? "1" : "0"});
  auto outcome = runRanks(
      n,
      [&](int rank, braidComm_t comm) {
        Dev d;
        long wrong = 0;
        int cases = 0, zeroCases = 0, bigCases = 0;
        for (int ti = 0; ti < kNumDataTypes; ++ti)
          for (int oi = 0; oi < kNumReduceOps; ++oi) {
            const auto t = static_cast<DataType>(ti);
            const auto op = static_cast<ReduceOp>(oi);
            for (std::size_t count : kCounts)
              for (int inPlace = 0; inPlace < 2; ++inPlace) {
                long w = runCase(rank, n, comm, d, t, op, count, inPlace, (count + ti + oi) % 4);
                if (w < 0) return 1;
                wrong += w;
                ++cases;
                zeroCases += count == 0;
              }
            if ((ti + oi) % 5 == n % 5) {  // the large count, sampled so that every type and op gets one
              long w = runCase(rank, n, comm, d, t, op, kBig, (ti + oi) % 2 == 1, 1 + ti % 3);
              if (w < 0) return 1;
              wrong += w;
              ++cases;
              ++bigCases;
            }
          }
        // Every case but count 0 made five collectives with elements that IPC takes, and over shm the
        // large ones a send and a receive above BRAID_BUFFSIZE on each rank (over tcp those may
        // complete before their receive, so they stay staged).
        const std::uint64_t ipcCalls = comm->impl->cudaIpcCalls();
        const std::uint64_t p2p = transport == "shm" ? 2 * static_cast<std::uint64_t>(bigCases) : 0;
        const std::uint64_t wantIpc = ipc && n > 1 ? 5 * static_cast<std::uint64_t>(cases - zeroCases) + p2p : 0;
        if (rank == 0)
          std::fprintf(stderr, "rank 0: %d cases x 6 collectives on device buffers, %ld wrong elements, %llu collectives through CUDA IPC\n",
                       cases, wrong, static_cast<unsigned long long>(ipcCalls));
        if (ipcCalls != wantIpc) {
          report(rank, "collectives through CUDA IPC: " + std::to_string(ipcCalls) + ", expected " + std::to_string(wantIpc));
          return 3;
        }
        // Staged over shm, the large all-reduces' pieces run zero-copy on the shared staging memory
        // (at least one piece per large case); over tcp never.
        const std::uint64_t zeroCopy = comm->impl->zeroCopyCalls();
        const bool wantZeroCopy = !ipc && n > 1 && transport == "shm";
        if (wantZeroCopy ? zeroCopy < static_cast<std::uint64_t>(bigCases) : zeroCopy != 0) {
          report(rank, "staged all-reduce pieces through the zero-copy path: " + std::to_string(zeroCopy) + ", expected " +
                       (wantZeroCopy ? "at least " + std::to_string(bigCases) : std::string("none")));
          return 5;
        }
        // Braid leaves no error behind on the caller's thread (a poll's "not ready", say), where the
        // program's own cudaGetLastError would read it as its own failure.
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
          report(rank, std::string("cudaGetLastError after the calls: ") + cudaGetErrorName(e));
          return 4;
        }
        return wrong ? 2 : 0;
      },
      env, 600);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuCollectives,
                         ::testing::Values(std::tuple{"shm", 1, true}, std::tuple{"shm", 2, true}, std::tuple{"shm", 3, true},
                                           std::tuple{"shm", 4, true}, std::tuple{"tcp", 2, true}, std::tuple{"shm", 2, false},
                                           std::tuple{"shm", 3, false}, std::tuple{"tcp", 2, false}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks" +
                                  (std::get<2>(info.param) ? "" : "_staged");
                         });

// The largest size of Braid's GPU targets: every collective at 256 MiB per rank (+3 elements, so that no
// block, piece or slot is a round number), 2 ranks, through CUDA IPC (float32 sum, out of place) and
// staged (bfloat16 avg, in place), each element checked. A real GPU only: the emulation would hold
// several GiB of shared memory and copy them with the CI machine's 2 cores.
class GpuLargest : public ::testing::TestWithParam<bool> {};

TEST_P(GpuLargest, EveryCollectiveAt256MiBIsExact) {
  if (onEmulation())
    GTEST_SKIP() << "256 MiB per rank runs on a real GPU only (on the CUDA emulation it would need several GiB of "
                    "memory and minutes of the CPU)";
  const bool ipc = GetParam();
  const DataType t = ipc ? DataType::kFloat32 : DataType::kBfloat16;
  const ReduceOp op = ipc ? ReduceOp::kSum : ReduceOp::kAvg;
  const std::size_t count = (std::size_t{256} << 20) / dataTypeSize(t) + 3;
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    Dev d;
    const long w = runCase(rank, 2, comm, d, t, op, count, !ipc, 1);
    const std::uint64_t viaIpc = comm->impl->cudaIpcCalls(), zeroCopy = comm->impl->zeroCopyCalls();
    if (rank == 0)
      std::fprintf(stderr, "rank 0: 256 MiB + 3 elements, %ld wrong elements, %llu calls through CUDA IPC, %llu zero-copy pieces\n",
                   w, static_cast<unsigned long long>(viaIpc), static_cast<unsigned long long>(zeroCopy));
    if (w) return w < 0 ? 1 : 2;
    // Through IPC: the five collectives, the send and the receive. Staged: the all-reduce's pieces
    // through the zero-copy path.
    if (ipc ? viaIpc != 7 : viaIpc != 0 || zeroCopy == 0) return report(rank, "not the path this instance is for"), 3;
    return 0;
  }, {{"BRAID_TIMEOUT", "120"}, {"BRAID_CUDA_IPC", ipc ? "1" : "0"}}, 900);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Path, GpuLargest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? std::string("ipc") : std::string("staged"); });

// Nine ranks: more than the fold's 8 sources per launch, so the IPC all-reduce takes its two-shot
// form and every fold chains two launches (the destination among the first 8 sources when in place).
// A few types, ops and counts only (nine processes on one GPU), each collective checked exactly.
TEST(GpuManyRanks, NineRanksTakeTheTwoShotFormAndChainedFolds) {
  auto outcome = runRanks(
      9,
      [](int rank, braidComm_t comm) {
        Dev d;
        long wrong = 0;
        for (DataType t : {DataType::kFloat32, DataType::kBfloat16})
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
            for (std::size_t count : {std::size_t{7}, kBig})
              for (int inPlace = 0; inPlace < 2; ++inPlace) {
                long w = runCase(rank, 9, comm, d, t, op, count, inPlace, static_cast<std::size_t>(inPlace));
                if (w < 0) return 1;
                wrong += w;
              }
        if (rank == 0)
          std::fprintf(stderr, "rank 0: 9 ranks, %ld wrong elements, %llu collectives through CUDA IPC\n", wrong,
                       static_cast<unsigned long long>(comm->impl->cudaIpcCalls()));
        return wrong ? 2 : 0;
      },
      {{"BRAID_TIMEOUT", "120"}}, 900);
  expectEveryRankSucceeded(outcome);
}

// Host and device buffers in one call, and the checks that come before any data moves.
TEST(GpuArguments, MixedMemoryTypesAreInvalidArguments) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    void* dev = nullptr;
    if (cudaMalloc(&dev, 4096) != cudaSuccess) return 10;
    std::vector<float> host(1024, 1.0f);
    if (braidAllReduce(host.data(), dev, 1024, braidFloat32, braidSum, comm, nullptr) != braidInvalidArgument) return 11;
    if (braidAllReduce(dev, host.data(), 1024, braidFloat32, braidSum, comm, nullptr) != braidInvalidArgument) return 12;
    // The communicator is still usable afterwards, on either kind of memory.
    if (braidAllReduce(host.data(), host.data(), 1024, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 13;
    if (host[5] != 2.0f) return 14;
    if (braidAllReduce(dev, dev, 1024, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 15;
    if (cudaDeviceSynchronize() != cudaSuccess) return 16;
    (void)rank;
    cudaFree(dev);
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

// Calls made on a stream being captured into a CUDA graph run each time the graph is launched,
// not at the capture: an in-place all-reduce of 1 and 2 captured once and launched three times
// gives 3, 6, 12; an all-gather captured after it in the same graph gathers each launch's sums.
// The communicator serves ordinary calls on the same stream before and after, also one made right
// after a launch without waiting for it (it runs behind the graph's calls: 24, then 48). Through
// CUDA IPC, and staged through pinned memory (allocated at the capture).
void expectCapturedCallsRunAtEveryLaunch(const Env& env) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    const std::size_t n = 1000;
    float* dev = nullptr;
    float* gathered = nullptr;
    cudaStream_t s = nullptr;
    if (cudaMalloc(&dev, n * sizeof(float)) != cudaSuccess || cudaMalloc(&gathered, 2 * n * sizeof(float)) != cudaSuccess)
      return 10;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 11;
    std::vector<float> host(n, static_cast<float>(rank + 1));
    if (cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) return 12;
    // The first device call outside the capture: it starts the communicator's CUDA proxy.
    if (braidBroadcast(gathered, gathered, n, braidFloat32, 0, comm, s) != braidSuccess) return 13;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 14;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) return 15;
    const braidResult_t r1 = braidAllReduce(dev, dev, n, braidFloat32, braidSum, comm, s);
    const braidResult_t r2 = braidAllGather(dev, gathered, n, braidFloat32, comm, s);
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess || r1 != braidSuccess || r2 != braidSuccess) {
      report(rank, std::string("capture: ") + braidGetLastError(comm));
      return 16;
    }
    // Nothing ran at the capture.
    if (cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 17;
    if (host[0] != static_cast<float>(rank + 1)) return 18;
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return 19;
    std::vector<float> all(2 * n);
    float sum = 3.0f;
    for (int launch = 0; launch < 3; ++launch, sum *= 2) {
      if (cudaGraphLaunch(exec, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) return 20;
      if (cudaMemcpy(all.data(), gathered, 2 * n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 21;
      for (std::size_t i = 0; i < 2 * n; ++i)
        if (all[i] != sum) {
          report(rank, "launch " + std::to_string(launch) + ": element " + std::to_string(i) + " is " +
                           std::to_string(all[i]) + ", expected " + std::to_string(sum));
          return 22;
        }
    }
    // A fourth launch (12 + 12) and at once an ordinary call on the same stream (24 + 24), the
    // stream kept busy for 50 ms first so that the call is made before the graph's calls are reached.
    if (cudaLaunchHostFunc(s, [](void*) { usleep(50000); }, nullptr) != cudaSuccess) return 23;
    if (cudaGraphLaunch(exec, s) != cudaSuccess) return 23;
    if (braidAllReduce(dev, dev, n, braidFloat32, braidSum, comm, s) != braidSuccess) return 24;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 25;
    if (cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 26;
    if (cudaMemcpy(all.data(), gathered, 2 * n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 27;
    for (std::size_t i = 0; i < n; ++i)
      if (host[i] != 48.0f || all[i] != 24.0f || all[n + i] != 24.0f) {
        report(rank, "after the fourth launch: " + std::to_string(all[i]) + " gathered, " + std::to_string(host[i]) +
                         " all-reduced; expected 24 and 48");
        return 28;
      }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    cudaFree(dev);
    cudaFree(gathered);
    return 0;
  }, env);
  expectEveryRankSucceeded(outcome);
}
TEST(GpuGraphs, CapturedCallsRunAtEveryLaunch) { expectCapturedCallsRunAtEveryLaunch({}); }
TEST(GpuGraphs, CapturedStagedCallsRunAtEveryLaunch) { expectCapturedCallsRunAtEveryLaunch({{"BRAID_CUDA_IPC", "0"}}); }

// Device memory on rank 0 and host memory on rank 1 in one call (`call` makes it with n float32 on
// either): not supported (as in NCCL), but it must end in an error on both ranks, not in a hang, and
// rank 1's must name the kind of memory.
void expectMixedMemoryFails(std::size_t n, braidResult_t (*call)(int rank, void* dev, float* host, std::size_t n, braidComm_t)) {
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    std::vector<float> host(n, 1.0f);
    void* dev = nullptr;
    if (cudaMalloc(&dev, n * sizeof(float)) != cudaSuccess) return 10;
    braidResult_t res = call(rank, dev, host.data(), n, comm);
    if (rank == 0) {  // asynchronous: the failure shows afterwards
      cudaDeviceSynchronize();
      braidCommGetAsyncError(comm, &res);
    }
    const std::string why = braidGetLastError(comm);
    report(rank, std::string("as expected: ") + braidGetErrorString(res) + ": " + why);
    if (res == braidSuccess) return 11;
    if (rank == 1 && why.find("kind of memory") == std::string::npos) return 12;
    return 0;
  }, {{"BRAID_TIMEOUT", "20"}}, 120);
  expectEveryRankSucceeded(outcome);
}

TEST(GpuArguments, HostMemoryOnOneRankAndDeviceOnAnotherIsAnErrorNotAHang) {
  expectMixedMemoryFails(1 << 18, [](int rank, void* dev, float* host, std::size_t n, braidComm_t comm) {
    return rank == 0 ? braidAllReduce(dev, dev, n, braidFloat32, braidSum, comm, nullptr)
                     : braidAllReduce(host, host, n, braidFloat32, braidSum, comm, nullptr);
  });
}

// Send/recv above BRAID_BUFFSIZE: the receiver copies from the sender's buffer through CUDA IPC, except
// from memory that IPC cannot export (cudaMallocAsync's pool), which is staged, and (on the emulation,
// which can make the receiver's cudaIpcOpenMemHandle fail) where the receiver cannot map the offered
// buffer, which it answers with "stage it"; in either direction the data arrives exactly, in stream
// order, and a failed mapping is tried again on the next offer. Before each large transfer the
// receiver has finished a reduce as its leaf, whose messages (on channels 0 and 1) the sender has
// not received yet when it waits for the receiver's answer (so the answer must not queue behind
// them in a ring).
TEST(GpuSendRecv, LargeMessagesGoThroughIpcUnlessTheSendBufferCannotBeSharedOrMapped) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    const std::size_t n = (5u << 20) + 5;  // 20 MiB + 20 bytes of int32: above BRAID_BUFFSIZE, 5 pieces when staged
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 10;
    void *plain = nullptr, *pooled = nullptr;
    if (cudaMalloc(&plain, n * 4) != cudaSuccess || cudaMallocAsync(&pooled, n * 4, s) != cudaSuccess) return 11;
    // Rank 0 sends from pool memory (staged) and receives into it; rank 1 sends from plain memory (IPC).
    void* mine = rank == 0 ? pooled : plain;
    std::vector<std::int32_t> h(n);
    // A reduce of host memory rooted at the sender, before each transfer: the receiver, a leaf, sends
    // its part over both channels and is done; the sender reads it only after the transfer.
    std::vector<float> part(1 << 17, static_cast<float>(rank + 1)), sum(part.size());
    const auto reduceTo = [&](int root) {
      return braidReduce(part.data(), sum.data(), part.size(), braidFloat32, braidSum, root, comm, nullptr) == braidSuccess &&
             (rank != root || sum[12345] == 3.0f);
    };
    // One transfer from rank `from` of element i = i * mul + add, into a poisoned receive buffer;
    // 0, or the failing step's code (codes from `base` up).
    const auto transfer = [&](int from, std::int32_t mul, std::int32_t add, int base, const char* how) -> int {
      const bool sends = rank == from;
      if (sends) {
        for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<std::int32_t>(i) * mul + add;
        if (cudaMemcpyAsync(mine, h.data(), n * 4, cudaMemcpyHostToDevice, s) != cudaSuccess) return base;
      } else {
        if (cudaMemsetAsync(mine, 0xEE, n * 4, s) != cudaSuccess) return base;
        if (!reduceTo(from)) return base + 1;
      }
      const braidResult_t x = sends ? braidSend(mine, n, braidInt32, 1 - rank, comm, s) : braidRecv(mine, n, braidInt32, from, comm, s);
      if (x != braidSuccess) return base + 2;
      if (sends && !reduceTo(from)) return base + 3;
      if (!sends && cudaMemcpyAsync(h.data(), mine, n * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess) return base + 4;
      if (cudaStreamSynchronize(s) != cudaSuccess) return base + 5;
      for (std::size_t i = 0; i < n && !sends; ++i)
        if (h[i] != static_cast<std::int32_t>(i) * mul + add)
          return report(rank, "wrong element " + std::to_string(i) + " " + how), base + 6;
      return 0;
    };
    if (int code = transfer(0, 7, 0, 20, "from the staged send")) return code;
    const auto failIpcOpens = failIpcOpensHook();
    if (failIpcOpens && rank == 0) failIpcOpens(1);
    if (int code = transfer(1, 3, 5, 30, failIpcOpens ? "after the receiver failed to map the offer" : "through IPC")) return code;
    if (int code = transfer(1, -11, 2, 40, "through IPC")) return code;
    const std::uint64_t ipc = comm->impl->cudaIpcCalls(), want = failIpcOpens ? 1 : 2;
    if (ipc != want)
      return report(rank, "send/recv through CUDA IPC: " + std::to_string(ipc) + ", expected " + std::to_string(want)), 12;
    cudaFreeAsync(pooled, s);
    cudaStreamSynchronize(s);
    cudaFree(plain);
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

// The same for a send/recv from BRAID_BUFFSIZE up (2 MiB): the device sender offers its buffer where
// the host receiver expects the data.
TEST(GpuSendRecv, DeviceMemoryToHostMemoryAboveBuffSizeIsAnErrorNotAHang) {
  expectMixedMemoryFails(1 << 19, [](int rank, void* dev, float* host, std::size_t n, braidComm_t comm) {
    return rank == 0 ? braidSend(dev, n, braidFloat32, 1, comm, nullptr) : braidRecv(host, n, braidFloat32, 0, comm, nullptr);
  });
}

// Staged all-reduces queued back to back on one stream, each larger than the one before, behind a
// delayed kernel: each call grows the proxy's pinned staging memory while the calls before it are
// queued or running. The outgrown buffers may be freed only once the proxy is idle: freeing pinned
// memory may synchronize the device, and the stream is held until the next call is done (a hang on
// a GPU; the emulation aborts, naming cudaHostUnregister). Every element of every call is checked.
TEST(GpuStaging, CallsQueuedBackToBackGrowTheStagingWhileEarlierOnesRun) {
  Env env = transportEnv("shm");
  env.push_back({"BRAID_TIMEOUT", "60"});
  env.push_back({"BRAID_CUDA_IPC", "0"});
  auto outcome = runRanks(
      2,
      [](int rank, braidComm_t comm) {
        const std::size_t counts[] = {1000, (64 << 10) + 1, 1 << 20, (3 << 20) + 5};  // float32: 4 KB to 12 MiB
        const DataType t = DataType::kFloat32;
        std::size_t total = 0;
        for (std::size_t c : counts) total += c;
        Dev d;
        if (!d.ensure(total * 4)) return report(rank, d.error), 10;
        std::size_t off = 0;
        for (std::size_t c : counts) {
          std::byte* in = d.a + off * 4;
          std::byte* out = d.b + off * 4;
          if (!d.put(in, c, t, ReduceOp::kSum, rank, 0, off * 4) || !d.poison(out, c * 4)) return report(rank, d.error), 12;
          braidResult_t res = braidAllReduce(in, out, c, braidFloat32, braidSum, comm, d.stream);
          if (res != braidSuccess) return report(rank, std::string("allreduce: ") + braidGetLastError(comm)), 13;
          off += c;
        }
        const std::byte* h = d.take(d.b, total * 4);
        if (!h) return report(rank, d.error), 14;
        std::size_t wrong = 0;
        off = 0;
        for (std::size_t c : counts) {
          const std::size_t w = pattern::countWrong(h + off * 4, c, t, ReduceOp::kSum, 2, 0);
          if (w) report(rank, "count " + std::to_string(c) + ": " + std::to_string(w) + " wrong elements");
          wrong += w;
          off += c;
        }
        return wrong ? 2 : 0;
      },
      env, 300);
  expectEveryRankSucceeded(outcome);
}

// The first device call's agreement, where one rank cannot map a peer's scratch (emulation only):
// CUDA IPC is off on every rank, every call is staged and exact, and the rank that did map the other's
// scratch unmaps it only once its proxy is idle (unmapping during the call, while the stream is held,
// makes the emulation abort in cudaIpcCloseMemHandle).
TEST(GpuStaging, ARankThatCannotMapAPeerAtTheAgreementTurnsIpcOffOnEveryRank) {
  const auto failIpcOpens = failIpcOpensHook();
  if (!failIpcOpens) GTEST_SKIP() << "needs the CUDA emulation, whose cudaIpcOpenMemHandle can be made to fail";
  auto outcome = runRanks(
      2,
      [&](int rank, braidComm_t comm) {
        if (rank == 1) failIpcOpens(1);
        Dev d;
        for (std::size_t count : {std::size_t{1000}, std::size_t{(1 << 20) + 3}}) {  // one-shot size, then above it
          if (!d.ensure(count * 4) || !d.put(d.a, count, DataType::kFloat32, ReduceOp::kSum, rank) || !d.poison(d.b, count * 4))
            return report(rank, d.error), 10;
          if (braidAllReduce(d.a, d.b, count, braidFloat32, braidSum, comm, d.stream) != braidSuccess)
            return report(rank, std::string("allreduce: ") + braidGetLastError(comm)), 11;
          const std::byte* h = d.take(d.b, count * 4);
          if (!h) return report(rank, d.error), 12;
          if (std::size_t w = pattern::countWrong(h, count, DataType::kFloat32, ReduceOp::kSum, 2, 0))
            return report(rank, std::to_string(w) + " wrong elements of " + std::to_string(count)), 2;
        }
        if (comm->impl->cudaIpcCalls() != 0) return report(rank, "a call went through CUDA IPC"), 13;
        return 0;
      },
      {{"BRAID_TIMEOUT", "60"}}, 180);
  expectEveryRankSucceeded(outcome);
}

// The C++ API: device buffers with a stream, braid::Work finishing with the call; host work queued
// after device work runs after it on every rank.
TEST(GpuCpp, WorkOnDeviceBuffersAndHostCallsAfterThem) {
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    braid::Communicator c(comm->impl);
    cudaStream_t s = nullptr;
    if (cudaStreamCreate(&s) != cudaSuccess) return 10;
    const std::size_t n = 100003;
    void* dev = nullptr;
    if (cudaMalloc(&dev, n * 4) != cudaSuccess) return 11;
    std::vector<int> h(n, rank + 1);
    if (cudaMemcpy(dev, h.data(), n * 4, cudaMemcpyHostToDevice) != cudaSuccess) return 12;
    braid::Work w = c.allReduce(dev, dev, n, DataType::kInt32, ReduceOp::kSum, s);
    std::vector<int> hostIn(10, rank), hostOut(10, -1);
    braid::Work hw = c.allReduce(hostIn.data(), hostOut.data(), 10, DataType::kInt32, ReduceOp::kMax);
    if (!w.wait(60).ok() || !hw.wait(60).ok()) return 13;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 14;
    if (cudaMemcpy(h.data(), dev, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return 15;
    for (std::size_t i = 0; i < n; ++i)
      if (h[i] != 6) return 16;
    if (hostOut[3] != 2) return 17;
    cudaFree(dev);
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

// A stream that does not reach the call within BRAID_TIMEOUT: the call itself returned success, the
// failure shows in braidCommGetAsyncError and in the next call, on every rank.
TEST(GpuErrors, AsynchronousFailureIsReportedLater) {
  auto outcome = runRanks(2, [](int rank, braidComm_t comm) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 10;
    void *dev = nullptr, *src = nullptr;
    if (cudaMalloc(&dev, 4096) != cudaSuccess || cudaMalloc(&src, 4096) != cudaSuccess) return 11;
    if (rank == 0) launchDelayedCopy(dev, src, 4096, 4000000, s);  // holds the stream for ~4 s
    if (braidAllReduce(dev, dev, 1024, braidFloat32, braidSum, comm, s) != braidSuccess) return 12;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 13;
    braidResult_t async = braidSuccess;
    if (braidCommGetAsyncError(comm, &async) != braidSuccess) return 14;
    if (async == braidSuccess) {
      report(rank, "no asynchronous error after the stream missed BRAID_TIMEOUT");
      return 15;
    }
    if (braidAllReduce(dev, dev, 1024, braidFloat32, braidSum, comm, s) == braidSuccess) return 16;
    report(rank, std::string("as expected: ") + braidGetErrorString(async) + ": " + braidGetLastError(comm));
    return 0;
  }, {{"BRAID_TIMEOUT", "1"}}, 60);
  expectEveryRankSucceeded(outcome);
}

// The gradient layer (braid::ddp) on device parameters, 3 ranks, 3 buckets (1 MiB + 4 bytes,
// 16 KiB + 12 and 20 bytes), float32 gradients with integer values (exact averages):
//  - create() gives every rank rank 0's parameter values;
//  - a step's averages arrive in the gradients in stream order: each gradient is written by a
//    delayed kernel just before its markReady (a copy that did not wait for it would send poison),
//    and read by a kernel queued after finish();
//  - a parameter one rank did not mark is an error on every rank, and the next step works;
//  - with views, the gradients are written and read in the buckets themselves;
//  - with bfloat16 on the wire and the finite check, a NaN on one rank is an error on every rank,
//    and the next step is exact.
TEST(GpuDdp, DeviceGradientsAreAveragedInStreamOrder) {
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    braid::Communicator c(comm->impl);
    const std::vector<std::size_t> counts = {5, 4099, (1u << 18) + 1};
    const std::size_t k = counts.size();
    Dev d;
    if (!d.ensure(counts[2] * 4)) return report(rank, d.error), 10;
    std::vector<void*> data(k), grad(k), src(k);
    for (std::size_t i = 0; i < k; ++i)
      for (void** p : {&data[i], &grad[i], &src[i]})
        if (cudaMalloc(p, counts[i] * 4) != cudaSuccess) return 11;
    std::vector<float> h;
    // Element j of parameter i on rank r: (j % 7 + i + 1) * 3 * (r + 1) * scale; the average over the
    // 3 ranks is then (j % 7 + i + 1) * 6 * scale.
    const auto value = [](std::size_t i, std::size_t j, int r, float scale) {
      return static_cast<float>((j % 7 + i + 1) * 3 * static_cast<std::size_t>(r + 1)) * scale;
    };
    const auto upload = [&](void* dst, std::size_t i, int r, float scale) {
      h.resize(counts[i]);
      for (std::size_t j = 0; j < counts[i]; ++j) h[j] = value(i, j, r, scale);
      // (From pageable memory cudaMemcpy may return before the data lands; the legacy stream's sync
      // waits for it, not for the test's non-blocking stream.)
      return cudaMemcpy(dst, h.data(), counts[i] * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaStreamSynchronize(nullptr) == cudaSuccess;
    };
    // Parameter i's gradient written on the stream by a kernel that sleeps first, over poison.
    const auto writeLate = [&](void* dst, std::size_t i, float scale) {
      if (!upload(src[i], i, rank, scale) || cudaMemsetAsync(dst, 0xEE, counts[i] * 4, d.stream) != cudaSuccess) return false;
      launchDelayedCopy(dst, src[i], counts[i] * 4, kDelayUs, d.stream);
      return cudaGetLastError() == cudaSuccess;
    };
    // Whether `p` holds f(j) for every element j of parameter i, read by a kernel on the stream.
    const auto holds = [&](const void* p, std::size_t i, const std::function<float(std::size_t)>& f, const char* what) {
      const auto* got = reinterpret_cast<const float*>(d.take(static_cast<const std::byte*>(p), counts[i] * 4));
      if (!got) return report(rank, d.error), false;
      for (std::size_t j = 0; j < counts[i]; ++j)
        if (got[j] != f(j))
          return report(rank, std::string(what) + ": parameter " + std::to_string(i) + " element " + std::to_string(j) +
                                  " is " + std::to_string(got[j]) + ", expected " + std::to_string(f(j))), false;
      return true;
    };
    std::vector<ddp::Parameter> params(k);
    for (std::size_t i = 0; i < k; ++i) {
      if (!upload(data[i], i, rank, 1.0f)) return 12;
      params[i] = {std::string(1, 'p').append(std::to_string(i)), data[i], grad[i], counts[i], DataType::kFloat32,
                   ddp::MemoryType::kDevice};  // (not "p" + ...: GCC 12's -Wrestrict misfires on it at -O3)
    }
    ddp::GradSyncOptions o;
    o.firstBucketCapBytes = 1 << 10;
    o.bucketCapBytes = 1 << 14;
    o.stream = d.stream;
    auto sync = ddp::GradSync::create(c, params, o);
    if (!sync.ok()) return report(rank, sync.status().toString()), 13;
    if (sync->buckets().size() != 3) return report(rank, "expected 3 buckets"), 14;
    for (std::size_t i = 0; i < k; ++i)
      if (!holds(data[i], i, [&](std::size_t j) { return value(i, j, 0, 1.0f); }, "after create")) return 15;
    // Two steps; in the first, rank 2 does not mark parameter 1.
    for (int step = 0; step < 2; ++step) {
      const std::uint64_t ipcBefore = comm->impl->cudaIpcCalls();
      for (std::size_t i = k; i-- > 0;) {
        if (!writeLate(grad[i], i, static_cast<float>(step + 1))) return 16;
        if (step == 0 && rank == 2 && i == 1) continue;
        if (Status m = sync->markReady(i); !m.ok()) return report(rank, m.toString()), 17;
      }
      Status f = sync->finish();
      if (step == 0) {
        if (f.code() != Code::kInvalidUsage || f.message().find("'p1'") == std::string::npos ||
            f.message().find("rank 2") == std::string::npos)
          return report(rank, "expected the unmarked parameter on every rank, got: " + f.toString()), 18;
        continue;
      }
      if (!f.ok()) return report(rank, f.toString()), 19;
      for (std::size_t i = 0; i < k; ++i)
        if (!holds(grad[i], i, [&](std::size_t j) { return value(i, j, 0, 2.0f) * 2; }, "a step's average")) return 20;
      if (comm->impl->cudaIpcCalls() < ipcBefore + 3) return report(rank, "the buckets did not go through CUDA IPC"), 21;
    }
    // Views: the gradients live in the buckets.
    for (auto& p : params) p.grad = nullptr;
    o.gradientsAsBucketViews = true;
    auto views = ddp::GradSync::create(c, params, o);
    if (!views.ok()) return report(rank, views.status().toString()), 22;
    for (std::size_t i = k; i-- > 0;) {
      if (!writeLate(views->gradient(i), i, 3.0f)) return 23;
      if (Status m = views->markReady(i); !m.ok()) return report(rank, m.toString()), 24;
    }
    if (Status f = views->finish(); !f.ok()) return report(rank, f.toString()), 25;
    for (std::size_t i = 0; i < k; ++i)
      if (!holds(views->gradient(i), i, [&](std::size_t j) { return value(i, j, 0, 3.0f) * 2; }, "with views")) return 26;
    // bfloat16 on the wire (narrowed and widened by kernels), with the finite check: a NaN on rank 1
    // is an error on every rank, and the next step's averages are exact (every value below fits
    // bfloat16's 8 bits).
    for (std::size_t i = 0; i < k; ++i) params[i].grad = grad[i];
    o.gradientsAsBucketViews = false;
    o.wireFormat = ddp::WireFormat::kBfloat16;
    o.checkFinite = true;
    auto narrow = ddp::GradSync::create(c, params, o);
    if (!narrow.ok()) return report(rank, narrow.status().toString()), 27;
    static const float kNan = std::numeric_limits<float>::quiet_NaN();
    for (int step = 0; step < 2; ++step) {
      for (std::size_t i = k; i-- > 0;) {
        if (!writeLate(grad[i], i, 4.0f)) return 28;
        if (step == 0 && rank == 1 && i == 2 &&
            cudaMemcpyAsync(static_cast<float*>(grad[i]) + 17, &kNan, 4, cudaMemcpyHostToDevice, d.stream) != cudaSuccess)
          return 29;
        if (Status m = narrow->markReady(i); !m.ok()) return report(rank, m.toString()), 30;
      }
      Status f = narrow->finish();
      if (step == 0) {
        if (f.code() != Code::kInvalidArgument || f.message().find("'p2'") == std::string::npos ||
            f.message().find("NaN or Inf on rank 1") == std::string::npos)
          return report(rank, "expected rank 1's NaN on every rank, got: " + f.toString()), 31;
        continue;
      }
      if (!f.ok()) return report(rank, f.toString()), 32;
      for (std::size_t i = 0; i < k; ++i)
        if (!holds(grad[i], i, [&](std::size_t j) { return value(i, j, 0, 4.0f) * 2; }, "through bfloat16")) return 33;
    }
    for (std::size_t i = 0; i < k; ++i)
      for (void* p : {data[i], grad[i], src[i]}) cudaFree(p);
    return 0;
  }, {{"BRAID_TIMEOUT", "60"}}, 300);
  expectEveryRankSucceeded(outcome);
}

// A buffer that one rank cannot map after the ranks agreed on CUDA IPC (on the emulation, whose
// cudaIpcOpenMemHandle can be made to fail): the call fails on every rank within moments, not at
// BRAID_TIMEOUT, and every rank's error names the rank that failed, the CUDA call and the knob. As
// with NCCL's asynchronous errors, the communicator is failed from then on.
TEST(GpuErrors, ABufferARankCannotMapFailsTheCallOnEveryRankNamingIt) {
  const auto failIpcOpens = failIpcOpensHook();
  if (!failIpcOpens) GTEST_SKIP() << "needs the CUDA emulation, whose cudaIpcOpenMemHandle can be made to fail";
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    const std::size_t n = 1 << 20;  // 4 MiB: above the one-shot size, so the call maps the user's buffers
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 10;
    void *first = nullptr, *second = nullptr;
    if (cudaMalloc(&first, n * 4) != cudaSuccess || cudaMalloc(&second, n * 4) != cudaSuccess) return 11;
    // The first call agrees on CUDA IPC and maps `first`; `second` is a new allocation, mapped by the next.
    if (braidAllReduce(first, first, n, braidFloat32, braidSum, comm, s) != braidSuccess) return 12;
    if (cudaStreamSynchronize(s) != cudaSuccess || comm->impl->cudaIpcCalls() != 1) return 13;
    if (rank == 1) failIpcOpens(1);
    const auto start = std::chrono::steady_clock::now();
    if (braidAllReduce(second, second, n, braidFloat32, braidSum, comm, s) != braidSuccess) return 14;  // (asynchronous)
    cudaStreamSynchronize(s);
    braidResult_t async = braidSuccess;
    if (braidCommGetAsyncError(comm, &async) != braidSuccess) return 15;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string why = braidGetLastError(comm);
    report(rank, "as expected after " + std::to_string(seconds) + " s: " + braidGetErrorString(async) + ": " + why);
    if (async == braidSuccess) return 16;
    if (seconds > 10) return 17;  // BRAID_TIMEOUT is 30
    for (const char* part : {"rank 1", "cudaIpcOpenMemHandle", "BRAID_CUDA_IPC=0", "allreduce"})
      if (why.find(part) == std::string::npos) return report(rank, std::string("the error does not name ") + part), 18;
    return 0;
  }, {{"BRAID_TIMEOUT", "30"}}, 120);
  expectEveryRankSucceeded(outcome);
}

}  // namespace
}  // namespace braid::test

int main(int argc, char** argv) {
  braid::test::skipWithoutGpu("gpu-collectives");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
