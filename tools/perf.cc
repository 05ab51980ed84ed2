// `braid perf`: nccl-tests' table for Braid's collectives, run under any launcher. Times are the
// slowest rank's mean per iteration; algbw = size / time; busbw = algbw times nccl-tests' factor
// (all-reduce 2(n-1)/n; all-gather and reduce-scatter (n-1)/n; broadcast, reduce, sendrecv 1), so
// the numbers paste beside NCCL's.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "comm/config.h"
#include "kernels/reduce.h"
#include "tools/pattern.h"
#include "tools/tools.h"

namespace braid::tools {
namespace {

struct Options {
  std::string coll = "allreduce";
  std::size_t minBytes = 8, maxBytes = 32u << 20;
  double factor = 2;
  std::size_t step = 0;
  int iters = 20, warmup = 5, check = 1, root = 0;
  std::string dtype = "float", op = "sum";
};

const char* kUsage =
    "usage: braid perf COLLECTIVE [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
    "                  [-c 0|1] [-d DTYPE] [-o OP] [-r ROOT] [-a ring|tree] [--transport shm|tcp]\n"
    "  COLLECTIVE: allreduce allgather reducescatter broadcast reduce sendrecv barrier\n"
    "  run it under a launcher: braid run -n 4 braid perf allreduce -b 8 -e 64M\n";

struct TypeName { const char* name; braidDataType_t t; };
const TypeName kTypes[] = {{"int8", braidInt8}, {"uint8", braidUint8}, {"int32", braidInt32}, {"int", braidInt32},
                           {"uint32", braidUint32}, {"int64", braidInt64}, {"uint64", braidUint64},
                           {"half", braidFloat16}, {"float16", braidFloat16}, {"float", braidFloat32},
                           {"float32", braidFloat32}, {"double", braidFloat64}, {"float64", braidFloat64},
                           {"bfloat16", braidBfloat16}};
const char* kOps[] = {"sum", "prod", "max", "min", "avg"};

double busFactor(const std::string& coll, int n) {
  if (coll == "allreduce") return 2.0 * (n - 1) / n;
  if (coll == "allgather" || coll == "reducescatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int fail(const char* what, braidResult_t r, braidComm_t comm) {
  std::fprintf(stderr, "braid perf: %s failed: %s (%s)\n", what, braidGetErrorString(r), braidGetLastError(comm));
  return 1;
}

}  // namespace

int runPerf(int argc, char** argv) {
  Options o;
  int i = 1;
  if (i < argc && argv[i][0] != '-') o.coll = argv[i++];
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    auto size = [&](std::size_t* out) {
      auto s = v ? parseSize(v) : Result<std::size_t>(Status::InvalidArgument("missing value"));
      if (!s.ok()) { std::fprintf(stderr, "braid perf: %s: %s\n", a.c_str(), s.status().message().c_str()); return false; }
      *out = *s;
      return true;
    };
    if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); return 0; }
    if (a == "--transport") {
      v = next();
      if (!v || (std::strcmp(v, "shm") && std::strcmp(v, "tcp"))) { std::fprintf(stderr, "braid perf: --transport takes shm or tcp\n"); return 2; }
      setenv("BRAID_SHM_DISABLE", std::strcmp(v, "tcp") == 0 ? "1" : "0", 1);
      continue;
    }
    v = next();
    if (!v) { std::fprintf(stderr, "braid perf: %s needs a value\n%s", a.c_str(), kUsage); return 2; }
    bool ok = true;
    if (a == "-b") ok = size(&o.minBytes);
    else if (a == "-e") ok = size(&o.maxBytes);
    else if (a == "-f") o.factor = std::atof(v);
    else if (a == "-i") ok = size(&o.step);
    else if (a == "-n") o.iters = std::atoi(v);
    else if (a == "-w") o.warmup = std::atoi(v);
    else if (a == "-c") o.check = std::atoi(v);
    else if (a == "-d") o.dtype = v;
    else if (a == "-o") o.op = v;
    else if (a == "-r") o.root = std::atoi(v);
    else if (a == "-a") setenv("BRAID_ALGO", v, 1);
    else { std::fprintf(stderr, "braid perf: unknown option %s\n%s", a.c_str(), kUsage); return 2; }
    if (!ok) return 2;
  }
  const char* known[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv", "barrier"};
  bool collOk = false;
  for (const char* k : known) collOk |= o.coll == k;
  const TypeName* type = nullptr;
  for (const TypeName& t : kTypes) if (o.dtype == t.name) type = &t;
  int opIdx = -1;
  for (int k = 0; k < 5; ++k) if (o.op == kOps[k]) opIdx = k;
  if (!collOk || !type || opIdx < 0 || o.iters < 1 || o.warmup < 0 || (o.step == 0 && !(o.factor > 1)) || o.minBytes > o.maxBytes) {
    std::fprintf(stderr, "braid perf: bad arguments\n%s", kUsage);
    return 2;
  }

  braidComm_t comm;
  braidResult_t r = braidCommInitFromEnv(&comm);
  if (r != braidSuccess) return fail("communicator creation", r, nullptr);
  int rank, n;
  braidCommUserRank(comm, &rank);
  braidCommCount(comm, &n);
  if (o.root < 0 || o.root >= n) { std::fprintf(stderr, "braid perf: root %d is outside 0..%d\n", o.root, n - 1); return 2; }
  const DataType dt = static_cast<DataType>(type->t);
  const ReduceOp op = static_cast<ReduceOp>(opIdx);
  const std::size_t es = dataTypeSize(dt);
  const bool gathered = o.coll == "allgather" || o.coll == "reducescatter";
  const std::size_t unit = es * (gathered ? static_cast<std::size_t>(n) : 1);
  std::vector<std::byte> sendBuf(o.maxBytes + 64), recvBuf(o.maxBytes + 64);  // zero-filled: pages touched once

  if (rank == 0) {
    std::printf("# braid perf %s: %d ranks, iters %d, warmup %d, validation %d, dtype %s, op %s, root %d\n",
                o.coll.c_str(), n, o.iters, o.warmup, o.check, o.dtype.c_str(), o.op.c_str(), o.root);
    std::printf("# algorithm: %s; reduce kernels: %s\n", describeAlgoSetting().c_str(), kernels::isaName());
  }
  printTransportSummary(comm, rank, n);

  int peer = rank ^ 1;  // sendrecv pairs ranks 0-1, 2-3, ...; an odd last rank sits out
  auto runOnce = [&](const void* s, void* rv, std::size_t count) -> braidResult_t {
    braidDataType_t t = type->t;
    braidRedOp_t ro = static_cast<braidRedOp_t>(opIdx);
    if (o.coll == "allreduce") return braidAllReduce(s, rv, count, t, ro, comm, nullptr);
    if (o.coll == "allgather") return braidAllGather(s, rv, count / static_cast<std::size_t>(n), t, comm, nullptr);
    if (o.coll == "reducescatter") return braidReduceScatter(s, rv, count / static_cast<std::size_t>(n), t, ro, comm, nullptr);
    if (o.coll == "broadcast") return braidBroadcast(s, rv, count, t, o.root, comm, nullptr);
    if (o.coll == "reduce") return braidReduce(s, rv, count, t, ro, o.root, comm, nullptr);
    if (o.coll == "barrier") return braidBarrier(comm);
    if (peer >= n) return braidSuccess;
    return (rank & 1) ? braidRecv(rv, count, t, peer, comm, nullptr)
                      : braidSend(s, count, t, peer, comm, nullptr);
  };

  if (rank == 0) {
    std::printf("#\n# %10s %12s %8s %6s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "", "", "", "", "", "out-of-place", "",
                "", "", "in-place", "", "", "");
    std::printf("# %10s %12s %8s %6s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
                "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  std::size_t totalWrong = 0;
  double busSum = 0;
  int rows = 0;
  for (std::size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
    std::size_t count = bytes / unit * (gathered ? static_cast<std::size_t>(n) : 1);  // elements of the whole array
    std::size_t shown = count * es;
    double times[2];
    std::size_t wrong[2] = {0, 0};
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      std::byte* recv = recvBuf.data();
      std::size_t perRank = gathered ? count / static_cast<std::size_t>(n) : count;
      std::byte* send = sendBuf.data();
      if (inPlace) {
        send = recv;
        if (o.coll == "allgather") send = recv + static_cast<std::size_t>(rank) * perRank * es;
      }
      auto setup = [&] {
        if (o.coll == "allgather") pattern::fill(send, perRank, dt, op, rank, static_cast<std::size_t>(rank) * perRank);
        else pattern::fill(send, count, dt, op, rank, 0);
      };
      void* out = recv;
      if (o.coll == "reducescatter" && inPlace) out = send + static_cast<std::size_t>(rank) * perRank * es;
      for (int w = 0; w < o.warmup; ++w)
        if ((r = runOnce(send, out, count)) != braidSuccess) return fail(o.coll.c_str(), r, comm);
      braidBarrier(comm);
      double t0 = now();
      for (int it = 0; it < o.iters; ++it)
        if ((r = runOnce(send, out, count)) != braidSuccess) return fail(o.coll.c_str(), r, comm);
      double mine = (now() - t0) / o.iters * 1e6;
      double slowest = 0;
      braidAllReduce(&mine, &slowest, 1, braidFloat64, braidMax, comm, nullptr);
      times[inPlace] = slowest;
      if (o.check && o.coll != "barrier") {
        setup();
        if ((r = runOnce(send, out, count)) != braidSuccess) return fail(o.coll.c_str(), r, comm);
        std::size_t w = 0;
        if (o.coll == "allreduce") w = pattern::countWrong(out, count, dt, op, n, 0);
        else if (o.coll == "reducescatter") w = pattern::countWrong(out, perRank, dt, op, n, static_cast<std::size_t>(rank) * perRank);
        else if (o.coll == "reduce" && rank == o.root) w = pattern::countWrong(out, count, dt, op, n, 0);
        else if (o.coll == "broadcast") w = pattern::countWrong(out, count, dt, op, n, 0, o.root);
        else if (o.coll == "allgather")
          for (int q = 0; q < n; ++q)
            w += pattern::countWrong(recv + static_cast<std::size_t>(q) * perRank * es, perRank, dt, op, n,
                                     static_cast<std::size_t>(q) * perRank, q);
        else if (o.coll == "sendrecv" && (rank & 1) && peer < n) w = pattern::countWrong(out, count, dt, op, n, 0, peer);
        std::uint64_t mineW = w, allW = 0;
        braidAllReduce(&mineW, &allW, 1, braidUint64, braidSum, comm, nullptr);
        wrong[inPlace] = allW;
        totalWrong += allW;
      }
    }
    if (rank == 0) {
      double f = busFactor(o.coll, n);
      double alg[2] = {shown / times[0] / 1e3, shown / times[1] / 1e3};
      std::printf("  %10zu %12zu %8s %6s %6d %9.2f %8.2f %8.2f %6zu %9.2f %8.2f %8.2f %6zu\n", shown, count,
                  o.dtype.c_str(), o.op.c_str(), (o.coll == "broadcast" || o.coll == "reduce") ? o.root : -1,
                  times[0], alg[0], alg[0] * f, wrong[0], times[1], alg[1], alg[1] * f, wrong[1]);
      std::fflush(stdout);
      busSum += (alg[0] + alg[1]) * f;
      rows += 2;
    }
    std::size_t nextBytes = o.step ? bytes + o.step : static_cast<std::size_t>(std::ceil(static_cast<double>(bytes) * o.factor));
    if (nextBytes <= bytes) break;
    bytes = nextBytes;
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %zu %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n#\n", rows ? busSum / rows : 0.0);
  }
  braidCommDestroy(comm);
  return totalWrong ? 1 : 0;
}

}  // namespace braid::tools
