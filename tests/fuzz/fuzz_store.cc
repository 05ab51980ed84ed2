// libFuzzer target: arbitrary bytes sent to a live rendezvous store, as a stranger on the network
// would. The store must neither crash nor stop serving: every few hundred inputs a well-behaved
// client checks that set/get still work.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "comm/store.h"
#include "transport/socket.h"

namespace {

constexpr char kNonce[] = "fuzz";

braid::StoreServer* server() {
  static std::unique_ptr<braid::StoreServer> s;
  if (!s || s->finished()) {  // ranks that "joined" and left end a store: start a new one
    s.reset();
    auto started = braid::StoreServer::start("127.0.0.1", 0, kNonce);
    if (!started.ok()) std::abort();
    s = std::move(started.value());
  }
  return s.get();
}

void checkStillServing() {
  static unsigned calls = 0;
  if (++calls % 256) return;
  braid::StoreServer* s = server();
  // A fresh store for the check: fuzz inputs may legitimately occupy ranks of the current one.
  auto probe = braid::StoreServer::start("127.0.0.1", 0, "probe");
  (void)s;
  if (!probe.ok()) std::abort();
  auto c = braid::StoreClient::connect("127.0.0.1", (*probe)->port(), "probe", 0, 1, braid::Deadline::after(5));
  if (!c.ok() || !(*c)->set("k", "v", braid::Deadline::after(5)).ok()) std::abort();
  auto v = (*c)->get("k", braid::Deadline::after(5));
  if (!v.ok() || *v != "v") std::abort();
  (*c)->close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  braid::StoreServer* s = server();
  auto fd = braid::net::connectTo("127.0.0.1", s->port(), braid::Deadline::after(2));
  if (!fd.ok()) std::abort();  // the store stopped accepting: that is a bug
  (void)braid::net::sendAll(fd->get(), data, size, braid::Deadline::after(0.2));
  ::shutdown(fd->get(), SHUT_WR);
  char buf[4096];
  braid::Deadline d = braid::Deadline::after(0.05);
  while (!d.expired()) {  // drain whatever the store answers, until it closes or goes quiet
    ssize_t k = ::recv(fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN)) break;
    if (k < 0) usleep(200);
  }
  checkStillServing();
  return 0;
}
