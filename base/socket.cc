#include "base/socket.h"

#include "base/fdlimit.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace braid::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errnoText(int err) {
  // Out of descriptors: say what the limit is and that it can be raised, wherever this text lands.
  const std::string limit = fdlimit::exhaustedText(err);
  return limit.empty() ? std::string(std::strerror(err)) : limit;
}

namespace {
Result<sockaddr_in> makeAddr(const std::string& ip, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &sa.sin_addr) != 1)
    return Status::InvalidArgument("'" + ip + "' is not an IPv4 address");
  return sa;
}

// Waits until fd is readable (or writable); false on timeout.
Result<bool> waitFd(int fd, short events, const Deadline& d) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, d.msLeft(1000));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return Status::SystemError(std::string("poll: ") + errnoText(errno));
    if (d.expired()) return false;
  }
}
}  // namespace

Result<std::string> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) return Status::SystemError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string(buf);
}

Result<std::string> localAddressToward(const std::string& remoteIp) {
  auto sa = makeAddr(remoteIp, 9);
  if (!sa.ok()) return sa.status();
  Fd s(::socket(AF_INET, SOCK_DGRAM, 0));
  if (!s.valid()) return Status::SystemError("socket: " + errnoText(errno));
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&*sa), sizeof(sockaddr_in)) != 0)
    return Status::SystemError("no route to " + remoteIp + ": " + errnoText(errno));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return std::string(buf);
}

bool interfaceMatches(const std::string& spec, const std::string& ifname) {
  std::string s = spec;
  bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  bool hit = false;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    if (!item.empty() && (exact ? ifname == item : ifname.compare(0, item.size(), item) == 0)) hit = true;
    start = end + 1;
  }
  return exclude ? !hit : hit;
}

namespace {
template <typename Fn>
void forEachIpv4(Fn fn) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    if (fn(std::string(i->ifa_name), std::string(buf))) break;
  }
  freeifaddrs(list);
}
}  // namespace

Result<std::string> addressForInterfaces(const std::string& spec) {
  std::string found, seen;
  forEachIpv4([&](const std::string& name, const std::string& ip) {
    seen += (seen.empty() ? "" : ", ") + name + "=" + ip;
    if (interfaceMatches(spec, name)) { found = ip; return true; }
    return false;
  });
  if (found.empty())
    return Status::InvalidArgument("BRAID_SOCKET_IFNAME='" + spec + "' matches no interface with an IPv4 address (have: " + seen + ")");
  return found;
}

bool isLocalAddress(const std::string& ip) {
  if (ip.rfind("127.", 0) == 0) return true;
  bool hit = false;
  forEachIpv4([&](const std::string&, const std::string& a) { hit = (a == ip); return hit; });
  return hit;
}

Result<std::string> bindAddressFor(const std::string& advertisedIp, const std::string& ifSpec, bool bindAll) {
  if (bindAll) return std::string("0.0.0.0");
  if (isLocalAddress(advertisedIp)) return advertisedIp;
  return ifSpec.empty() ? localAddressToward(advertisedIp) : addressForInterfaces(ifSpec);
}

Result<Fd> listenOn(const std::string& ip, int port, int backlog) {
  auto sa = makeAddr(ip, port);
  if (!sa.ok()) return sa.status();
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Status::SystemError("socket: " + errnoText(errno));
  int one = 1;
  setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&*sa), sizeof(sockaddr_in)) != 0)
    return Status::SystemError("cannot listen on " + ip + ":" + std::to_string(port) + ": " + errnoText(errno) +
                               (errno == EADDRINUSE ? " (another job holds this port, or another process that was also given rank 0: "
                                                      "give each process its own RANK, or pick another MASTER_PORT)"
                                                    : ""));
  if (::listen(s.get(), backlog) != 0) return Status::SystemError("listen: " + errnoText(errno));
  return s;
}

