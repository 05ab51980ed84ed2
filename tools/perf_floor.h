// `braid perf --floor`: the machine's limits, measured in the same run before the sweep, that
// busbw is held to (tools/perf_stats.h busbwFloor turns them into a busbw per collective).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/types.hpp"

namespace braid::tools {

// Memory: every rank at once (after a barrier on `world`), a copy of `bytes` (plain or streaming
// stores, whichever is faster) and a reduce of `bytes` (b = a op b, `dt` and `op` of the row), each
// repeated for the same window of time. A host's rate is the mean of its ranks' (ranks that share
// a core or the memory bus share it out, as in a collective); the slowest host's, in GB/s of
// output. `a` and `b` hold `bytes` each; `hostOf[r]` names rank r's host. Collective over `world`;
// false if a call failed.
struct MemoryRates {
  double copyGBps = 0, reduceGBps = 0;
};
bool measureMemory(braidComm_t world, const std::vector<std::string>& hostOf, std::byte* a, std::byte* b,
                   std::size_t bytes, DataType dt, ReduceOp op, MemoryRates* out);

// Links between hosts: each rank whose ring neighbour (rank + 1, rank - 1) is on another host
// streams `bytes` to the next while it receives as many from the previous one, over Braid's
// send/recv (tcp or ib), every such pair at once, each repetition started together (a barrier);
// per host the sum of its ranks' streams (with ranks dealt round-robin, several cross at once),
// and the slowest host's, in GB/s each way.
// `hostOf[r]` names rank r's host. Collective over `world`; false if a call failed.
struct LinkRate {
  double gbps = 0;  // 0: no pair of ranks on two hosts
  int pairs = 0;    // ranks that streamed to the next on another host
};
bool measureLinks(braidComm_t world, int rank, const std::vector<std::string>& hostOf, std::size_t bytes, LinkRate* out);

}  // namespace braid::tools
