// TCP between any two ranks. Each rank listens on the address of the chosen interface before it
// publishes its PeerInfo; then every rank connects `channels` sockets to each lower rank and accepts
// them from each higher rank. Each socket opens with a hello (nonce, rank, channel) so that a stray
// connection cannot take a peer's place.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "transport/setup.h"
#include "base/socket.h"
#include "transport/tcp/tcp_channel.h"

namespace braid {

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const Config& config) : config_(config) {}
  std::string_view name() const override { return "tcp"; }
  Availability probe() override { return {true, ""}; }
  // Picks the interface (BRAID_SOCKET_IFNAME, else the one that routes to `rendezvousIp`), listens
  // on it, and returns "ip:port".
  Result<std::string> localAddress(const std::string& rendezvousIp) override;
  Availability canReach(const PeerInfo&, const PeerInfo&) const override { return {true, ""}; }
  // Between ranks of one host with BRAID_TCP_CONGESTION=auto, loopback under reno: one stream does best.
  LinkClass linkClass(const PeerInfo& a, const PeerInfo& b) const override;
  long descriptorsPerPeer() const override { return config_.nsocks; }  // a socket per channel
  Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx, const std::vector<int>& peers) override;
  WaitSources waitSources() const override { return {nullptr, fds_, {}}; }

 private:
  Config config_;
  net::Fd listener_;
  std::string address_;
  std::vector<int> fds_;  // every channel's socket, for the waiter
};

}  // namespace braid
