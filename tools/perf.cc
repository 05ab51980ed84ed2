// `braid perf`: nccl-tests' table for Braid's collectives, run under any launcher. Times are each
// rank's mean per call, combined over the ranks as -a says (the average by default, as nccl-tests);
// algbw = size / time; busbw = algbw times nccl-tests' factor (all-reduce 2(n-1)/n; all-gather,
// reduce-scatter and all-to-all (n-1)/n; broadcast, reduce, sendrecv 1), so the numbers paste
// beside NCCL's. The statistics behind -a, -I, the straggler, --split and --compare are in
// tools/perf_stats.h.
//
// With -c 1 every iteration's result is checked element by element against the CPU reference
// (tools/pattern.h). Checking is not timed: each iteration then runs alone (inputs refilled, a
// barrier, the timed call, the check), which adds the barrier's skew to the time; -c 0 times the
// iterations back to back.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid_version.h"
#include "comm/introspect.h"
#include "base/config.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"
#include "tools/pattern.h"
#include "tools/perf_device.h"
#include "tools/perf_floor.h"
#include "tools/perf_plot.h"
#include "tools/perf_report.h"
#include "tools/tools.h"

namespace braid::tools {
namespace {

const char* kUsage =
    "usage: braid perf COLLECTIVE [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
    "                  [-c 0|1] [-d DTYPE|all] [-o OP|all] [-r ROOT] [-a 0|1|2|3] [-m AGG] [-z 0|1] [-C 0|1]\n"
    "                  [-T SECONDS] [-u BYTES] [-I 0|1] [-K SKIP] [--per-rank] [--floor] [-G LAUNCHES] [-R 0|1]\n"
    "                  [--split 'OP VALUE']\n"
    "                  [--algo ring|tree|oneshot|hier|bruck] [--transport shm|tcp] [--mem user|braid] [--device host|cuda]\n"
    "                  [--json FILE] [--plot FILE.svg [--plot-with RUN.json ...]]\n"
    "       braid perf --compare RUN.json RUN.json ...\n"
    "  -a 0|1|2|3: the time column is rank 0's mean time per call (0), the average over ranks (1, the\n"
    "          default, as nccl-tests), the fastest rank's (2) or the slowest rank's (3)\n"
    "  -m AGG: with -c 0, AGG calls per timed iteration, the time divided by AGG (nccl-tests' aggregation)\n"
    "  -z 1: wait for each call before the next (host calls always do; --device cuda waits on the stream)\n"
    "  -C 1: the time column is the process's CPU time per call (every Braid thread), not the wall time\n"
    "  -T SECONDS: BRAID_TIMEOUT for this run: a call that does not finish in time fails, naming the ranks\n"
    "  -u BYTES: both buffers start BYTES (0-63) past a 64-byte boundary (misaligned buffers)\n"
    "  -I 1: per-iteration statistics for each size (min, p50, p99, max and the coefficient of variation,\n"
    "          over the slowest rank's time in each iteration), each rank's mean time and median busy time\n"
    "          (time in the call less the time it waited on a peer), and the straggler: the rank with the\n"
    "          longest busy time in most sizes, and by how much (its busy median over the median rank's)\n"
    "  -K SKIP: leave the first SKIP iterations out of -I's statistics and the busy medians\n"
    "  --per-rank: the per-rank times and the straggler line, without -I's statistics\n"
    "  --floor: first measure the machine's limits (each rank's copy and reduce rates at each size with every\n"
    "          rank at once, and the slowest stream between ranks of two hosts); a %floor column gives busbw\n"
    "          as a share of what they allow the collective, whatever its algorithm\n"
    "  -G LAUNCHES: with --device cuda and -c 0, the -n iterations' calls are captured into one CUDA graph,\n"
    "          launched LAUNCHES times (the time per call over all of them)\n"
    "  -R 0|1: 1 takes the buffers from braidMemAlloc (registered with Braid; as --mem braid), 0 from the heap\n"
    "  --split 'OP VALUE': parallel communicators by color = rank OP VALUE, OP one of AND OR MOD DIV\n"
    "          (nccl-tests' NCCL_TESTS_SPLIT); every group runs the sweep at once, figures over all ranks\n"
    "  --algo (or -a with a name): BRAID_ALGO for the run\n"
    "  --mem braid: buffers from braidMemAlloc (zero-copy all-reduce between ranks of a host)\n"
    "  --device cuda: buffers in GPU memory (GPU LOCAL_RANK modulo the device count), calls on a CUDA stream;\n"
    "                 each timed call is waited for on the stream; checking copies the results to the host\n"
    "  --plot: busbw against size as SVG (log-log): this run's two columns, and the out-of-place\n"
    "          column of every earlier --json output given with --plot-with (repeatable)\n"
    "  --compare: earlier --json outputs side by side (time and busbw per size) with each run's busbw over\n"
    "          the first's; needs no launcher\n"
    "  COLLECTIVE: allreduce allgather reducescatter alltoall broadcast reduce sendrecv barrier\n"
    "  sizes take K, M, G suffixes; run it under a launcher: braid run -n 4 braid perf allreduce -b 8 -e 64M\n";

struct TypeName {
  const char* name;
  DataType t;
};
const TypeName kTypes[] = {{"int8", DataType::kInt8},       {"uint8", DataType::kUint8},
                           {"int32", DataType::kInt32},     {"uint32", DataType::kUint32},
                           {"int64", DataType::kInt64},     {"uint64", DataType::kUint64},
                           {"half", DataType::kFloat16},    {"float", DataType::kFloat32},
                           {"double", DataType::kFloat64},  {"bfloat16", DataType::kBfloat16},
                           {"f8e4m3", DataType::kFloat8e4m3}, {"f8e5m2", DataType::kFloat8e5m2},
                           {"int16", DataType::kInt16},     {"uint16", DataType::kUint16}};
const char* kOps[] = {"sum", "prod", "max", "min", "avg"};

bool isReduction(const std::string& c) { return c == "allreduce" || c == "reducescatter" || c == "reduce"; }

double busFactor(const std::string& coll, int n) {
  if (coll == "allreduce") return 2.0 * (n - 1) / n;
  if (coll == "allgather" || coll == "reducescatter" || coll == "alltoall") return static_cast<double>(n - 1) / n;
  return 1.0;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The process's CPU time (every thread: the caller's and Braid's), for -C 1.
double cpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Run {
  PerfOptions o;
  braidComm_t comm = nullptr;   // the collectives' communicator (rank 0's group with --split)
  braidComm_t world = nullptr;  // every rank: timing and the figures are gathered over it
  int rank = 0, n = 1;          // in `comm`
  int wrank = 0, wn = 1;        // in `world`
  std::vector<std::byte> sendStore, recvStore;  // --mem user
  std::byte* sendBuf = nullptr;
  std::byte* recvBuf = nullptr;
  std::vector<std::byte> sendMirror, recvMirror;  // --device cuda: host copies for filling and checking
  void* stream = nullptr;                          // --device cuda
  std::size_t capacity = 0;
  std::size_t totalWrong = 0;
  braidResult_t error = braidSuccess;

  int peer() const { return rank ^ 1; }  // sendrecv pairs 0-1, 2-3, ...; an odd last rank sits out
  bool onDevice() const { return o.device == "cuda"; }
  // The host memory where `p`'s data is prepared and checked: p itself, or its mirror (--device cuda).
  std::byte* host(std::byte* p) {
    if (!onDevice()) return p;
    if (p >= recvBuf && p < recvBuf + capacity) return recvMirror.data() + (p - recvBuf);
    return sendMirror.data() + (p - sendBuf);
  }
  void upload(std::byte* p, std::size_t bytes) {
    if (onDevice() && error == braidSuccess && !device::upload(p, host(p), bytes)) error = braidCudaError;
  }
  void download(std::byte* p, std::size_t bytes) {
    if (onDevice() && error == braidSuccess && !device::download(host(p), p, bytes)) error = braidCudaError;
  }
  void sync() {
    if (onDevice() && error == braidSuccess && !device::sync(stream)) error = braidCudaError;
  }

  braidResult_t call(DataType dt, ReduceOp op, const void* s, void* r, std::size_t count) {
    auto t = static_cast<braidDataType_t>(dt);
    auto ro = static_cast<braidRedOp_t>(op);
    const std::size_t per = count / static_cast<std::size_t>(n);
    const std::string& c = o.coll;
    void* st = stream;
    if (c == "allreduce") return braidAllReduce(s, r, count, t, ro, comm, st);
    if (c == "allgather") return braidAllGather(s, r, per, t, comm, st);
    if (c == "reducescatter") return braidReduceScatter(s, r, per, t, ro, comm, st);
    if (c == "alltoall") return braidAllToAll(s, r, per, t, comm, st);
    if (c == "broadcast") return braidBroadcast(s, r, count, t, o.root, comm, st);
    if (c == "reduce") return braidReduce(s, r, count, t, ro, o.root, comm, st);
    if (c == "barrier") return braidBarrier(comm);
    if (peer() >= n) return braidSuccess;
    return (rank & 1) ? braidRecv(r, count, t, peer(), comm, st) : braidSend(s, count, t, peer(), comm, st);
  }

  // Measures one column (out-of-place or in-place) of one row.
  PerfCell measure(DataType dt, ReduceOp op, std::size_t count, bool inPlace) {
    const std::size_t es = dataTypeSize(dt);
    const bool gathered = o.coll == "allgather" || o.coll == "reducescatter" || o.coll == "alltoall";
    const std::size_t per = gathered ? count / static_cast<std::size_t>(n) : count;
    const std::size_t rr = static_cast<std::size_t>(rank);
    std::byte* recv = recvBuf;
    std::byte* send = inPlace ? recv : sendBuf;
    if (inPlace && o.coll == "allgather") send = recv + rr * per * es;
    void* out = (inPlace && o.coll == "reducescatter") ? static_cast<void*>(send + rr * per * es) : recv;
    auto fill = [&] {
      sync();  // the stream's earlier calls are done with the buffers
      if (o.coll == "allgather") pattern::fill(host(send), per, dt, op, rank, rr * per);
      else pattern::fill(host(send), count, dt, op, rank, 0);
      upload(send, (o.coll == "allgather" ? per : count) * es);
    };
    auto wrongNow = [&]() -> std::size_t {
      const std::string& c = o.coll;
      sync();
      download(static_cast<std::byte*>(out), (c == "allgather" ? per * static_cast<std::size_t>(n) : c == "reducescatter" ? per : count) * es);
      if (error != braidSuccess) return 0;
      std::byte* recvH = host(recv);
      void* outH = host(static_cast<std::byte*>(out));
      if (c == "allreduce") return pattern::countWrong(outH, count, dt, op, n, 0);
      if (c == "reducescatter") return pattern::countWrong(outH, per, dt, op, n, rr * per);
      if (c == "reduce") return rank == o.root ? pattern::countWrong(outH, count, dt, op, n, 0) : 0;
      if (c == "broadcast") return pattern::countWrong(outH, count, dt, op, n, 0, o.root);
      if (c == "sendrecv") return (rank & 1) && peer() < n ? pattern::countWrong(outH, count, dt, op, n, 0, peer()) : 0;
      std::size_t w = 0;
      if (c == "allgather")
        for (int q = 0; q < n; ++q)
          w += pattern::countWrong(recvH + static_cast<std::size_t>(q) * per * es, per, dt, op, n,
                                   static_cast<std::size_t>(q) * per, q);
      if (c == "alltoall")  // block q came from rank q: its block for this rank
        for (int q = 0; q < n; ++q)
          w += pattern::countWrong(recvH + static_cast<std::size_t>(q) * per * es, per, dt, op, n, rr * per, q);
      return w;
    };
    const bool check = o.check && o.coll != "barrier";
    auto stamp = [&] { return o.cputime ? cpuNow() : now(); };
    if (check) fill();
    for (int w = 0; w < o.warmup && error == braidSuccess; ++w) {
      if (check && inPlace) fill();
      error = call(dt, op, send, out, count);
    }
    double total = 0;            // seconds over every timed call
    std::vector<double> iterUs;  // per call, one entry per iteration (-I, --per-rank)
    std::vector<double> busyUs;  // the same, less the time the rank waited on its peers
    const CommView view(comm);
    std::uint64_t stallAt = view.stallNs();
    double wallAt = now();
    // One iteration (or -G launch) of `calls` calls ended now: its wall time less its waits, per call.
    auto noteBusy = [&](int calls) {
      const std::uint64_t stall = view.stallNs();
      const double wall = now();
      busyUs.push_back(std::max(0.0, (wall - wallAt) * 1e6 - static_cast<double>(stall - stallAt) * 1e-3) / calls);
      stallAt = stall, wallAt = wall;
    };
    std::uint64_t wrong = 0;
    if (!check && o.graphs > 0) {
      // -G: the iterations' calls captured into one CUDA graph, launched o.graphs times.
      void* graph = device::capture(stream, [&] {
        for (int it = 0; it < o.iters && error == braidSuccess; ++it)
          for (int m = 0; m < o.agg && error == braidSuccess; ++m) error = call(dt, op, send, out, count);
        return error == braidSuccess;
      });
      if (!graph) {
        if (error == braidSuccess) error = braidCudaError;
        return PerfCell();
      }
      sync();  // the warm-up done (braidBarrier(world) waits for world's calls only: --split)
      if (error == braidSuccess) error = braidBarrier(world);
      const double t0 = stamp();
      double last = t0;
      stallAt = view.stallNs(), wallAt = now();
      for (int g = 0; g < o.graphs && error == braidSuccess; ++g) {
        if (!device::launch(graph, stream)) error = braidCudaError;
        if (o.perIteration()) {  // one sample a launch
          sync();
          const double t = stamp();
          iterUs.push_back((t - last) / (o.agg * o.iters) * 1e6);
          noteBusy(o.agg * o.iters);
          last = t;
        }
      }
      sync();
      total = (stamp() - t0) / o.agg / o.graphs;
      device::releaseGraph(graph);
    } else if (!check) {
      // Every group starts together (--split), then the iterations back to back.
      sync();  // the warm-up done (braidBarrier(world) waits for world's calls only)
      if (error == braidSuccess) error = braidBarrier(world);
      const double t0 = stamp();
      double last = t0;
      stallAt = view.stallNs(), wallAt = now();
      for (int it = 0; it < o.iters && error == braidSuccess; ++it) {
        for (int m = 0; m < o.agg && error == braidSuccess; ++m) {
          error = call(dt, op, send, out, count);
          if (o.blocking) sync();
        }
        if (o.perIteration()) {
          sync();
          const double t = stamp();
          iterUs.push_back((t - last) / o.agg * 1e6);
          noteBusy(o.agg);
          last = t;
        }
      }
      sync();
      total = (stamp() - t0) / o.agg;
    } else {
      for (int it = 0; it < o.iters && error == braidSuccess; ++it) {
        if (inPlace || it == 0) fill();
        error = braidBarrier(comm);
        stallAt = view.stallNs(), wallAt = now();
        const double t0 = stamp();
        if (error == braidSuccess) error = call(dt, op, send, out, count);
        sync();
        const double t = stamp() - t0;
        noteBusy(1);
        total += t;
        iterUs.push_back(t * 1e6);
        if (error == braidSuccess) wrong += wrongNow();
      }
    }
    PerfCell cell;
    if (error != braidSuccess) return cell;
    const double mine = total / o.iters * 1e6;
    std::vector<double> perRank(static_cast<std::size_t>(wn));
    std::uint64_t allWrong = 0;
    if (braidAllGather(&mine, perRank.data(), 1, braidFloat64, world, nullptr) != braidSuccess ||
        braidAllReduce(&wrong, &allWrong, 1, braidUint64, braidSum, world, nullptr) != braidSuccess) {
      error = braidRemoteError;
      return cell;
    }
    if (o.perIteration()) {
      // Each rank's median (after -K), and the slowest rank's time in each iteration.
      const double busy = iterStats(busyUs, static_cast<std::size_t>(o.skip)).p50;
      cell.perRankUs = perRank;
      cell.perRankBusyUs.resize(static_cast<std::size_t>(wn));
      std::vector<double> slowest(iterUs.size());
      if (braidAllGather(&busy, cell.perRankBusyUs.data(), 1, braidFloat64, world, nullptr) != braidSuccess ||
          braidAllReduce(iterUs.data(), slowest.data(), iterUs.size(), braidFloat64, braidMax, world, nullptr) != braidSuccess) {
        error = braidRemoteError;
        return cell;
      }
      if (o.iterStats) cell.iters = iterStats(slowest, static_cast<std::size_t>(o.skip));
    }
    // -a over rank 0's group (--split groups may differ in size, and the row's bytes and busbw
    // are that group's).
    std::vector<double> group;
    for (int q = 0; q < wn; ++q)
      if (o.split.op == Split::kNone || o.split.colorOf(q) == o.split.colorOf(0)) group.push_back(perRank[static_cast<std::size_t>(q)]);
    cell.timeUs = combineRanks(o.timeOf, group);
    cell.wrong = allWrong;
    double bytes = static_cast<double>(count * es);
    cell.algbw = cell.timeUs > 0 ? bytes / cell.timeUs / 1e3 : 0;
    cell.busbw = cell.algbw * busFactor(o.coll, n);
    totalWrong += allWrong;
    return cell;
  }
};

// A whole number from `v` within [lo, hi], or false (std::atoi would take "1x" and "" as numbers).
bool wholeIn(const char* v, long lo, long hi, int* out) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (!end || end == v || *end || x < lo || x > hi) return false;
  *out = static_cast<int>(x);
  return true;
}

int parse(int argc, char** argv, PerfOptions& o, std::vector<std::string>* compare) {
  int i = 1;
  if (i < argc && argv[i][0] != '-') o.coll = argv[i++];
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--per-rank" || a == "--floor") {
      (a == "--floor" ? o.floor : o.perRank) = true;
      continue;
    }
    if (a == "--compare") {  // every argument after it is a run
      for (++i; i < argc; ++i) compare->push_back(argv[i]);
      if (compare->empty()) {
        std::fprintf(stderr, "braid perf: --compare needs at least one RUN.json\n%s", kUsage);
        return 2;
      }
      return -1;
    }
    const char* v = i + 1 < argc ? argv[++i] : nullptr;
    if (!v) {
      std::fprintf(stderr, "braid perf: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    auto size = [&](std::size_t* out) {
      auto s = parseSize(v);
      if (!s.ok()) std::fprintf(stderr, "braid perf: %s: %s\n", a.c_str(), s.status().message().c_str());
      else *out = *s;
      return s.ok();
    };
    bool ok = true;
    auto whole = [&](long lo, long hi, int* out) {
      if (wholeIn(v, lo, hi, out)) return true;
      std::fprintf(stderr, "braid perf: %s takes a whole number from %ld to %ld, not '%s'\n", a.c_str(), lo, hi, v);
      return false;
    };
    int k = 0;
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
    else if (a == "-a" && std::isdigit(static_cast<unsigned char>(v[0])))
      ok = whole(0, 3, &k), o.timeOf = static_cast<TimeOf>(k);
    else if (a == "-a" || a == "--algo") o.algo = v;
    else if (a == "-m") ok = whole(1, 1 << 20, &o.agg);
    else if (a == "-z") ok = whole(0, 1, &o.blocking);
    else if (a == "-C") ok = whole(0, 1, &o.cputime);
    else if (a == "-T") ok = whole(0, 1 << 24, &k), o.timeoutSec = k;
    else if (a == "-u") ok = whole(0, 63, &k), o.misalign = static_cast<std::size_t>(k);
    else if (a == "-I") ok = whole(0, 1, &o.iterStats);
    else if (a == "-K") ok = whole(0, 1 << 30, &o.skip);
    else if (a == "-R") ok = whole(0, 1, &k), o.mem = k ? "braid" : "user";
    else if (a == "-G") ok = whole(0, 1 << 20, &o.graphs);
    else if (a == "--split") {
      std::string why;
      ok = parseSplit(v, &o.split, &why);
      if (!ok) std::fprintf(stderr, "braid perf: %s\n", why.c_str());
    }
    else if (a == "--json") o.json = v;
    else if (a == "--transport") o.transport = v;
    else if (a == "--mem") o.mem = v;
    else if (a == "--plot") o.plot = v;
    else if (a == "--plot-with") o.plotWith.push_back(v);
    else if (a == "--device") o.device = v;
    else {
      std::fprintf(stderr, "braid perf: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (!ok) return 2;
  }
  const char* known[] = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv", "barrier"};
  bool collOk = false;
  for (const char* k : known) collOk |= o.coll == k;
  bool typeOk = o.dtype == "all", opOk = o.op == "all";
  for (const TypeName& t : kTypes) typeOk |= o.dtype == t.name || o.dtype == dataTypeName(t.t);
  for (const char* op : kOps) opOk |= o.op == op;
  std::string why;
  if (!collOk) why = "unknown collective '" + o.coll + "'";
  else if (!typeOk) why = "unknown type '" + o.dtype + "'";
  else if (!opOk) why = "unknown op '" + o.op + "'";
  else if (o.iters < 1 || o.warmup < 0) why = "-n must be at least 1 and -w at least 0";
  else if (o.step == 0 && !(o.factor > 1)) why = "-f must be above 1 (or give -i)";
  else if (o.minBytes > o.maxBytes) why = "-b is larger than -e";
  else if (!o.algo.empty() && o.algo != "ring" && o.algo != "tree" && o.algo != "oneshot" && o.algo != "hier" && o.algo != "bruck")
    why = "--algo (or -a with a name) takes ring, tree, oneshot, hier or bruck";
  else if (o.skip >= (o.graphs ? o.graphs : o.iters) && o.perIteration())
    why = o.graphs ? "-K must leave at least one of the -G launches (one sample each)" : "-K must leave at least one of the -n iterations";
  else if (o.graphs && o.device != "cuda") why = "-G replays CUDA graphs: it needs --device cuda";
  else if (o.graphs && o.check) why = "-G times graph launches unchecked: give -c 0 with it";
  else if (o.graphs && o.warmup < 1) why = "-G needs -w 1 or more: the first device call starts Braid's CUDA proxy, outside the capture";
  else if (o.graphs && o.coll == "barrier") why = "-G: braidBarrier runs on the host and cannot be captured";
  else if (o.floor && o.device == "cuda") why = "--floor measures host memory and links: not with --device cuda";
  else if (o.agg > 1 && o.check) why = "-m aggregates the unchecked timing loop: give -c 0 with it (-c 1 times each call alone)";
  else if (!o.transport.empty() && o.transport != "shm" && o.transport != "tcp") why = "--transport takes shm or tcp";
  else if (o.mem != "user" && o.mem != "braid") why = "--mem takes user or braid";
  else if (!o.plotWith.empty() && o.plot.empty()) why = "--plot-with needs --plot FILE.svg";
  else if (o.device != "host" && o.device != "cuda") why = "--device takes host or cuda";
  else if (o.device == "cuda" && o.mem == "braid") why = "--mem braid is host memory: it does not go with --device cuda";
  if (!why.empty()) {
    std::fprintf(stderr, "braid perf: %s\n%s", why.c_str(), kUsage);
    return 2;
  }
  return -1;
}

// Rank 0, after the sweep: this run's columns and the earlier runs named with --plot-with.
bool writePlot(const PerfOptions& o, const PerfReport& report) {
  const PerfHeader& h = report.header();
  std::string settings = o.coll + ", " + std::to_string(h.nranks) + " ranks";
  if (!o.transport.empty()) settings += ", " + o.transport;
  if (o.mem == "braid") settings += ", braidMemAlloc";
  std::vector<PlotSeries> series;
  if (!report.rows().empty()) series = seriesOfRun(report.rows(), settings);
  for (const std::string& path : o.plotWith) {
    PlotSeries s;
    std::string error;
    if (!loadPerfJson(path, &s, &error)) {
      std::fprintf(stderr, "braid perf: --plot-with: %s\n", error.c_str());
      return false;
    }
    series.push_back(std::move(s));
  }
  std::string error;
  const std::string title = "braid perf " + o.coll + ": busbw against size (" + h.host + ", " + h.startedAt + ")";
  if (!writePlotSvg(o.plot, title, series, &error)) {
    std::fprintf(stderr, "braid perf: --plot: %s\n", error.c_str());
    return false;
  }
  return true;
}

}  // namespace

int runPerf(int argc, char** argv) {
  Run run;
  PerfOptions& o = run.o;
  std::vector<std::string> compare;
  int rc = parse(argc, argv, o, &compare);
  if (rc >= 0) return rc;
  if (!compare.empty()) {
    std::vector<CompareRun> runs(compare.size());
    for (std::size_t k = 0; k < compare.size(); ++k) {
      std::string error;
      if (!loadCompareRun(compare[k], &runs[k], &error)) {
        std::fprintf(stderr, "braid perf: --compare: %s\n", error.c_str());
        return 2;
      }
    }
    std::fputs(compareTable(runs).c_str(), stdout);
    return 0;
  }
  // The communicator reads its configuration once, at creation: set the knobs the flags stand for.
  if (!o.algo.empty()) setenv("BRAID_ALGO", o.algo.c_str(), 1);
  if (o.timeoutSec > 0) setenv("BRAID_TIMEOUT", std::to_string(static_cast<long>(o.timeoutSec)).c_str(), 1);
  if (o.transport == "tcp") setenv("BRAID_SHM_DISABLE", "1", 1);
  if (o.transport == "shm") setenv("BRAID_SHM_DISABLE", "0", 1);

  if (o.device == "cuda") {
    // Before the communicator: the device current at its creation is the one it uses.
    std::string why = device::select();
    if (!why.empty()) {
      std::fprintf(stderr, "braid perf: --device cuda: %s\n", why.c_str());
      return 1;
    }
    o.deviceName = device::describe();
    run.stream = device::stream();
  }
  braidResult_t r = braidCommInitFromEnv(&run.world);
  if (r != braidSuccess) {
    std::fprintf(stderr, "braid perf: communicator creation failed: %s\n", braidGetLastError(nullptr));
    return 1;
  }
  braidCommUserRank(run.world, &run.wrank);
  braidCommCount(run.world, &run.wn);
  run.comm = run.world;
  // The root must be in every group: checked on every rank alike before any group runs a call.
  int smallest = run.wn;
  if (o.split.op != Split::kNone) {
    std::map<int, int> sizes;
    for (int q = 0; q < run.wn; ++q) ++sizes[o.split.colorOf(q)];
    for (const auto& [color, size] : sizes) smallest = std::min(smallest, size);
  }
  if (o.root < 0 || o.root >= smallest) {
    std::fprintf(stderr, "braid perf: root %d is outside 0..%d%s\n", o.root, smallest - 1,
                 smallest < run.wn ? " (the ranks of the smallest --split group)" : "");
    return 2;
  }
  if (o.split.op != Split::kNone &&
      braidCommSplit(run.world, o.split.colorOf(run.wrank), run.wrank, &run.comm) != braidSuccess) {
    std::fprintf(stderr, "braid perf: --split %s: %s\n", o.split.text().c_str(), braidGetLastError(run.world));
    return 1;
  }
  braidCommUserRank(run.comm, &run.rank);
  braidCommCount(run.comm, &run.n);
  const int n = run.n;
  std::vector<DataType> types;
  for (const TypeName& t : kTypes)
    if (o.dtype == "all" || o.dtype == t.name || o.dtype == dataTypeName(t.t)) types.push_back(t.t);
  std::vector<ReduceOp> ops;
  for (int k = 0; k < 5; ++k)
    if (o.op == "all" ? (isReduction(o.coll) || k == 0) : o.op == kOps[k]) ops.push_back(static_cast<ReduceOp>(k));
  run.capacity = o.maxBytes + 128;  // 64 bytes to spare for -u, 64 as before
  if (o.device == "cuda") {
    run.sendBuf = static_cast<std::byte*>(device::alloc(run.capacity));
    run.recvBuf = static_cast<std::byte*>(device::alloc(run.capacity));
    if (!run.sendBuf || !run.recvBuf) {
      std::fprintf(stderr, "braid perf: device memory: %s\n", device::error().c_str());
      return 1;
    }
    run.sendMirror.resize(run.capacity);
    run.recvMirror.resize(run.capacity);
  } else if (o.mem == "braid") {
    void* s = nullptr;
    void* rv = nullptr;
    if (braidMemAlloc(&s, run.capacity) != braidSuccess || braidMemAlloc(&rv, run.capacity) != braidSuccess) {
      std::fprintf(stderr, "braid perf: braidMemAlloc failed: %s\n", braidGetLastError(nullptr));
      return 1;
    }
    run.sendBuf = static_cast<std::byte*>(s);
    run.recvBuf = static_cast<std::byte*>(rv);
  } else {
    run.sendStore.resize(o.maxBytes + 128);  // zero-filled: every page touched once, before timing
    run.recvStore.resize(o.maxBytes + 128);
    run.sendBuf = run.sendStore.data();
    run.recvBuf = run.recvStore.data();
  }
  std::byte* const sendBase = run.sendBuf;
  std::byte* const recvBase = run.recvBuf;
  // -u: the first byte at `misalign` past a 64-byte boundary (the buffers have 64 bytes to spare).
  auto at = [&](std::byte* p) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    return p + ((o.misalign + 64 - addr % 64) % 64);
  };
  run.sendBuf = at(sendBase);
  run.recvBuf = at(recvBase);
  run.capacity -= 64;