int localPort(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

namespace {
// One attempt; *outOfFds tells the caller not to retry (no listener coming up will fix that).
Result<Fd> connectOnce(const std::string& ip, int port, const Deadline& d, bool* outOfFds) {
  auto sa = makeAddr(ip, port);
  if (!sa.ok()) return sa.status();
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    const int err = errno;
    *outOfFds = fdlimit::exhausted(err);
    return Status::SystemError("socket: " + errnoText(err));
  }
  setNonBlocking(s.get(), true);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&*sa), sizeof(sockaddr_in)) != 0) {
    if (errno != EINPROGRESS) return Status::SystemError(errnoText(errno));
    auto ready = waitFd(s.get(), POLLOUT, d);
    if (!ready.ok()) return ready.status();
    if (!*ready) return Status::Timeout("connect timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) return Status::SystemError(errnoText(err));
  }
  setNonBlocking(s.get(), false);
  setNoDelay(s.get());
  return s;
}
}  // namespace

Result<Fd> connectTo(const std::string& ip, int port, const Deadline& d) {
  bool outOfFds = false;
  return connectOnce(ip, port, d, &outOfFds);
}

Result<Fd> connectWithRetry(const std::string& ip, int port, const Deadline& d, const std::function<bool()>& stop) {
  int backoffMs = 10;
  for (;;) {
    if (stop && stop()) return Status::Aborted("stopped connecting to " + ip + ":" + std::to_string(port));
    bool outOfFds = false;
    auto fd = connectOnce(ip, port, d, &outOfFds);
    if (fd.ok() || outOfFds || d.expired()) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoffMs, d.msLeft())));
    backoffMs = std::min(backoffMs * 2, 500);
  }
}

Result<Fd> acceptOne(int listenFd, const Deadline& d) {
  auto ready = waitFd(listenFd, POLLIN, d);
  if (!ready.ok()) return ready.status();
  if (!*ready) return Status::Timeout("no connection arrived");
  int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return Status::SystemError("accept: " + errnoText(errno));
  setNoDelay(fd);
  return Fd(fd);
}

Status sendAll(int fd, const void* data, std::size_t n, const Deadline& d) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) { p += k; n -= static_cast<std::size_t>(k); continue; }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Status::RemoteError("send failed: " + errnoText(errno));
    auto ready = waitFd(fd, POLLOUT, d);
    if (!ready.ok()) return ready.status();
    if (!*ready) return Status::Timeout("send timed out");
  }
  return Status::Ok();
}

Status recvAll(int fd, void* data, std::size_t n, const Deadline& d) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) { p += k; n -= static_cast<std::size_t>(k); continue; }
    if (k == 0) return Status::RemoteError("connection closed by the other side");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Status::RemoteError("recv failed: " + errnoText(errno));
    auto ready = waitFd(fd, POLLIN, d);
    if (!ready.ok()) return ready.status();
    if (!*ready) return Status::Timeout("receive timed out");
  }
  return Status::Ok();
}

void setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string congestionOf(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name) - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

namespace {
// The first line of a /proc/sys file, without its line end ("" if unreadable).
std::string sysctlLine(const char* path) {
  std::string text;
  if (FILE* f = std::fopen(path, "r")) {
    char line[256] = {};
    if (std::fgets(line, sizeof(line), f)) text = line;
    std::fclose(f);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}
}  // namespace

std::string systemCongestion() { return sysctlLine("/proc/sys/net/ipv4/tcp_congestion_control"); }

Status setCongestion(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0)
    return Status::Ok();
  const int err = errno;
  const std::string offered = sysctlLine(err == EPERM ? "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
                                                      : "/proc/sys/net/ipv4/tcp_available_congestion_control");
  return Status::InvalidArgument("the kernel refused congestion control '" + name + "': " + errnoText(err) +
                                 (offered.empty() ? std::string()
                                                  : std::string(err == EPERM ? " (unprivileged processes may use: "
                                                                             : " (this host offers: ") + offered + ")"));
}

}  // namespace braid::net
