// `braid perf`: nccl-tests' table for Braid's collectives, run under any launcher. Times are the
// slowest rank's mean per iteration; algbw = size / time; busbw = algbw times nccl-tests' factor
// (all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n; broadcast, reduce, sendrecv 1), so
// the numbers paste beside NCCL's.
//
// With -c 1 every iteration's result is checked element by element against the CPU reference
// (tools/pattern.h). Checking is not timed: each iteration then runs alone (inputs refilled, a
// barrier, the timed call, the check), which adds the barrier's skew to the time; -c 0 times the
// iterations back to back.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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
#include "tools/perf_plot.h"
#include "tools/perf_report.h"
#include "tools/tools.h"

namespace braid::tools {
namespace {

const char* kUsage =
    "usage: braid perf COLLECTIVE [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
    "                  [-c 0|1] [-d DTYPE|all] [-o OP|all] [-r ROOT] [-a ring|tree] [--transport shm|tcp]\n"
    "                  [--mem user|braid] [--device host|cuda] [--json FILE]\n"
    "                  [--plot FILE.svg [--plot-with RUN.json ...]]\n"
    "  --mem braid: buffers from braidMemAlloc (zero-copy all-reduce between ranks of a host)\n"
    "  --device cuda: buffers in GPU memory (GPU LOCAL_RANK modulo the device count), calls on a CUDA stream;\n"
    "                 each timed call is waited for on the stream; checking copies the results to the host\n"
    "  --plot: busbw against size as SVG (log-log): this run's two columns, and the out-of-place\n"
    "          column of every earlier --json output given with --plot-with (repeatable)\n"
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

struct Run {
  PerfOptions o;
  braidComm_t comm = nullptr;
  int rank = 0, n = 1;
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
    if (check) fill();
    for (int w = 0; w < o.warmup && error == braidSuccess; ++w) {
      if (check && inPlace) fill();
      error = call(dt, op, send, out, count);
    }
    double mine = 0;
    std::uint64_t wrong = 0;
    if (!check) {
      if (error == braidSuccess) error = braidBarrier(comm);
      double t0 = now();
      for (int it = 0; it < o.iters && error == braidSuccess; ++it) error = call(dt, op, send, out, count);
      sync();
      mine = now() - t0;
    } else {
      for (int it = 0; it < o.iters && error == braidSuccess; ++it) {
        if (inPlace || it == 0) fill();
        error = braidBarrier(comm);
        double t0 = now();
        if (error == braidSuccess) error = call(dt, op, send, out, count);
        sync();
        mine += now() - t0;
        if (error == braidSuccess) wrong += wrongNow();
      }
    }
    mine = mine / o.iters * 1e6;
    PerfCell cell;
    if (error != braidSuccess) return cell;
    double slowest = 0;
    std::uint64_t allWrong = 0;
    braidAllReduce(&mine, &slowest, 1, braidFloat64, braidMax, comm, nullptr);
    braidAllReduce(&wrong, &allWrong, 1, braidUint64, braidSum, comm, nullptr);
    cell.timeUs = slowest;
    cell.wrong = allWrong;
    double bytes = static_cast<double>(count * es);
    cell.algbw = bytes / slowest / 1e3;
    cell.busbw = cell.algbw * busFactor(o.coll, n);
    totalWrong += allWrong;
    return cell;
  }
};

int parse(int argc, char** argv, PerfOptions& o) {
  int i = 1;
  if (i < argc && argv[i][0] != '-') o.coll = argv[i++];
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
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
    else if (a == "-a") o.algo = v;
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
  else if (!o.algo.empty() && o.algo != "ring" && o.algo != "tree" && o.algo != "oneshot")
    why = "-a takes ring, tree or oneshot";
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
  int rc = parse(argc, argv, o);
  if (rc >= 0) return rc;
  // The communicator reads its configuration once, at creation: set the knobs the flags stand for.
  if (!o.algo.empty()) setenv("BRAID_ALGO", o.algo.c_str(), 1);
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
  braidResult_t r = braidCommInitFromEnv(&run.comm);
  if (r != braidSuccess) {
    std::fprintf(stderr, "braid perf: communicator creation failed: %s\n", braidGetLastError(nullptr));
    return 1;
  }
  braidCommUserRank(run.comm, &run.rank);
  braidCommCount(run.comm, &run.n);
  const int rank = run.rank, n = run.n;
  if (o.root < 0 || o.root >= n) {
    std::fprintf(stderr, "braid perf: root %d is outside 0..%d\n", o.root, n - 1);
    return 2;
  }
  std::vector<DataType> types;
  for (const TypeName& t : kTypes)
    if (o.dtype == "all" || o.dtype == t.name || o.dtype == dataTypeName(t.t)) types.push_back(t.t);
  std::vector<ReduceOp> ops;
  for (int k = 0; k < 5; ++k)
    if (o.op == "all" ? (isReduction(o.coll) || k == 0) : o.op == kOps[k]) ops.push_back(static_cast<ReduceOp>(k));
  run.capacity = o.maxBytes + 64;
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
    if (braidMemAlloc(&s, o.maxBytes + 64) != braidSuccess || braidMemAlloc(&rv, o.maxBytes + 64) != braidSuccess) {
      std::fprintf(stderr, "braid perf: braidMemAlloc failed: %s\n", braidGetLastError(nullptr));
      return 1;
    }
    run.sendBuf = static_cast<std::byte*>(s);
    run.recvBuf = static_cast<std::byte*>(rv);
  } else {
    run.sendStore.resize(o.maxBytes + 64);  // zero-filled: every page touched once, before timing
    run.recvStore.resize(o.maxBytes + 64);
    run.sendBuf = run.sendStore.data();
    run.recvBuf = run.recvStore.data();
  }

  PerfHeader h = describeRun(run.comm, rank, n, o, BRAID_VERSION_TAG, kernels::isaName());
  h.copies = kernels::plainCopyName();
  PerfReport report(h);
  bool plotFailed = false;
  if (rank == 0) report.printHeader();
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
        row.out = run.measure(dt, op, row.count, false);
        row.in = run.measure(dt, op, row.count, true);
        if (run.error != braidSuccess) {
          std::fprintf(stderr, "braid perf: rank %d: %s failed: %s\n", rank, o.coll.c_str(),
                       run.error == braidCudaError && !device::error().empty() ? device::error().c_str() : braidGetLastError(run.comm));
          return 1;
        }
        if (rank == 0) report.addRow(row);
        std::size_t next = o.step ? bytes + o.step : static_cast<std::size_t>(std::ceil(static_cast<double>(bytes) * o.factor));
        if (next <= bytes) break;
        bytes = next;
      }
  if (rank == 0) {
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
  braidCommDestroy(run.comm);
  if (o.device == "cuda") {
    device::release(run.sendBuf);
    device::release(run.recvBuf);
  } else if (o.mem == "braid") {
    braidMemFree(run.sendBuf);
    braidMemFree(run.recvBuf);
  }
  return run.totalWrong || plotFailed ? 1 : 0;
}

}  // namespace braid::tools
