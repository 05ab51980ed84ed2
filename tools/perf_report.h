// How `braid perf` presents its results: nccl-tests' table on stdout, and the same rows as JSON
// (with the run's settings, host, commit and time) so that two runs can be compared by a script.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "tools/perf_stats.h"

namespace braid::tools {

struct PerfOptions {
  std::string coll = "allreduce";
  std::size_t minBytes = 8, maxBytes = 32u << 20;
  double factor = 2;
  std::size_t step = 0;
  int iters = 20, warmup = 5, check = 1, root = 0;
  std::string dtype = "float", op = "sum", algo, transport, json, mem = "user";
  std::string plot;                   // --plot FILE.svg
  std::vector<std::string> plotWith;  // --plot-with RUN.json, repeatable
  std::string device = "host";  // --device: where the buffers live ("host" or "cuda")
  std::string deviceName;       // the GPU, for the header
  TimeOf timeOf = TimeOf::kAverage;  // -a 0|1|2|3
  int agg = 1;                  // -m: calls per timed iteration (-c 0)
  int blocking = 0;             // -z 1: wait for each call (its stream, with --device cuda)
  int cputime = 0;              // -C 1: the process's CPU time per call instead of the wall time
  double timeoutSec = 0;        // -T: BRAID_TIMEOUT for the run (0: the environment's)
  std::size_t misalign = 0;     // -u: buffers start this many bytes past a 64-byte boundary
  int iterStats = 0;            // -I 1: per-iteration statistics and per-rank times
  int skip = 0;                 // -K: first samples left out of the statistics
  bool perRank = false;         // --per-rank: per-rank times and the straggler, without -I's lines
  bool floor = false;           // --floor: the machine's limits measured first, %floor per cell
  int graphs = 0;               // -G: launches of a CUDA graph holding the -n iterations' calls (--device cuda)
  Split split;                  // --split
  bool perIteration() const { return iterStats || perRank; }
};

struct PerfCell {
  double timeUs = 0, algbw = 0, busbw = 0;
  std::uint64_t wrong = 0;
  IterStats iters;                // -I: over the slowest rank's time of each iteration
  std::vector<double> perRankUs;  // -I or --per-rank: each rank's mean time per call (what -a combines)
  // ... and its median busy time: the time in the call less the time it waited on a peer. A slow
  // rank makes the others wait inside the call (their time grows, not their busy time), so the
  // straggler is the rank with the longest busy time.
  std::vector<double> perRankBusyUs;
  double floorShare = -1;  // --floor: busbw over the row's floor (-1: no floor for it)
};

struct PerfRow {
  std::size_t bytes = 0, count = 0;
  std::string type, op;
  int root = -1;
  PerfCell out, in;
  double floorGBps = 0, copyGBps = 0, reduceGBps = 0;  // --floor: the busbw floor and the memory rates under it
};

struct PerfHeader {
  PerfOptions options;
  int nranks = 0, hosts = 0;
  int groups = 1, groupRanks = 0;  // --split: parallel communicators, rank 0's group's size
  int perHost = 0;                 // the most ranks on one host
  double linkGBps = 0;             // --floor: the slowest stream between hosts (0: one host)
  int linkPairs = 0;
  std::size_t linkBytes = 0;
  std::vector<std::string> transports;  // one line per rank: "rank 0: shm x3"
  std::string algo, host, commit, isa, copies, startedAt;  // copies: kernels::plainCopyName()
};

// Collective: every rank calls it; only rank 0's result is complete.
// Every rank's line "rank R on HOST: shm x3 tcp x9 (tcp x115 on first use); cpus 4" (an all-gather:
// every rank calls it), in rank order; empty if the all-gather failed.
std::vector<std::string> transportLines(braidComm_t comm, int rank, int nranks);
PerfHeader describeRun(braidComm_t comm, int rank, int nranks, const PerfOptions& o, const char* commit, const char* isa);

class PerfReport {
 public:
  explicit PerfReport(PerfHeader h) : h_(std::move(h)) {}
  void printHeader() const;
  void addRow(const PerfRow& row);  // prints it and keeps it for JSON
  void printFooter(std::uint64_t wrong) const;
  bool writeJson(const std::string& path, std::uint64_t wrong) const;
  const std::vector<PerfRow>& rows() const { return rows_; }
  const PerfHeader& header() const { return h_; }
  std::string hostOf(int rank) const;  // from the transport lines; "" if unknown

 private:
  PerfHeader h_;
  std::vector<PerfRow> rows_;
  Straggler straggler() const;
  double busSum_ = 0;
  int busCount_ = 0;
};

}  // namespace braid::tools
