// The tuner picks, per call, the algorithm, how many channels to spread the data over, and the
// pipeline chunk, from a latency/bandwidth cost model. Every rank computes the same choice from the
// same arguments, so no agreement round is needed. BRAID_ALGO and BRAID_CHUNKSIZE override it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "base/config.h"
#include "transport/transport.h"

namespace braid {

// All-reduce calls of at least this many bytes first ask every rank whether its buffers are
// braidMemAlloc memory (one small exchange); below it the exchange would cost more than it saves.
inline constexpr std::size_t kZeroCopyMinBytes = 256u << 10;

// How the ranks sit on hosts, for the hierarchical algorithms: `hosts` hosts of `perHost` ranks
// (the smallest host's count: the columns) to `maxPerHost`, and the slowest link within a host.
struct HostShape {
  int hosts = 1;
  int perHost = 0;
  int maxPerHost = 0;
  LinkClass local;
};
// The shape of Workspace::hosts (every host's ranks); `local` left as it is.
HostShape hostShape(const std::vector<std::vector<int>>& hosts);

struct TunerInput {
  CollKind kind;
  std::size_t bytes;   // the whole array: all-reduce count, all-gather/reduce-scatter n * count
  int nranks;
  int maxChannels;
  // The slowest link among the communicator's pairs (every rank derives it from the same
  // PeerInfos: transport/registry.h slowestLink).
  LinkClass link;
  HostShape shape = {};
  // Every pair connected at set-up (BRAID_CONNECT): only then is the one-shot all-reduce, which
  // reaches every peer, a candidate.
  bool allPairs = true;
};

struct TunerChoice {
  Algo algo;
  int channels;
  std::size_t chunk;
  double ringUs = 0, treeUs = 0, oneShotUs = 0, hierUs = 0, bruckUs = 0;  // the model's estimates, for BRAID_DEBUG=INFO (0: not a candidate)
  double predictedUs = 0;  // the model's time of `algo` (braid tune; 0 for all-to-all and send/recv)
};

TunerChoice tune(const TunerInput& in, const Config& config);

// tune() for one communicator, remembering its last answer: training loops and benchmarks repeat
// the same call, and a choice costs more than a small collective's bookkeeping.
class Tuner {
 public:
  Tuner() = default;
  Tuner(const Config& config, int nranks, int maxChannels, const LinkClass& link, const HostShape& shape = {},
        bool allPairs = true)
      : config_(config), nranks_(nranks), maxChannels_(maxChannels), link_(link), shape_(shape), allPairs_(allPairs) {}
  const TunerChoice& choose(CollKind kind, std::size_t bytes) {
    if (!valid_ || kind != lastKind_ || bytes != lastBytes_) {
      last_ = tune({kind, bytes, nranks_, maxChannels_, link_, shape_, allPairs_}, config_);
      lastKind_ = kind;
      lastBytes_ = bytes;
      valid_ = true;
    }
    return last_;
  }

 private:
  Config config_;
  int nranks_ = 1, maxChannels_ = 1;
  LinkClass link_;
  HostShape shape_;
  bool allPairs_ = true;
  bool valid_ = false;
  CollKind lastKind_{};
  std::size_t lastBytes_ = 0;
  TunerChoice last_{};
};

}  // namespace braid
