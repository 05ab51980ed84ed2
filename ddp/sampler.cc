// The permutation must be the same on every rank without any communication, and the same on every
// platform and standard library, so it comes from our own generator (splitmix64) and our own
// Fisher-Yates shuffle rather than <random>, whose distributions differ between implementations.
#include <numeric>
#include <string>

#include "braid/ddp.hpp"

namespace braid::ddp {

namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0: rejection keeps it exact (no modulo bias).
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }

 private:
  std::uint64_t state_;
};

}  // namespace

DistributedSampler::DistributedSampler(std::size_t size, int ranks, int rank, SamplerOptions o)
    : size_(size), ranks_(ranks), rank_(rank), options_(o) {
  const auto r = static_cast<std::size_t>(ranks);
  numSamples_ = o.dropLast ? size / r : (size + r - 1) / r;
}

Result<DistributedSampler> DistributedSampler::create(std::size_t datasetSize, int ranks, int rank,
                                                      SamplerOptions options) {
  if (ranks <= 0) return Status::InvalidArgument("DistributedSampler: ranks must be > 0, not " + std::to_string(ranks));
  if (rank < 0 || rank >= ranks) {
    return Status::InvalidArgument("DistributedSampler: rank " + std::to_string(rank) + " is outside 0.." +
                                   std::to_string(ranks - 1));
  }
  return DistributedSampler(datasetSize, ranks, rank, options);
}

Result<DistributedSampler> DistributedSampler::create(std::size_t datasetSize, const Communicator& comm,
                                                      SamplerOptions options) {
  return create(datasetSize, comm.size(), comm.rank(), options);
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> order(size_);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (options_.shuffle) {
    SplitMix64 rng(options_.seed + epoch_);
    for (std::size_t i = size_; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  // Pad by wrapping around (more than once if the dataset is smaller than the world), or cut.
  const std::size_t total = totalSize();
  std::vector<std::size_t> mine;
  mine.reserve(numSamples_);
  for (std::size_t pos = static_cast<std::size_t>(rank_); pos < total; pos += static_cast<std::size_t>(ranks_)) {
    mine.push_back(order[pos % size_]);
  }
  return mine;
}

}  // namespace braid::ddp
