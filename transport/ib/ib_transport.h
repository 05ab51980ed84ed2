// InfiniBand verbs (and RoCE) between ranks: RC queue pairs, one per channel (ib_channel.h).
// libibverbs is loaded at run time (ib_verbs.h); the port each rank uses is chosen by ib_port.h.
// Whatever stops it (BRAID_IB_DISABLE, no library, no device, no ACTIVE port, a memlock limit
// below one connection's rings) is the probe's reason, kept and shown by `braid info`, and the
// pair falls back to the next transport (tcp) on both ends.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "transport/ib/ib_channel.h"
#include "transport/setup.h"

namespace braid {

class IbTransport final : public Transport {
 public:
  explicit IbTransport(const Config& config) : config_(config) {}
  std::string_view name() const override { return "ib"; }
  Availability probe() override;
  // The memory one ib connection registers (locked), which the memlock limit must allow.
  static std::size_t lockedBytes(const Config& config);
  // "DEVICE PORT LID GID GID_INDEX GID_TYPE LINK_LAYER MTU": the port and how to address it.
  Result<std::string> localAddress(const std::string& rendezvousIp) override;
  Availability canReach(const PeerInfo& a, const PeerInfo& b) const override;
  LinkClass linkClass(const PeerInfo& a, const PeerInfo& b) const override;
  std::string reachKey(const std::string& address) const override;  // the port's link layer and GID type
  Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx, const std::vector<int>& peers) override;
  // Peers beyond those connect() was given: their queue pairs traded through the store as at
  // set-up, their addresses read from it (SetupContext::fullInfo).
  bool connectsOnUse() const override { return true; }
  Result<std::vector<std::unique_ptr<Connection>>> connectOnUse(const std::vector<int>& peers, const Deadline& deadline,
                                                                const std::function<bool()>& stop) override;
  WaitSources waitSources() const override;

 private:
  // Queue pairs to each of `peers` (addresses: each one's published ib address), traded through
  // the store under ib/<from>/<to>.
  Result<std::vector<std::unique_ptr<Connection>>> establish(const std::vector<int>& peers,
                                                             const std::map<int, std::string>& addresses,
                                                             const Deadline& deadline, const char* how);
  Config config_;
  bool probed_ = false;
  Availability availability_;
  std::shared_ptr<const Verbs> verbs_;
  std::vector<IbPort> ports_;
  std::shared_ptr<IbDevice> device_;
  bool connected_ = false;  // connect() made connections
  bool connectLater_ = false;  // peers may still connect on first use
  int rank_ = -1;
  Exchange* store_ = nullptr;
  std::function<Result<PeerInfo>(int, const Deadline&)> fullInfo_;
};

// A published ib address, parsed (tests and `braid doctor` read it too).
struct IbAddress {
  std::string device;
  int port = 0;
  IbRemotePort remote;
  int gidIndex = 0;
  int gidType = 0;
  static Result<IbAddress> parse(const std::string& text);
  std::string text() const;
};

}  // namespace braid
