// TCP between any two ranks. Each rank listens on the address of the chosen interface before it
// publishes its PeerInfo; then every rank connects `channels` sockets to each lower rank and accepts
// them from each higher rank. Each socket opens with a hello (nonce, rank, channel) so that a stray
// connection cannot take a peer's place.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "transport/setup.h"
#include "transport/socket.h"
#include "transport/tcp/tcp_channel.h"

namespace braid {

class TcpTransport {
 public:
  // Picks the interface (BRAID_SOCKET_IFNAME, else the one that routes to `rendezvousIp`) and listens.
  Status listen(const Config& config, const std::string& rendezvousIp);
  const std::string& address() const { return address_; }  // "ip:port"
  Result<std::vector<std::unique_ptr<Connection>>> connect(const SetupContext& ctx, const std::vector<int>& peers);

 private:
  net::Fd listener_;
  std::string address_;
};

}  // namespace braid
