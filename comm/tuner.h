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
// Ordinary buffers are read with process_vm_readv from this size and this many ranks up. Below 4 MiB
// the staged ring, whose data stays in cache, beats the kernel's page-by-page copy. The kernel copy
// costs enough (about 5 GB/s here) that it only pays once the ring's traffic, 9(n-1)/n S per rank,
// has grown: CPU time per 64 MiB all-reduce, all ranks together, cma / ring: 2 ranks 1.1x,
// 3 ranks 1.0x, 4 ranks 0.8x.
inline constexpr std::size_t kCmaMinBytes = 4u << 20;
inline constexpr int kCmaMinRanks = 4;

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
  double ringUs = 0, treeUs = 0, oneShotUs = 0;  // the model's estimates, for BRAID_DEBUG=INFO
};

TunerChoice tune(const TunerInput& in, const Config& config);

// tune() for one communicator, remembering its last answer: training loops and benchmarks repeat
// the same call, and a choice costs more than a small collective's bookkeeping.
class Tuner {
 public:
  Tuner() = default;
  Tuner(const Config& config, int nranks, int maxChannels, bool anyTcp)
      : config_(config), nranks_(nranks), maxChannels_(maxChannels), anyTcp_(anyTcp) {}
  const TunerChoice& choose(CollKind kind, std::size_t bytes) {
    if (!valid_ || kind != lastKind_ || bytes != lastBytes_) {
      last_ = tune({kind, bytes, nranks_, maxChannels_, anyTcp_}, config_);
      lastKind_ = kind;
      lastBytes_ = bytes;
      valid_ = true;
    }
    return last_;
  }

 private:
  Config config_;
  int nranks_ = 1, maxChannels_ = 1;
  bool anyTcp_ = false;
  bool valid_ = false;
  CollKind lastKind_{};
  std::size_t lastBytes_ = 0;
  TunerChoice last_{};
};

}  // namespace braid
