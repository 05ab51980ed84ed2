// TCP between any two ranks. Each rank listens on the address of the chosen interface before it
// publishes its PeerInfo; then every rank connects `channels` sockets to each lower rank it was
// given and accepts them from each higher one. Each socket opens with a challenge and a hello
// (rank, channel, proof of the job's secret) so that a stray connection cannot take a peer's
// place. Peers left for first use are connected the same way when a call first reaches them; the
// listener stays open for them.
#pragma once
#include <map>
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
  bool connectsOnUse() const override { return true; }
  Result<std::vector<std::unique_ptr<Connection>>> connectOnUse(const std::vector<int>& peers,
                                                                const Deadline& deadline) override;
  WaitSources waitSources() const override { return {nullptr, fds_, {}}; }

 private:
  Result<std::vector<std::unique_ptr<Connection>>> establish(const std::vector<int>& peers, const Deadline& deadline,
                                                             bool onUse);
  Config config_;
  net::Fd listener_;
  std::string address_;
  std::vector<int> fds_;  // every channel's socket, for the waiter
  int rank_ = -1;
  std::string secret_;
  std::vector<std::string> addresses_;  // by rank: its tcp address, "" where it has none
  std::vector<bool> sameHost_;          // by rank: on this rank's host
  std::vector<bool> connected_;         // by rank: a connection was returned for it
  std::map<int, std::vector<net::Fd>> socks_;  // channels of peers not complete yet, by rank
};

}  // namespace braid
