// Two ranks connected by one transport of the registry, made directly, without a communicator:
// each rank is a thread of this process with its own Transport object, and they meet through an
// in-process rendezvous store. Conformance tests and bench_transport drive the connections'
// channels by hand (no waiter, no engine), so every transport is tested and measured the same way.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "braid/status.hpp"
#include "base/config.h"
#include "transport/transport.h"

namespace braid::test {

class TransportPair {
 public:
  // The names of every transport in the registry, in its order (for INSTANTIATE_TEST_SUITE_P).
  static std::vector<std::string> registryNames();
  // Both ends of `transport` under `config`. Fails with the transport's own reason when it cannot
  // run here (probe) or the two ranks do not reach each other over it (canReach).
  static Result<std::unique_ptr<TransportPair>> make(const std::string& transport, const Config& config);
  ~TransportPair();
  TransportPair(const TransportPair&) = delete;
  TransportPair& operator=(const TransportPair&) = delete;

  // side 0: rank 0's connection to rank 1; side 1: rank 1's to rank 0.
  Connection& connection(int side) { return *conns_[side]; }
  Channel& channel(int side, int i = 0) { return conns_[side]->channel(i); }
  // Closes one side's connection and its transport, as a rank that exits does.
  void close(int side);

 private:
  TransportPair() = default;
  struct Rank;
  std::unique_ptr<Rank> ranks_[2];
  std::unique_ptr<Connection> conns_[2];
  struct Store;
  std::unique_ptr<Store> store_;
};

}  // namespace braid::test
