// The set-up tree: every rank's roster entry (what every other rank must know of it) gathered up a
// tree of the ranks to rank 0 and sent back down, so that no rank asks the store about every other
// rank. The store only tells each rank its parent's address. Each rank sends and receives O(n)
// bytes (its subtree's entries up, the whole roster down, kFanOut copies of it to its children);
// the tree is ceil(log8 n) levels deep. docs/architecture/bootstrap.md.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "braid/status.hpp"
#include "base/deadline.h"
#include "base/socket.h"

namespace braid {

class StoreClient;

class RosterTree {
 public:
  static constexpr int kFanOut = 8;
  // Rank r's parent is (r - 1) / kFanOut; its children r * kFanOut + 1 .. r * kFanOut + kFanOut.
  static int parentOf(int rank) { return (rank - 1) / kFanOut; }
  static std::vector<int> childrenOf(int rank, int nranks);

  // Listens on `bindIp` (port 0) before the rank publishes its PeerInfo, advertising
  // `advertisedIp`: address() is what the rank publishes for its children. A rank without children
  // (7 in 8) opens nothing (`hasChildren` false) and its address is "".
  static Result<std::unique_ptr<RosterTree>> listen(const std::string& bindIp, const std::string& advertisedIp,
                                                    bool hasChildren);
  const std::string& address() const { return address_; }

  struct Job {
    int rank = 0;
    int nranks = 1;
    std::string secret;     // the job's: both ends of every tree connection prove they know it
    std::string commNonce;  // the communicator's: a proof for one communicator is no use for another
    Deadline deadline = Deadline::after(0);
  };
  // Every rank's entry, in rank order. `parentAddress` is asked once (not on rank 0) for the
  // parent's address ("ip:port"); the store's notices (another rank failed or left) end any wait
  // at once with their cause. Every failure names this rank, the peer and its place in the tree.
  Result<std::vector<std::string>> allGather(const Job& job, const std::string& mine,
                                             const std::function<Result<std::string>()>& parentAddress,
                                             StoreClient& store);

 private:
  RosterTree() = default;
  net::Fd listener_;
  std::string address_;
};

}  // namespace braid
