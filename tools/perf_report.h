// How `braid perf` presents its results: nccl-tests' table on stdout, and the same rows as JSON
// (with the run's settings, host, commit and time) so that two runs can be compared by a script.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/braid.h"

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
};

struct PerfCell {
  double timeUs = 0, algbw = 0, busbw = 0;
  std::uint64_t wrong = 0;
};

struct PerfRow {
  std::size_t bytes = 0, count = 0;
  std::string type, op;
  int root = -1;
  PerfCell out, in;
};

struct PerfHeader {
  PerfOptions options;
  int nranks = 0, hosts = 0;
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

 private:
  PerfHeader h_;
  std::vector<PerfRow> rows_;
  double busSum_ = 0;
  int busCount_ = 0;
};

}  // namespace braid::tools
