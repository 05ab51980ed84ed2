// What a rank shows besides braid status's answers: its metrics on a port (BRAID_METRICS_PORT,
// Prometheus text served from the store watcher thread) and one JSON line per call
// (BRAID_INSPECT_DIR). Both off by default; the call path pays for the records only when they are on.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "base/log.h"
#include "comm/communicator.h"

namespace braid {

void Comm::openObservers() {
  const std::string host = hostNames_[static_cast<std::size_t>(rank_)];
  if (config_.metricsPort > 0) {
    const auto& mine = hosts_[static_cast<std::size_t>(hostOf_[static_cast<std::size_t>(rank_)])];
    const int index = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
    const int port = config_.metricsPort + index;
    auto fd = port <= 65535 ? net::listenOn(config_.metricsAddr, port, 16) : Status::InvalidArgument("past 65535");
    if (!fd.ok()) {
      // (a second communicator of the process, a split or a torch subgroup, finds the port its
      // first one serves: the first one's metrics are this process's)
      BRAID_LOG(kInfo, kInit, "rank %d: no metrics on %s:%d (BRAID_METRICS_PORT %d + its index %d on its host): %s", rank_,
                config_.metricsAddr.c_str(), port, config_.metricsPort, index, fd.status().message().c_str());
    } else {
      metricsListen_ = std::move(fd.value());
      ::fcntl(metricsListen_.get(), F_SETFL, ::fcntl(metricsListen_.get(), F_GETFL) | O_NONBLOCK);
      store_->serveAlso(metricsListen_.get(), [this] { serveMetrics(); });
    }
  }
  if (!config_.inspectDir.empty()) {
    if (::mkdir(config_.inspectDir.c_str(), 0777) != 0 && errno != EEXIST)
      BRAID_LOG(kWarn, kInit, "BRAID_INSPECT_DIR=%s: cannot create it: %s", config_.inspectDir.c_str(), std::strerror(errno));
    char tag[17];
    std::snprintf(tag, sizeof(tag), "%016llx", static_cast<unsigned long long>(commTag_));
    // One file per communicator and rank: a split or a torch subgroup writes its own.
    const std::string file = config_.inspectDir + "/braid-inspect-" + tag + "-rank" + std::to_string(rank_) + ".jsonl";
    inspect_ = std::fopen(file.c_str(), "a");
    if (!inspect_) BRAID_LOG(kWarn, kInit, "BRAID_INSPECT_DIR: cannot open %s: %s", file.c_str(), std::strerror(errno));
  }
}

// One request, answered and closed. The watcher thread serves it, so it is bounded: a client
// that has not sent its request within 50 ms, or does not take the answer within 50 ms, is dropped.
void Comm::serveMetrics() {
  net::Fd c(::accept4(metricsListen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!c.valid()) return;
  std::string request;
  const Deadline d = Deadline::after(0.05);
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos && request.size() < 8192) {
    pollfd p{c.get(), POLLIN, 0};
    if (::poll(&p, 1, d.msLeft(50)) <= 0) return;
    char buf[1024];
    const ssize_t k = ::recv(c.get(), buf, sizeof(buf), 0);
    if (k <= 0) return;
    request.append(buf, static_cast<std::size_t>(k));
  }
  const bool metrics = request.rfind("GET /metrics", 0) == 0 || request.rfind("GET / ", 0) == 0;
  const std::string body = metrics ? prometheusText({live_.metrics(rank_, hostNames_[static_cast<std::size_t>(rank_)],
                                                                   trace_.now(), trace_.nsPerTick())})
                                   : "braid: GET /metrics\n";
  const std::string reply = std::string(metrics ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n") +
                            "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  (void)net::sendAll(c.get(), reply.data(), reply.size(), Deadline::after(0.05));
}

void Comm::notePeerBytes(int peer, std::uint64_t sent, std::uint64_t recv) {
  for (TracePeerBytes& p : callPeers_)
    if (p.peer == peer) {
      p.sent += sent, p.recv += recv;
      return;
    }
  callPeers_.push_back({peer, sent, recv});
}

void Comm::inspectCall(const Status& s, std::int64_t now) {
  const double nsPerTick = trace_.nsPerTick();
  const std::int64_t startNs = trace_.toNs(callStart_), nowNs = trace_.toNs(now);
  std::string transports, peers;
  std::uint64_t bytes = 0;
  std::map<std::string, int> byTransport;
  std::sort(callPeers_.begin(), callPeers_.end(), [](const TracePeerBytes& a, const TracePeerBytes& b) { return a.peer < b.peer; });
  for (const TracePeerBytes& p : callPeers_) {
    ++byTransport[transportOf(p.peer)];
    bytes += p.sent + p.recv;
    peers += (peers.empty() ? "" : ", ") + std::string("{\"peer\": ") + std::to_string(p.peer) + ", \"sent\": " + std::to_string(p.sent) +
             ", \"recv\": " + std::to_string(p.recv) + "}";
  }
  for (const auto& [name, k] : byTransport) transports += (transports.empty() ? "" : ", ") + ("\"" + name + "\": " + std::to_string(k));
  const Fingerprint& fp = lastCall_;
  std::string call = fp.describe();
  for (char& c : call)
    if (c == '"' || c == '\\') c = '_';
  std::fprintf(inspect_,
               "{\"comm\": \"%016llx\", \"rank\": %d, \"nranks\": %d, \"seq\": %llu, \"call\": \"%s\", \"collective\": \"%s\", \"bytes\": %llu, "
               "\"path\": \"%s\", \"channels\": %d, \"transports\": {%s}, \"peers\": [%s], \"start_ns\": %lld, \"seconds\": %.9f, "
               "\"ok\": %s}\n",
               static_cast<unsigned long long>(commTag_), rank_, nranks_, static_cast<unsigned long long>(fp.seq), call.c_str(), collName(fp.kind), static_cast<unsigned long long>(bytes), lastPath_,
               lastChannels_, transports.c_str(), peers.c_str(), static_cast<long long>(startNs),
               static_cast<double>(now - callStart_) * nsPerTick / 1e9, s.ok() ? "true" : "false");
  if (nowNs - inspectFlushedNs_ >= 1000000000LL) {  // at least once a second
    std::fflush(inspect_);
    inspectFlushedNs_ = nowNs;
  }
}

void Comm::closeObservers() {
  if (inspect_) std::fclose(inspect_);
  inspect_ = nullptr;
  metricsListen_.reset();
}

}  // namespace braid
