// Braid's driver for the MPI peer: MPI_Allreduce (fp32 sum), MPI_Allgather or MPI_Bcast (fp32,
// root 0), timed with the conventions of braid perf and nccl-tests so that bench/compare can set
// the rows side by side:
//   time  = the slowest rank's mean per iteration, iterations back to back after a barrier;
//   algbw = size / time; busbw = algbw * nccl-tests' factor: all-reduce 2(n-1)/n, all-gather
//   (n-1)/n, broadcast 1; GB/s = 1e9 B/s. As in nccl-tests, an all-gather's size is the whole
//   gathered array (n blocks), so each rank contributes size / n.
// The iteration count adapts to the size (the timed loop lasts about -t seconds) instead of a
// fixed -n as in braid perf: MPI_Allreduce spans six orders of magnitude across the sweep, and a
// fixed count would either take minutes at 256 MiB or be all noise at 8 B.
// The result of one untimed call per size is checked element by element before the timing: the
// sum of every rank's inputs (all-reduce), block q holding rank q's input (all-gather), root 0's
// input on every rank (broadcast).
//
// usage: mpirun -np N mpi_bench [-o allreduce|allgather|broadcast] [-b MIN] [-e MAX]
//                               [-f FACTOR | --sizes S1,S2,...] [-t SECONDS] [-l LABEL] [--in-place]
// Sizes take K, M, G suffixes; -b 8 -e 256M -f 4 is the default sweep.
// Output (rank 0, stdout): '#' comment lines, then CSV with the header
//   label,ranks,algo,size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,iters
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sizes.h"

namespace {

struct Options {
  std::size_t minBytes = 8, maxBytes = 256u << 20;
  double factor = 4;
  std::vector<std::size_t> sizes;  // --sizes: an explicit list instead of -b/-e/-f
  double targetSec = 0.2;
  std::string label = "mpi";
  std::string coll = "allreduce";
  bool inPlace = false;
};

using peers::parseSize;
using peers::parseSizeList;
void expandSizes(Options* o) { peers::expandSizes(o->sizes, o->minBytes, o->maxBytes, o->factor); }

bool parseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--in-place") { o->inPlace = true; continue; }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "-b") { if (!parseSize(v, &o->minBytes)) return false; }
    else if (a == "-e") { if (!parseSize(v, &o->maxBytes)) return false; }
    else if (a == "-f") o->factor = std::atof(v);
    else if (a == "-t") o->targetSec = std::atof(v);
    else if (a == "-l") o->label = v;
    else if (a == "-o") o->coll = v;
    else if (a == "--sizes") { if (!parseSizeList(v, &o->sizes)) return false; }
    else return false;
  }
  if (o->coll != "allreduce" && o->coll != "allgather" && o->coll != "broadcast") return false;
  return o->factor > 1 && o->minBytes >= 4 && o->minBytes <= o->maxBytes && o->targetSec > 0;
}

// Element i of rank r: small integers, so every partial sum is exact in fp32 whatever the order.
float inputValue(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }
float expectedSum(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
}

