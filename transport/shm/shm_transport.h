// Shared memory between ranks of one host. For each pair the lower rank creates one segment with a
// ring per channel and direction; every host has one doorbell segment, created by its lowest rank,
// holding one Doorbell and one mailbox area (shm_mailbox.h) per rank. Names carry the
// communicator's nonce; all are unlinked once every rank has mapped them (unlinkAll after the
// setup barrier).
#pragma once
#include <memory>
#include <vector>

#include "transport/doorbell.h"
#include "transport/setup.h"
#include "transport/shm/shm_mailbox.h"
#include "transport/shm/shm_segment.h"

namespace braid {

class ShmTransport {
 public:
  static Availability probe(const Config& config);
  // Connections to `peers`, all on this host and all having chosen shm with this rank.
  Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx, const std::vector<int>& peers);
  Doorbell* myDoorbell() const { return myBell_; }
  // Small messages to every rank of this host (null until connect() had peers).
  ShmMailbox* mailbox() const { return mailbox_.get(); }
  void unlinkAll();

 private:
  std::shared_ptr<ShmSegment> bells_;
  Doorbell* myBell_ = nullptr;
  std::unique_ptr<ShmMailbox> mailbox_;
  std::vector<std::shared_ptr<ShmSegment>> created_;
};

}  // namespace braid
