// The `braid` command's subcommands.
#pragma once
#include <string>

#include "braid/braid.h"

namespace braid::tools {

int runPerf(int argc, char** argv);      // braid perf
int runInfo(int argc, char** argv);      // braid info

// "auto (cost model)" or "ring (BRAID_ALGO)".
std::string describeAlgoSetting();
// Rank 0 prints one line per rank: the transport used to reach every peer. Collective.
void printTransportSummary(braidComm_t comm, int rank, int nranks);

}  // namespace braid::tools