double busFactor(const std::string& coll, int n) {
  if (coll == "allreduce") return 2.0 * (n - 1) / n;
  if (coll == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

double slowest(double mine) {
  double all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Options o;
  if (!parseArgs(argc, argv, &o)) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpi_bench [-o allreduce|allgather|broadcast] [-b MIN] [-e MAX] [-f FACTOR | --sizes S1,S2,...] [-t SECONDS] [-l LABEL] [--in-place]\n");
    MPI_Finalize();
    return 2;
  }
  expandSizes(&o);
  // Both buffers persist across sizes and are touched once here, so no page fault is timed.
  const std::size_t maxCount = o.maxBytes / sizeof(float);
  std::vector<float> send(maxCount), recv(maxCount);
  for (std::size_t i = 0; i < maxCount; ++i) send[i] = inputValue(rank, i);

  int version = 0, subversion = 0;
  MPI_Get_version(&version, &subversion);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int libLen = 0;
  MPI_Get_library_version(lib, &libLen);
  if (rank == 0) {
    std::string firstLine(lib, static_cast<std::size_t>(libLen));
    firstLine = firstLine.substr(0, firstLine.find_first_of(",\n"));
    std::printf("# mpi_bench %s: %d ranks, fp32%s, %s, target %.2f s per size; %s (MPI %d.%d)\n", o.coll.c_str(), n,
                o.coll == "allreduce" ? " sum" : (o.coll == "broadcast" ? ", root 0" : ""),
                o.inPlace ? "in place" : "out of place", o.targetSec, firstLine.c_str(), version, subversion);
    std::printf("label,ranks,algo,size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,iters\n");
    std::fflush(stdout);
  }
  int failures = 0;
  const bool gather = o.coll == "allgather", bcast = o.coll == "broadcast";
  const std::size_t un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(rank);
  for (std::size_t requested : o.sizes) {
    // All-gather: a whole number of floats per rank; `count` is the gathered array's.
    const std::size_t per = gather ? requested / sizeof(float) / un : requested / sizeof(float);
    const std::size_t count = gather ? per * un : per;
    const std::size_t bytes = count * sizeof(float);
    if (per == 0) continue;
    const int icount = static_cast<int>(count), iper = static_cast<int>(per);
    // In place, all-gather's own block sits at its place in the output, and the broadcast root's
    // input is its output; out of place, the root broadcasts from `send` and the others receive
    // into `recv`.
    auto once = [&] {
      if (gather) {
        if (o.inPlace) return MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, recv.data(), iper, MPI_FLOAT, MPI_COMM_WORLD);
        return MPI_Allgather(send.data(), iper, MPI_FLOAT, recv.data(), iper, MPI_FLOAT, MPI_COMM_WORLD);
      }
      if (bcast) return MPI_Bcast(rank == 0 && !o.inPlace ? send.data() : recv.data(), icount, MPI_FLOAT, 0, MPI_COMM_WORLD);
      if (o.inPlace) return MPI_Allreduce(MPI_IN_PLACE, recv.data(), icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return MPI_Allreduce(send.data(), recv.data(), icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    // Check first, on fresh inputs (the output cleared, so that a value left from the previous
    // size cannot pass for a received one).
    std::fill_n(recv.begin(), count, -1.0f);
    if (o.inPlace) {
      if (gather) std::copy_n(send.begin(), per, recv.begin() + static_cast<std::ptrdiff_t>(ur * per));
      else if (!bcast || rank == 0) std::copy_n(send.begin(), count, recv.begin());
    }
    once();
    std::uint64_t wrong = 0;
    if (gather) {
      for (std::size_t q = 0; q < un; ++q)
        for (std::size_t i = 0; i < per; ++i) wrong += recv[q * per + i] != inputValue(static_cast<int>(q), i);
    } else if (bcast) {
      const float* got = rank == 0 && !o.inPlace ? send.data() : recv.data();
      for (std::size_t i = 0; i < count; ++i) wrong += got[i] != inputValue(0, i);
    } else {
      for (std::size_t i = 0; i < count; ++i) wrong += recv[i] != expectedSum(n, i);
    }
    std::uint64_t allWrong = 0;
    MPI_Allreduce(&wrong, &allWrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    failures += allWrong != 0;
    // In place the values now grow every call; zeros keep them finite (and fp32 adds of zeros
    // cost what any other adds cost: no subnormals either way).
    if (o.inPlace && !gather && !bcast) std::fill_n(recv.begin(), count, 0.0f);

    // Warm-up doubles as calibration: batches of 1, 2, 4, ... calls, timed on the slowest rank
    // (every rank sees the same maximum, so all leave the loop together), until a batch of at
    // least 4 calls lasts 10 ms or any batch lasts half the target. The quickest batch sets the
    // estimate: one preempted call must not shrink the timed loop to a handful of iterations.
    double perCall = 1e30;
    for (int k = 1;; k *= 2) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < k; ++i) once();
      double took = slowest(MPI_Wtime() - t0);
      perCall = std::min(perCall, took / k);
      if ((took >= 0.01 && k >= 4) || took >= o.targetSec / 2 || k >= (1 << 16)) break;
    }
    const int iters = static_cast<int>(std::clamp(o.targetSec / perCall, 3.0, 1e6));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) once();
    const double timeUs = slowest((MPI_Wtime() - t0) / iters) * 1e6;

    if (rank == 0) {
      const double algbw = static_cast<double>(bytes) / timeUs / 1e3;
      std::printf("%s,%d,default,%zu,%zu,float,%s,%d,%.3f,%.4f,%.4f,%llu,%d\n", o.label.c_str(), n, bytes, count,
                  gather || bcast ? "none" : "sum", bcast ? 0 : -1, timeUs, algbw, algbw * busFactor(o.coll, n),
                  static_cast<unsigned long long>(allWrong), iters);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
