// The `braid` command's subcommands.
#pragma once
#include <string>

#include "braid/braid.h"

namespace braid::tools {

int runPerf(int argc, char** argv);      // braid perf
int runInfo(int argc, char** argv);      // braid info
int runTopo(int argc, char** argv);      // braid topo
int runDoctor(int argc, char** argv);    // braid doctor
int runTune(int argc, char** argv);      // braid tune
int runStatus(int argc, char** argv);    // braid status

// "auto (cost model)" or "ring (BRAID_ALGO)".
std::string describeAlgoSetting();

}  // namespace braid::tools
