// TCP between any two ranks. Each rank listens on the address of the chosen interface before it
// publishes its PeerInfo; then every rank connects `channels` sockets to each lower rank it was
// given and accepts them from each higher one. Each socket opens with a challenge and a hello
// (rank, channel, proof of the job's secret) so that a stray connection cannot take a peer's
// place. Peers left for first use are connected the same way when a call first reaches them; the
// listener stays open for them.
#pragma once
#include <functional>
#include <map>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/setup.h"
#include "base/socket.h"
#include "transport/tcp/tcp_channel.h"

namespace braid {

// The address of the interface a rank's sockets use: BRAID_SOCKET_IFNAME's, else the one that
// routes toward the rendezvous store (the tcp listener and the set-up tree's).
Result<std::string> jobInterfaceAddress(const Config& config, const std::string& rendezvousIp);

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
  Result<std::vector<std::unique_ptr<Connection>>> connectOnUse(const std::vector<int>& peers, const Deadline& deadline,
                                                                const std::function<bool()>& stop) override;
  WaitSources waitSources() const override { return {nullptr, fds_, {}}; }

  // A connector's answer to the acceptor's challenge: who it is, which channel, and the proof that
  // it knows the job's secret (bound to this challenge, both ranks and the channel, so it cannot be
  // replayed or redirected).
  struct Hello {
    std::int32_t rank;
    std::int32_t channel;
    std::uint8_t mac[32];
  };
  // A connection accepted but not yet identified.
  struct Pending {
    net::Fd fd;
    Hello hello{};
    std::size_t got = 0;
    std::string challenge;
    Deadline until = Deadline::after(0);
  };

 private:
  Result<std::vector<std::unique_ptr<Connection>>> establish(const std::vector<int>& peers, const Deadline& deadline,
                                                             bool onUse, const std::function<bool()>& stop);
  Config config_;
  net::Fd listener_;
  std::string address_;
  std::vector<int> fds_;  // every channel's socket, for the waiter
  int rank_ = -1;
  std::string secret_;
  std::vector<std::string> addresses_;  // by rank: its tcp address, "" where it has none
  std::vector<bool> sameHost_;          // by rank: on this rank's host
  std::vector<bool> connected_;         // by rank: a connection was returned for it
  bool listening_ = false;              // the listener stays open for peers connecting on first use
  std::map<int, std::vector<net::Fd>> socks_;  // channels of peers not complete yet, by rank
  std::vector<Pending> pending_;  // accepted, challenged, hello not read yet (kept from call to call)
};

}  // namespace braid
