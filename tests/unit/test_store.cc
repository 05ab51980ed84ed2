// The rendezvous store (comm/bootstrap/store.h) and its authentication: clients against a live
// server, strangers and garbage, ranks that vanish or whose sockets break.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/auth.h"
#include "base/config.h"
#include "base/socket.h"
#include "comm/bootstrap/store.h"
#include "tests/common/harness.h"

namespace braid {
namespace {

// Store.PeerThatVanishesIsAnnounced's rank 1: this binary again, spawned with UNIT_STORE_PORT set
// (a fork of this threaded process could inherit a lock held by another thread). It joins the
// store and exits without a goodbye, as a crash would.
const bool kStoreChild = [] {
  const char* port = environmentValue("UNIT_STORE_PORT");
  if (!port) return false;
  auto b = StoreClient::connect("127.0.0.1", std::atoi(port), "x", 1, 2, Deadline::after(5));
  _exit(b.ok() ? 0 : 1);
}();

TEST(Store, SetGetAddBarrierAcrossClients) {
  auto server = StoreServer::start("127.0.0.1", 0, "n0nce");
  ASSERT_TRUE(server.ok());
  int port = (*server)->port();
  auto d = Deadline::after(10);
  std::thread other([&] {
    auto c = StoreClient::connect("127.0.0.1", port, "n0nce", 1, 2, d);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE((*c)->set("k", "v", d).ok());
    EXPECT_TRUE((*c)->barrier("b", 2, d).ok());
    (*c)->close();
  });
  auto c = StoreClient::connect("127.0.0.1", port, "n0nce", 0, 2, d);
  ASSERT_TRUE(c.ok());
  auto v = (*c)->get("k", d);  // waits for the other client's set
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "v");
  EXPECT_EQ(*(*c)->add("ctr", 5, d), 5);
  EXPECT_EQ(*(*c)->add("ctr", -2, d), 3);
  EXPECT_TRUE((*c)->barrier("b", 2, d).ok());
  other.join();
  (*c)->close();
  (*server)->waitUntilAllLeft(Deadline::after(5));
}

// A client written by hand against the wire format (docs/architecture/bootstrap.md): frames are
// u32 length, u8 type, payload; strings are u32 length + bytes.
std::string frameOf(char type, const std::string& payload) {
  std::uint32_t len = static_cast<std::uint32_t>(payload.size() + 1);
  return std::string(reinterpret_cast<const char*>(&len), 4) + type + payload;
}
std::string str(const std::string& s) {
  std::uint32_t len = static_cast<std::uint32_t>(s.size());
  return std::string(reinterpret_cast<const char*>(&len), 4) + s;
}
std::string i32(std::int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
// Reads one frame; returns its type ('\0' when the store closed the connection).
char readFrame(int fd, std::string* payload) {
  std::uint32_t len = 0;
  if (!net::recvAll(fd, &len, 4, Deadline::after(5)).ok() || len == 0 || len > (1u << 20)) return '\0';
  std::string body(len, '\0');
  if (!net::recvAll(fd, body.data(), len, Deadline::after(5)).ok()) return '\0';
  *payload = body.substr(1);
  return body[0];
}
std::string helloFor(const std::string& secret, const std::string& storeChallenge, int rank, int nranks) {
  std::string mine(16, 'm');
  std::string signedPart = str(storeChallenge) + str(mine) + i32(rank) + i32(nranks);
  auth::Digest mac = auth::hmacSha256(secret, "braid-store-hello" + signedPart);
  return frameOf('H', str(mine) + i32(rank) + i32(nranks) + str(std::string(reinterpret_cast<const char*>(mac.data()), 32)));
}

TEST(Store, StrangersWrongSecretsReplaysAndGarbageAreDroppedWithoutHarm) {
  auto server = StoreServer::start("127.0.0.1", 0, "right");
  ASSERT_TRUE(server.ok());
  int port = (*server)->port();
  auto d = Deadline::after(5);
  auto wrong = StoreClient::connect("127.0.0.1", port, "wrong", 0, 2, Deadline::after(2));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("secret"), std::string::npos) << wrong.status().message();
  {  // garbage: a frame length past the limit
    auto raw = net::connectTo("127.0.0.1", port, d);
    ASSERT_TRUE(raw.ok());
    std::string challenge;
    ASSERT_EQ(readFrame(raw->get(), &challenge), 'C');
    std::uint32_t huge = 0xffffffffu;
    ASSERT_TRUE(net::sendAll(raw->get(), &huge, 4, d).ok());
    EXPECT_EQ(readFrame(raw->get(), &challenge), '\0');  // dropped
  }
  std::string recorded;
  {  // a correct hand-written hello is admitted (as rank 1 of 2) ...
    auto raw = net::connectTo("127.0.0.1", port, d);
    ASSERT_TRUE(raw.ok());
    std::string p;
    ASSERT_EQ(readFrame(raw->get(), &p), 'C');
    recorded = helloFor("right", p.substr(4), 1, 2);
    ASSERT_TRUE(net::sendAll(raw->get(), recorded.data(), recorded.size(), d).ok());
    EXPECT_EQ(readFrame(raw->get(), &p), 'V');
    std::string bye = frameOf('B', "");
    ASSERT_TRUE(net::sendAll(raw->get(), bye.data(), bye.size(), d).ok());
  }
  {  // ... but the same bytes replayed on a new connection (new challenge) are not
    auto raw = net::connectTo("127.0.0.1", port, d);
    ASSERT_TRUE(raw.ok());
    std::string p;
    ASSERT_EQ(readFrame(raw->get(), &p), 'C');
    ASSERT_TRUE(net::sendAll(raw->get(), recorded.data(), recorded.size(), d).ok());
    EXPECT_EQ(readFrame(raw->get(), &p), 'E');
    EXPECT_EQ(readFrame(raw->get(), &p), '\0');  // and the connection is closed
  }
  {  // truncated hello, then silence: the store neither hangs nor crashes
    auto raw = net::connectTo("127.0.0.1", port, d);
    ASSERT_TRUE(raw.ok());
    std::string half = recorded.substr(0, 20);
    ASSERT_TRUE(net::sendAll(raw->get(), half.data(), half.size(), d).ok());
  }
  auto good = StoreClient::connect("127.0.0.1", port, "right", 0, 2, d);
  ASSERT_TRUE(good.ok()) << good.status().toString();
  EXPECT_TRUE((*good)->set("a", "b", d).ok());
  (*good)->close();
  (*server)->waitUntilAllLeft(Deadline::after(5));
}

TEST(Auth, Sha256AndHmacMatchPublishedVectors) {
  auto hex = [](const auth::Digest& d) { return auth::toHex(d.data(), d.size()); };
  EXPECT_EQ(hex(auth::sha256("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(auth::sha256("abc", 3)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 56 bytes: two final blocks
  EXPECT_EQ(hex(auth::sha256(two.data(), two.size())), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  EXPECT_EQ(hex(auth::sha256(million.data(), million.size())),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 1 and 2, and 6 (a key longer than the block).
  EXPECT_EQ(hex(auth::hmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(auth::hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(auth::hmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Store, PeerThatVanishesIsAnnounced) {
  auto server = StoreServer::start("127.0.0.1", 0, "x");
  ASSERT_TRUE(server.ok());
  int port = (*server)->port();
  auto d = Deadline::after(10);
  auto a = StoreClient::connect("127.0.0.1", port, "x", 0, 2, d);
  ASSERT_TRUE(a.ok());
  std::atomic<int> gone{-1};
  (*a)->startWatching([&](const Notice& n) { if (n.kind == Notice::kPeerGone) gone = n.rank; });
  // Rank 1 is a process that joins and dies without a goodbye, as a crash would.
  pid_t pid = test::spawnSelf("UNIT_STORE_PORT=" + std::to_string(port));
  ASSERT_GT(pid, 0);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_EQ(WEXITSTATUS(st), 0);
  for (int i = 0; i < 500 && gone < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(gone.load(), 1);
  (*a)->close();
}

// Joins the store as RANK of NRANKS over a socket whose receive buffer is RCVBUF bytes (0: the
// system's), by the wire format.
net::Fd joinRaw(int port, const std::string& secret, int rank, int nranks, int rcvbuf = 0) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (rcvbuf > 0) setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return net::Fd();
  std::string p;
  if (readFrame(fd.get(), &p) != 'C') return net::Fd();
  const std::string hello = helloFor(secret, p.substr(4), rank, nranks);
  if (!net::sendAll(fd.get(), hello.data(), hello.size(), Deadline::after(5)).ok() || readFrame(fd.get(), &p) != 'V')
    return net::Fd();
  return fd;
}

// Ranks whose sockets break while the store writes to others (a job's abort): every one of them
// counts as left and the store finishes, however the breaks fall between its polls (a launcher
// hosting the store waits for that before it exits). Rank 1 stops reading, so the store's write of
// rank 2's reports to it comes to wait out its budget (1 s); meanwhile ranks 0 and 2 die. Rank 1 is
// then dropped and announced to them, which finds their sockets broken too: rank 0's after its
// turn in that pass had gone, with no event left to bring another.
TEST(Store, FinishesWhenRanksBreakWhileItWritesToAnother) {
  enum Outcome { kFinished, kStuck, kNotBlocked };
  auto attempt = [](std::string* why) -> Outcome {
    auto server = StoreServer::start("127.0.0.1", 0, "s3cret");
    if (!server.ok()) return *why = server.status().message(), kStuck;
    const int port = (*server)->port();
    net::Fd r0 = joinRaw(port, "s3cret", 0, 3), r1 = joinRaw(port, "s3cret", 1, 3, 4096), r2 = joinRaw(port, "s3cret", 2, 3);
    if (!r0.valid() || !r1.valid() || !r2.valid()) return *why = "a rank could not join", kStuck;
    const std::string report = frameOf('R', i32(Notice::kError) + i32(2) + i32(static_cast<int>(Code::kRemoteError)) +
                                                str(std::string(512 << 10, 'x')));
    const std::string probe = frameOf('S', str("probe") + str(""));
    bool blocked = false;
    for (int k = 0; k < 64 && !blocked; ++k) {
      std::string got;
      if (!net::sendAll(r2.get(), report.data(), report.size(), Deadline::after(5)).ok() || readFrame(r0.get(), &got) != 'N')
        return *why = "rank 2's report did not reach rank 0", kStuck;
      // Rank 0 has it, so the store now writes it to rank 1. A set from rank 2 is answered at
      // once, unless the store is stuck in that write (or, on a loaded machine, only slow).
      if (!net::sendAll(r2.get(), probe.data(), probe.size(), Deadline::after(5)).ok()) return *why = "probe", kStuck;
      char head[5];
      blocked = !net::recvAll(r2.get(), head, sizeof(head), Deadline::after(0.5)).ok();
    }
    if (!blocked) return *why = "rank 1's buffers never filled", kStuck;
    const linger reset{1, 0};  // closed with a reset, as a killed process's socket may be
    for (net::Fd* fd : {&r0, &r2}) {
      setsockopt(fd->get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      fd->reset();
    }
    // (waitUntilAllLeft stops the store at its deadline, which also makes it finished: ask before.)
    const Deadline d = Deadline::after(4);
    while (!(*server)->finished() && !d.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if ((*server)->finished()) return kFinished;
    // Not finished: either the store dropped rank 1 (its write ran out of budget, as meant) and
    // lost count of rank 0, or it was only slow and still holds rank 1, connected. Rank 1's
    // socket tells which: it ends (after what the store had written) only in the first case.
    char buf[65536];
    const Deadline drain = Deadline::after(3);
    while (!drain.expired()) {
      pollfd p{r1.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t k = ::recv(r1.get(), buf, sizeof(buf), 0);
      if (k <= 0) return *why = "the store dropped rank 1 and still waits for ranks that are gone", kStuck;
    }
    return kNotBlocked;
  };
  Outcome o = kNotBlocked;
  std::string why;
  for (int tries = 0; tries < 3 && o == kNotBlocked; ++tries) o = attempt(&why);
  EXPECT_EQ(o, kFinished) << (o == kNotBlocked ? "the store was only slow in 3 tries, never stuck writing to rank 1" : why);
}

}  // namespace
}  // namespace braid