  PerfHeader h = describeRun(run.world, run.wrank, run.wn, o, BRAID_VERSION_TAG, kernels::isaName());
  h.groupRanks = n;
  if (o.split.op != Split::kNone) {
    std::set<int> colors;
    for (int q = 0; q < run.wn; ++q) colors.insert(o.split.colorOf(q));
    h.groups = static_cast<int>(colors.size());
  }
  h.copies = kernels::plainCopyName();
  std::vector<std::string> hostOf;
  {
    const PerfReport lines(h);
    for (int q = 0; q < run.wn; ++q) hostOf.push_back(lines.hostOf(q));
  }
  for (const std::string& host : hostOf) h.perHost = std::max(h.perHost, static_cast<int>(std::count(hostOf.begin(), hostOf.end(), host)));
  // sendrecv pairs 0-1, 2-3, ...: whether any pair's link is between hosts (else no link limits it).
  bool pairsCross = false;
  for (int q = 0; q + 1 < run.wn; q += 2) pairsCross |= hostOf[static_cast<std::size_t>(q)] != hostOf[static_cast<std::size_t>(q + 1)];
  if (o.floor) {
    LinkRate link;
    h.linkBytes = std::size_t{4} << 20;  // the streams' asymptote, whatever the sweep's sizes
    if (!measureLinks(run.world, run.wrank, hostOf, h.linkBytes, &link)) {
      std::fprintf(stderr, "braid perf: rank %d: --floor: the link measurement failed: %s\n", run.wrank,
                   braidGetLastError(run.world));
      return 1;
    }
    h.linkGBps = link.gbps;
    h.linkPairs = link.pairs;
  }
  PerfReport report(h);
  bool plotFailed = false;
  if (run.wrank == 0) report.printHeader();
  for (DataType dt : types)
    for (ReduceOp op : ops)
      for (std::size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
        const std::size_t es = dataTypeSize(dt);
        const bool gathered = o.coll == "allgather" || o.coll == "reducescatter" || o.coll == "alltoall";
        const std::size_t unit = es * (gathered ? static_cast<std::size_t>(n) : 1);
        PerfRow row;
        row.count = bytes / unit * (gathered ? static_cast<std::size_t>(n) : 1);
        row.bytes = row.count * es;
        row.type = dataTypeName(dt);
        row.op = isReduction(o.coll) ? reduceOpName(op) : "none";
        row.root = (o.coll == "broadcast" || o.coll == "reduce") ? o.root : -1;
        if (o.floor && o.coll != "barrier") {  // (on every rank alike: a --split group's row may hold 0 bytes)
          MemoryRates mem;
          if (!measureMemory(run.world, hostOf, run.sendBuf, run.recvBuf, row.bytes, dt, op, &mem)) run.error = braidRemoteError;
          row.copyGBps = mem.copyGBps;
          row.reduceGBps = mem.reduceGBps;
          row.floorGBps = busbwFloor(o.coll, n, h.hosts, h.perHost, mem.copyGBps, mem.reduceGBps,
                                     o.coll == "sendrecv" && !pairsCross ? 0 : h.linkGBps);
        }
        row.out = run.measure(dt, op, row.count, false);
        row.in = run.measure(dt, op, row.count, true);
        for (PerfCell* c : {&row.out, &row.in})
          if (row.floorGBps > 0) c->floorShare = c->busbw / row.floorGBps;
        if (run.error != braidSuccess) {
          std::fprintf(stderr, "braid perf: rank %d: %s failed: %s\n", run.wrank, o.coll.c_str(),
                       run.error == braidCudaError && !device::error().empty() ? device::error().c_str() : braidGetLastError(run.comm));
          return 1;
        }
        if (run.wrank == 0) report.addRow(row);
        std::size_t next = o.step ? bytes + o.step : static_cast<std::size_t>(std::ceil(static_cast<double>(bytes) * o.factor));
        if (next <= bytes) break;
        bytes = next;
      }
  if (run.wrank == 0) {
    report.printFooter(run.totalWrong);
    if (o.device == "cuda") {
      // Which path the device calls took: the figures mean different things for the two.
      const auto ipc = static_cast<unsigned long long>(CommView(run.comm).cudaIpcCalls());
      std::printf("# Device path: %llu call(s) on rank 0 through CUDA IPC, the rest staged through pinned host memory%s\n",
                  ipc, CommView(run.comm).config().cudaIpc ? "" : " (BRAID_CUDA_IPC=0)");
    }
    if (!o.json.empty() && !report.writeJson(o.json, run.totalWrong))
      std::fprintf(stderr, "braid perf: cannot write %s\n", o.json.c_str());
    if (!o.plot.empty() && !writePlot(o, report)) plotFailed = true;
  }
  if (run.comm != run.world) braidCommDestroy(run.comm);
  braidCommDestroy(run.world);
  if (o.device == "cuda") {
    device::release(sendBase);
    device::release(recvBase);
  } else if (o.mem == "braid") {
    braidMemFree(sendBase);
    braidMemFree(recvBase);
  }
  return run.totalWrong || plotFailed ? 1 : 0;
}

}  // namespace braid::tools
