// libFuzzer target: arbitrary bytes sent to a live rendezvous store, either by a stranger (before
// any hello) or, when the first byte is odd, after a correct authenticated hello (so the commands
// behind authentication are fuzzed too). The store must neither crash nor stop serving: every few
// hundred inputs a well-behaved client checks that set/get still work.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "base/auth.h"
#include "comm/bootstrap/store.h"
#include "comm/bootstrap/wire_codec.h"
#include "base/socket.h"

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

// A connection to the live store. The authenticated inputs join as ranks 0..999 of a 1,000-rank
// job in turn, so every 1,000 of them the store has seen all its ranks join and leave, and it
// finishes, as a real store must. The previous input's leave may still be in flight when this
// input starts: a refused connection then waits for that store to finish and meets its successor.
// Only a store that refuses while it has not finished is a bug.
braid::net::Fd connectToStore() {
  braid::StoreServer* s = server();
  auto fd = braid::net::connectTo("127.0.0.1", s->port(), braid::Deadline::after(2));
  if (fd.ok()) return std::move(fd.value());
  braid::Deadline d = braid::Deadline::after(2);
  while (!s->finished() && !d.expired()) usleep(1000);
  if (!s->finished()) std::abort();  // refused while serving
  fd = braid::net::connectTo("127.0.0.1", server()->port(), braid::Deadline::after(2));
  if (!fd.ok()) std::abort();  // a fresh store refused
  return std::move(fd.value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const braid::net::Fd conn = connectToStore();
  if (size > 0 && (data[0] & 1)) {
    // Read the challenge frame (u32 length, 'C', string) and answer it as the clients do.
    std::uint32_t len = 0;
    std::string body;
    if (braid::net::recvAll(conn.get(), &len, 4, braid::Deadline::after(2)).ok() && len > 0 && len < 64) {
      body.resize(len);
      if (braid::net::recvAll(conn.get(), body.data(), len, braid::Deadline::after(2)).ok() && body[0] == 'C') {
        std::string challenge;
        const std::string rest = body.substr(1);  // the Reader points into it: keep it alive
        braid::Reader r(rest);
        static std::int32_t rank = 0;
        rank = (rank + 1) % 1000;  // ranks of a 1,000-rank job in turn (see connectToStore)
        std::string mine(16, 'x');
        braid::Writer signedPart;
        if (r.str(&challenge)) {
          signedPart.str(challenge);
          signedPart.str(mine);
          signedPart.i32(rank);
          signedPart.i32(1000);
          braid::auth::Digest mac = braid::auth::hmacSha256(kNonce, "braid-store-hello" + signedPart.data());
          braid::Writer hello;
          hello.str(mine);
          hello.i32(rank);
          hello.i32(1000);
          hello.str(std::string(reinterpret_cast<const char*>(mac.data()), mac.size()));
          braid::Writer frame;
          frame.u32(static_cast<std::uint32_t>(hello.data().size() + 1));
          frame.u8('H');
          std::string bytes = frame.data() + hello.data();
          (void)braid::net::sendAll(conn.get(), bytes.data(), bytes.size(), braid::Deadline::after(0.2));
        }
      }
    }
    ++data;
    --size;
  }
  (void)braid::net::sendAll(conn.get(), data, size, braid::Deadline::after(0.2));
  ::shutdown(conn.get(), SHUT_WR);
  char buf[4096];
  braid::Deadline d = braid::Deadline::after(0.05);
  while (!d.expired()) {  // drain whatever the store answers, until it closes or goes quiet
    ssize_t k = ::recv(conn.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN)) break;
    if (k < 0) usleep(200);
  }
  checkStillServing();
  return 0;
}
