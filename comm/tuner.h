// The tuner picks, per call, the algorithm, how many channels to spread the data over, and the
// pipeline chunk, from a latency/bandwidth cost model. Every rank computes the same choice from the
// same arguments, so no agreement round is needed. BRAID_ALGO and BRAID_CHUNKSIZE override it.
#pragma once
#include <cstddef>
#include <string>

#include "comm/algorithms/algorithms.h"
#include "comm/config.h"

namespace braid {

// All-reduce calls of at least this many bytes first ask every rank whether its buffers are
// braidMemAlloc memory (one small exchange); below it the exchange would cost more than it saves.
inline constexpr std::size_t kZeroCopyMinBytes = 256u << 10;

struct TunerInput {
  CollKind kind;
  std::size_t bytes;   // the whole array: all-reduce count, all-gather/reduce-scatter n * count
  int nranks;
  int maxChannels;
  bool anyTcp;         // some peer is reached over tcp (the whole communicator agrees on this)
};

struct TunerChoice {
  Algo algo;
  int channels;
  std::size_t chunk;
  double ringUs, treeUs;  // the model's estimates, for BRAID_DEBUG=INFO
};

TunerChoice tune(const TunerInput& in, const Config& config);

}  // namespace braid
