#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "comm/log.h"

namespace braid {
namespace {
struct Hello {
  char nonce[32];
  std::int32_t rank;
  std::int32_t channel;
};

void fillNonce(char (&dst)[32], const std::string& nonce) {
  std::memset(dst, 0, sizeof(dst));
  std::memcpy(dst, nonce.data(), std::min(nonce.size(), sizeof(dst)));
}
}  // namespace

Status TcpTransport::listen(const Config& config, const std::string& rendezvousIp) {
  Result<std::string> ip = config.socketIfname.empty() ? net::localAddressToward(rendezvousIp)
                                                       : net::addressForInterfaces(config.socketIfname);
  if (!ip.ok()) return ip.status();
  auto fd = net::listenOn(*ip, 0);
  if (!fd.ok()) return fd.status();
  listener_ = std::move(fd.value());
  address_ = *ip + ":" + std::to_string(net::localPort(listener_.get()));
  return Status::Ok();
}

Result<std::vector<std::unique_ptr<Connection>>> TcpTransport::connect(const SetupContext& ctx,
                                                                       const std::vector<int>& peers) {
  const int channels = ctx.config.nsocks;
  std::map<int, std::vector<net::Fd>> socks;
  for (int p : peers) socks[p].resize(static_cast<std::size_t>(channels));
  int expectIncoming = 0;
  for (int p : peers) {
    if (p > ctx.rank) { expectIncoming += channels; continue; }
    const std::string& addr = ctx.peers[static_cast<std::size_t>(p)].tcpAddr;
    std::size_t colon = addr.rfind(':');
    std::string ip = addr.substr(0, colon);
    int port = std::atoi(addr.c_str() + colon + 1);
    for (int c = 0; c < channels; ++c) {
      auto fd = net::connectWithRetry(ip, port, ctx.deadline);
      if (!fd.ok())
        return Status::SystemError("rank " + std::to_string(ctx.rank) + " could not connect to rank " + std::to_string(p) +
                                   " at " + addr + " (tcp): " + fd.status().message() +
                                   "; check BRAID_SOCKET_IFNAME and firewalls between the hosts");
      Hello h{};
      fillNonce(h.nonce, ctx.nonce);
      h.rank = ctx.rank;
      h.channel = c;
      Status s = net::sendAll(fd->get(), &h, sizeof(h), ctx.deadline);
      if (!s.ok()) return s;
      socks[p][static_cast<std::size_t>(c)] = std::move(fd.value());
    }
  }
  char want[32];
  fillNonce(want, ctx.nonce);
  while (expectIncoming > 0) {
    auto fd = net::acceptOne(listener_.get(), ctx.deadline);
    if (!fd.ok())
      return Status::Timeout("rank " + std::to_string(ctx.rank) + " waited for " + std::to_string(expectIncoming) +
                             " tcp connections from higher ranks that never came (BRAID_TIMEOUT)");
    Hello h{};
    // A connection that does not introduce itself properly is dropped, and setup goes on.
    if (!net::recvAll(fd->get(), &h, sizeof(h), Deadline::after(std::min(ctx.config.timeoutSec, 5.0))).ok()) continue;
    if (std::memcmp(h.nonce, want, sizeof(want)) != 0 || h.channel < 0 || h.channel >= channels || !socks.count(h.rank) ||
        h.rank <= ctx.rank || socks[h.rank][static_cast<std::size_t>(h.channel)].valid()) {
      BRAID_LOG(kWarn, kNet, "tcp: dropped a connection that did not present this communicator's hello");
      continue;
    }
    socks[h.rank][static_cast<std::size_t>(h.channel)] = std::move(fd.value());
    --expectIncoming;
  }
  std::vector<std::unique_ptr<Connection>> out;
  for (int p : peers) {
    std::vector<std::unique_ptr<TcpChannel>> chans;
    for (auto& fd : socks[p]) chans.push_back(std::make_unique<TcpChannel>(std::move(fd), p, ctx.config.buffSize));
    out.push_back(std::make_unique<TcpConnection>(p, std::move(chans)));
  }
  if (!peers.empty()) BRAID_LOG(kInfo, kNet, "tcp: %zu peers, %d sockets each, listening on %s", peers.size(), channels, address_.c_str());
  return out;
}

}  // namespace braid
