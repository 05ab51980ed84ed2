// Shared memory between ranks of one host. For each pair the lower rank creates one segment with a
// ring per channel and direction; every host has one doorbell segment, created by its lowest rank,
// holding one Doorbell and one mailbox area (mailbox.h) per rank. Names carry the
// communicator's nonce; all are unlinked once every rank has mapped them (unlinkAll after the
// setup barrier).
#pragma once
#include <memory>
#include <vector>

#include "transport/doorbell.h"
#include "transport/setup.h"
#include "transport/mailbox.h"
#include "transport/shm/shm_segment.h"

namespace braid {

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const Config& config) : config_(config) {}
  std::string_view name() const override { return "shm"; }
  Availability probe() override;
  // The identity of this process's /dev/shm (device and inode): ranks that see different ones
  // (containers, test hosts, separate mount namespaces) cannot open each other's segments.
  Result<std::string> localAddress(const std::string& rendezvousIp) override;
  Availability canReach(const PeerInfo& a, const PeerInfo& b) const override;
  LinkClass linkClass(const PeerInfo& a, const PeerInfo& b) const override;
  std::string reachKey(const std::string& address) const override { return address; }  // the /dev/shm it sees
  // Connections to `peers`, all on this host and all having chosen shm with this rank.
  Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx, const std::vector<int>& peers) override;
  WaitSources waitSources() const override { return {myBell_, {}, {}}; }
  // What a communicator of `nranks` ranks, `localRanks` of them on this host, holds in this
  // host's /dev/shm: the host's doorbell segment and one segment per pair of local ranks.
  static std::size_t hostBytes(const Config& config, int nranks, int localRanks);
  // Small messages to every rank of this host (null until connect() had peers).
  Mailbox* mailbox() override { return mailbox_.get(); }
  void setupDone() override;  // unlinks every name this rank created

 private:
  Config config_;
  std::shared_ptr<ShmSegment> bells_;
  Doorbell* myBell_ = nullptr;
  std::unique_ptr<Mailbox> mailbox_;
  std::vector<std::shared_ptr<ShmSegment>> created_;
};

}  // namespace braid
