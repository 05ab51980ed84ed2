// TCP socket helpers shared by the rendezvous store and the tcp transport. Setup-time I/O here is
// blocking with a Deadline; the data path (tcp_channel) uses the raw nonblocking fd instead.
#pragma once
#include <functional>
#include <string>
#include <utility>

#include "braid/status.hpp"
#include "base/deadline.h"

namespace braid::net {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept { reset(std::exchange(o.fd_, -1)); return *this; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// IPv4 "a.b.c.d" for a host name or address.
Result<std::string> resolve(const std::string& host);
// The local address the kernel would use to reach `remoteIp` (no packet is sent).
Result<std::string> localAddressToward(const std::string& remoteIp);
// The first IPv4 address of an interface matching NCCL-style `spec`: "eth,ib" prefixes,
// "^docker,lo" excluded prefixes, "=eth0" exact names.
Result<std::string> addressForInterfaces(const std::string& spec);
bool interfaceMatches(const std::string& spec, const std::string& ifname);
// True if `ip` belongs to an interface of this host.
bool isLocalAddress(const std::string& ip);

// Where a listener that others reach at `advertisedIp` binds: every address (0.0.0.0) only when
// `bindAll` (BRAID_SOCKET_BIND_ALL); else `advertisedIp` when it is this host's; else (a name that
// resolves elsewhere, e.g. behind NAT) the address of the `ifSpec` interface, or of the one that
// routes toward `advertisedIp`.
Result<std::string> bindAddressFor(const std::string& advertisedIp, const std::string& ifSpec, bool bindAll);
Result<Fd> listenOn(const std::string& ip, int port, int backlog = 4096);
int localPort(int fd);
// One connect attempt bounded by the deadline.
Result<Fd> connectTo(const std::string& ip, int port, const Deadline& d);
// connectTo, retried with backoff until the deadline (a listener that is not up yet).
// Retries refused connections (the peer not listening yet) until the deadline; `stop`, asked before
// each try, ends it (Aborted) once it says true.
Result<Fd> connectWithRetry(const std::string& ip, int port, const Deadline& d,
                            const std::function<bool()>& stop = nullptr);
Result<Fd> acceptOne(int listenFd, const Deadline& d);

Status sendAll(int fd, const void* data, std::size_t n, const Deadline& d);
Status recvAll(int fd, void* data, std::size_t n, const Deadline& d);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
// The congestion control the kernel uses for `fd`'s sends ("" if it cannot tell).
std::string congestionOf(int fd);
// What new connections get (net.ipv4.tcp_congestion_control; "" if unreadable).
std::string systemCongestion();
// Sets it; the error carries the kernel's reason and the names this host offers.
Status setCongestion(int fd, const std::string& name);
std::string errnoText(int err);

}  // namespace braid::net
