#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "base/auth.h"
#include "base/fdlimit.h"
#include "base/log.h"

namespace braid {
using Hello = TcpTransport::Hello;
using Pending = TcpTransport::Pending;
namespace {
constexpr std::size_t kChallengeBytes = 16;

auth::Digest helloMac(const std::string& secret, const std::string& challenge, int from, int to, int channel) {
  std::string msg = "braid-tcp-hello" + challenge + std::to_string(from) + ">" + std::to_string(to) + "#" +
                    std::to_string(channel);
  return auth::hmacSha256(secret, msg);
}

// Whether every channel of a peer has its socket.
bool allChannels(const std::vector<net::Fd>& socks) {
  return std::all_of(socks.begin(), socks.end(), [](const net::Fd& f) { return f.valid(); });
}

// The acceptor's challenge, read in slices of 100 ms so that `stop` (the call was given up: the
// communicator failed) ends the wait at once. Aborted when it did.
Status recvChallenge(int fd, std::string& challenge, const Deadline& deadline, const std::function<bool()>& stop) {
  std::size_t got = 0;
  while (got < challenge.size()) {
    if (stop && stop()) return Status::Aborted("stopped waiting for a peer's challenge");
    ssize_t k = ::recv(fd, challenge.data() + got, challenge.size() - got, MSG_DONTWAIT);
    if (k > 0) {
      got += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return Status::RemoteError("connection closed by the other side");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Status::RemoteError("recv failed: " + net::errnoText(errno));
    if (deadline.expired()) return Status::Timeout("receive timed out");
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, std::min(deadline.msLeft(), 100));
  }
  return Status::Ok();
}

// BRAID_TCP_CONGESTION for one connection to `peer`. Between ranks of one host ("auto") reno: the
// bytes never leave the host, where a model of a network path (bbr's pacing and its estimate-driven
// window, the default of many distributions) only holds them back; docs/PERFORMANCE.md has the
// measurements. "One host" is PeerInfo::sameHostAs, the test the tuner's loopback rule uses too.
// Across hosts the system's choice stands unless one is named. True if it set one.
Result<bool> chooseCongestion(const Config& config, int fd, int peer, bool sameHost) {
  const std::string& want = config.tcpCongestion;
  if (want == "system") return false;
  if (want == "auto" && !sameHost) return false;
  const std::string name = want == "auto" ? "reno" : want;
  Status s = net::setCongestion(fd, name);
  if (s.ok()) return true;
  if (want == "auto") {  // a kernel without reno: keep its default, it still works
    BRAID_LOG(kInfo, kNet, "tcp: keeping the system's congestion control toward rank %d: %s", peer, s.message().c_str());
    return false;
  }
  return Status::InvalidArgument("connection to rank " + std::to_string(peer) + ": BRAID_TCP_CONGESTION='" + want +
                                 "': " + s.message() +
                                 "; set BRAID_TCP_CONGESTION=auto or system to keep the default");
}
}  // namespace

Result<std::string> jobInterfaceAddress(const Config& config, const std::string& rendezvousIp) {
  return config.socketIfname.empty() ? net::localAddressToward(rendezvousIp) : net::addressForInterfaces(config.socketIfname);
}

Result<std::string> TcpTransport::localAddress(const std::string& rendezvousIp) {
  const Config& config = config_;
  Result<std::string> ip = jobInterfaceAddress(config, rendezvousIp);
  if (!ip.ok()) return ip.status();
  // Only the chosen interface's address, so the listener is not reachable through other networks
  // of this host; BRAID_SOCKET_BIND_ALL=1 binds every address but still advertises this one.
  auto fd = net::listenOn(config.socketBindAll ? "0.0.0.0" : *ip, 0);
  if (!fd.ok()) return fd.status();
  listener_ = std::move(fd.value());
  address_ = *ip + ":" + std::to_string(net::localPort(listener_.get()));
  return address_;
}

LinkClass TcpTransport::linkClass(const PeerInfo& a, const PeerInfo& b) const {
  LinkClass l;  // a loopback round trip; a socket's copies through the kernel
  l.latencyUs = 15;
  l.bytesPerUs = 2000;
  // Each piece is a system call on both ends: bigger pieces (2 ranks, 512 KiB all-reduce: 2.0-2.3
  // GB/s busbw with 256 KiB pieces, 1.7-2.0 with 32 KiB).
  l.minPiece = 256u << 10;
  l.sameHost = a.sameHostAs(b);
  l.sharedMemory = false;
  // The rule chooseCongestion applies (reno between ranks of one host), under which a second
  // socket does not pay (docs/PERFORMANCE.md).
  l.oneStreamBest = l.sameHost && config_.tcpCongestion == "auto";
  return l;
}

Result<std::vector<std::unique_ptr<Connection>>> TcpTransport::connect(const SetupContext& ctx,
                                                                       const std::vector<int>& peers) {
  rank_ = ctx.rank;
  secret_ = ctx.secret;
  addresses_.assign(static_cast<std::size_t>(ctx.nranks), "");
  sameHost_.assign(static_cast<std::size_t>(ctx.nranks), false);
  for (int r = 0; r < ctx.nranks; ++r) {
    const PeerInfo& info = ctx.peers[static_cast<std::size_t>(r)];
    const TransportAddress* a = info.transport(name());
    if (a && a->usable) addresses_[static_cast<std::size_t>(r)] = a->address;
    sameHost_[static_cast<std::size_t>(r)] = info.sameHostAs(ctx.peers[static_cast<std::size_t>(ctx.rank)]);
  }
  connected_.assign(static_cast<std::size_t>(ctx.nranks), false);
  listening_ = ctx.connectLater;
  auto out = establish(peers, ctx.deadline, /*onUse=*/false, nullptr);
  if (!ctx.connectLater) {  // everyone has connected: nobody else may
    listener_.reset();
    pending_.clear();
  }
  return out;
}

Result<std::vector<std::unique_ptr<Connection>>> TcpTransport::connectOnUse(const std::vector<int>& peers,
                                                                            const Deadline& deadline,
                                                                            const std::function<bool()>& stop) {
  return establish(peers, deadline, /*onUse=*/true, stop);
}

// Connects `channels` sockets to each lower rank of `peers` and accepts them from each higher one.
// Every accepted connection gets a challenge and a short time to answer; they are served side by
// side, so strangers that connect and stall cannot hold up real ranks. The listener is nonblocking
// so that each pass accepts everything queued (a flood of strangers must not leave a real rank
// waiting behind them one accept per pass), and only connections that poll reports readable are
// read. On use, a higher rank not in `peers` that proves itself is kept too (it is a call ahead of
// this rank and connected first): its connection is returned once all its channels came.
Result<std::vector<std::unique_ptr<Connection>>> TcpTransport::establish(const std::vector<int>& peers,
                                                                         const Deadline& deadline, bool onUse,
                                                                         const std::function<bool()>& stop) {
  const int channels = config_.nsocks;
  const std::string how = onUse ? " (tcp, connecting on first use)" : " (tcp)";
  int expectIncoming = 0;
  for (int p : peers) {
    std::vector<net::Fd>& mine = socks_[p];
    mine.resize(static_cast<std::size_t>(channels));
    if (p > rank_) {
      for (const net::Fd& fd : mine) expectIncoming += !fd.valid();
      continue;
    }
    const std::string& addr = addresses_[static_cast<std::size_t>(p)];
    std::size_t colon = addr.rfind(':');
    std::string ip = addr.substr(0, colon);
    int port = std::atoi(addr.c_str() + colon + 1);
    for (int c = 0; c < channels; ++c) {
      auto fd = net::connectWithRetry(ip, port, deadline, stop);
      if (!fd.ok() && fd.status().code() == Code::kAborted) return fd.status();
      std::string challenge(kChallengeBytes, '\0');
      Status s = fd.ok() ? recvChallenge(fd->get(), challenge, deadline, stop) : fd.status();
      if (!s.ok() && s.code() == Code::kAborted) return s;
      if (!s.ok())
        return Status::SystemError("rank " + std::to_string(rank_) + " could not connect to rank " + std::to_string(p) +
                                   " at " + addr + how + ": " + s.message() +
                                   (s.message().find("open files") != std::string::npos ? std::string()
                                    : !onUse ? "; check BRAID_SOCKET_IFNAME and firewalls between the hosts"
                                    : s.code() == Code::kTimeout
                                        ? "; rank " + std::to_string(p) + " did not answer within BRAID_TIMEOUT: is it in "
                                          "a call that reaches rank " + std::to_string(rank_) + "?"
                                        : std::string()));
      Hello h{};
      h.rank = rank_;
      h.channel = c;
      auth::Digest mac = helloMac(secret_, challenge, rank_, p, c);
      std::memcpy(h.mac, mac.data(), sizeof(h.mac));
      s = net::sendAll(fd->get(), &h, sizeof(h), deadline);
      if (!s.ok()) return s;
      mine[static_cast<std::size_t>(c)] = std::move(fd.value());
    }
  }
  // Connections accepted in an earlier call whose hello had not been read yet are still pending:
  // their ranks sent it (they read the challenge) and count on the channel. Their time runs from
  // when they were accepted, and the loop below reads what came before judging it.
  std::vector<Pending>& pending = pending_;
  std::vector<char> asked(addresses_.size(), 0);  // the higher ranks of `peers`
  for (int p : peers)
    if (p > rank_) asked[static_cast<std::size_t>(p)] = 1;
  std::size_t dropped = 0;
  if (expectIncoming > 0) net::setNonBlocking(listener_.get(), true);
  while (expectIncoming > 0) {
    if (stop && stop()) return Status::Aborted("rank " + std::to_string(rank_) + " stopped connecting" + how);
    if (deadline.expired()) {
      std::string missing;
      for (int p : peers)
        if (p > rank_ && !allChannels(socks_[p]))
          missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      return Status::Timeout("rank " + std::to_string(rank_) + " waited for " + std::to_string(expectIncoming) +
                             " tcp connections from higher ranks that never came (rank(s) " + missing + how +
                             "; BRAID_TIMEOUT)");
    }
    std::vector<pollfd> pfds{{listener_.get(), POLLIN, 0}};
    for (Pending& q : pending) pfds.push_back({q.fd.get(), POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), std::min(deadline.msLeft(), 100));
    std::vector<bool> drop(pending.size(), false);
    for (std::size_t i = 0; i < pending.size(); ++i) {
      Pending& q = pending[i];
      // What came is read first (a hello may have waited since an earlier call); a connection
      // still without its hello past its time is a stranger's.
      if (pfds[i + 1].revents) {
        ssize_t k = ::recv(q.fd.get(), reinterpret_cast<char*>(&q.hello) + q.got, sizeof(Hello) - q.got, MSG_DONTWAIT);
        if (k > 0) q.got += static_cast<std::size_t>(k);
        else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop[i] = true;
      }
      if (!drop[i] && q.got < sizeof(Hello) && q.until.expired()) drop[i] = true;  // silent for too long
      if (!drop[i] && q.got == sizeof(Hello)) {
        const Hello& h = q.hello;
        // A rank this one expects now, or, where peers connect on first use, any higher tcp peer
        // not connected yet (a call ahead of this rank; kept for the call that needs it).
        const bool ranked = h.rank > rank_ && h.rank < static_cast<int>(addresses_.size()) &&
                            h.channel >= 0 && h.channel < channels;
        const bool expected = ranked && (socks_.count(h.rank) ||
                                         ((onUse || listening_) && !connected_[static_cast<std::size_t>(h.rank)] &&
                                          !addresses_[static_cast<std::size_t>(h.rank)].empty()));
        std::vector<net::Fd>* slots = expected ? &socks_[h.rank] : nullptr;
        if (slots) slots->resize(static_cast<std::size_t>(channels));
        const bool known = slots && !(*slots)[static_cast<std::size_t>(h.channel)].valid();
        auth::Digest got{};
        std::memcpy(got.data(), h.mac, got.size());
        if (known && auth::equal(got, helloMac(secret_, q.challenge, h.rank, rank_, h.channel))) {
          net::setNonBlocking(q.fd.get(), false);
          net::setNoDelay(q.fd.get());
          (*slots)[static_cast<std::size_t>(h.channel)] = std::move(q.fd);
          if (asked[static_cast<std::size_t>(h.rank)]) --expectIncoming;
          drop[i] = true;  // done with it: it is a channel now
          continue;
        }
        drop[i] = true;
      }
      if (drop[i] && ++dropped == 1)
        BRAID_LOG(kWarn, kNet, "tcp: dropped a connection that did not prove this job's secret");
    }
    for (std::size_t i = pending.size(); i-- > 0;)
      if (drop[i]) {
        pending[i] = std::move(pending.back());
        pending.pop_back();
      }
    if (pfds[0].revents & POLLIN) {
      for (int n = 0; n < 4096; ++n) {
        int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && fdlimit::exhausted(errno))
          return Status::SystemError("rank " + std::to_string(rank_) + " could not accept the tcp connections of " +
                                     std::to_string(expectIncoming) + " more channels from higher ranks: " +
                                     net::errnoText(errno));
        if (fd < 0) break;  // EAGAIN: nothing more queued
        Pending q;
        q.fd.reset(fd);
        q.challenge = auth::randomBytes(kChallengeBytes);
        q.until = Deadline::after(std::min(config_.timeoutSec, 5.0));
        if (::send(fd, q.challenge.data(), q.challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
            static_cast<ssize_t>(kChallengeBytes))
          pending.push_back(std::move(q));
      }
    }
  }
  if (dropped > 1)
    BRAID_LOG(kWarn, kNet, "tcp: dropped %zu connections in all that did not prove this job's secret", dropped);
  // Every peer whose channels are all here becomes a connection: those asked for, and any other
  // that connected first.
  std::vector<std::unique_ptr<Connection>> out;
  int tuned = 0;
  for (auto it = socks_.begin(); it != socks_.end();) {
    const int p = it->first;
    if (!allChannels(it->second)) {
      ++it;
      continue;
    }
    std::vector<std::unique_ptr<TcpChannel>> chans;
    for (auto& fd : it->second) {
      auto set = chooseCongestion(config_, fd.get(), p, sameHost_[static_cast<std::size_t>(p)]);
      if (!set.ok()) return set.status();
      tuned += *set;
      fds_.push_back(fd.get());
      chans.push_back(std::make_unique<TcpChannel>(std::move(fd), p, config_.buffSize));
    }
    out.push_back(std::make_unique<TcpConnection>(p, std::move(chans)));
    connected_[static_cast<std::size_t>(p)] = true;
    it = socks_.erase(it);
  }
  if (!out.empty())
    BRAID_LOG(kInfo, kNet, "tcp: %zu peers%s, %d sockets each, listening on %s; congestion control %s on %d of them",
              out.size(), onUse ? " on first use" : "", channels, address_.c_str(),
              config_.tcpCongestion == "auto" ? "reno" : config_.tcpCongestion.c_str(), tuned);
  return out;
}

}  // namespace braid
