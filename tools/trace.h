// `braid trace DIR`: reads the flight recorder files that ranks wrote to BRAID_TRACE_DIR
// (comm/trace.cc writes them) and says which rank the others were waiting for.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "braid/status.hpp"

namespace braid::tools {

// One collective as a rank recorded it.
struct TraceCall {
  std::uint64_t seq = 0;
  std::string coll, dtype, op, state;
  std::uint64_t count = 0;
  int root = -1, sender = -1;
  std::int64_t startNs = 0, endNs = 0;
  struct Peer { int peer; std::uint64_t sent, recv; };
  std::vector<Peer> peers;
  bool stuck = false;
  int stuckPeer = -1, stuckChannel = 0;
  bool stuckSending = false, stuckHeader = false;
  std::uint32_t stuckStep = 0;
  std::uint64_t stuckDone = 0, stuckBytes = 0;

  bool p2p() const { return coll == "send/recv"; }
  // "allreduce(count=1024, float32, sum)", as Braid's error messages write it.
  std::string describe() const;
};

// One rank's file.
struct RankTrace {
  int rank = -1, nranks = 0;
  long pid = 0;
  std::string host, comm, reason, error, file;
  std::int64_t steadyNs = 0, unixNs = 0;
  std::uint64_t recorded = 0;
  std::vector<TraceCall> calls;  // oldest first
};

// Parses one file's text (the "braid-trace-1" format).
Result<RankTrace> parseRankTrace(const std::string& json);

struct TraceReport {
  std::string details;  // a paragraph per rank
  std::string verdict;  // one line, starts with "verdict: "
  bool anyFile = false;
};
// Merges the files found in `dir` (braid-trace-rank<N>.json).
TraceReport analyzeTraceDir(const std::string& dir);
// The same on traces already read (`problems`: files that could not be read, one line each).
TraceReport analyzeTraces(std::vector<RankTrace> traces, const std::vector<std::string>& problems);

int runTrace(int argc, char** argv);  // braid trace

}  // namespace braid::tools
