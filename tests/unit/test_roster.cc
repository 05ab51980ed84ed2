// The set-up tree (comm/bootstrap/roster.h): every rank's entry reaches every rank, exactly and in
// rank order, at sizes around the tree's fan-out; the store serves a fixed number of requests per
// rank; a rank that never comes or vanishes is named by every other rank; strangers at a parent's
// listener take no child's place.
#include <gtest/gtest.h>

#include <atomic>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/auth.h"
#include "base/socket.h"
#include "comm/bootstrap/roster.h"
#include "comm/bootstrap/store.h"

namespace braid {
namespace {

std::string entryOf(int r) { return "entry of rank " + std::to_string(r) + std::string(static_cast<std::size_t>(r % 7), 'x'); }

struct Outcome {
  Status status = Status::Ok();
  std::vector<std::string> roster;
  double seconds = 0;
};

// n ranks as threads, each with its own store connection; `skip(r)` ranks join the store (and, if
// `vanish`, leave it without a goodbye) but never the tree.
std::vector<Outcome> run(int n, double timeoutSec, const std::function<bool(int)>& skip = nullptr, bool vanish = false,
                         std::unique_ptr<StoreServer>* keep = nullptr,
                         const std::function<void(const std::string& address)>& atRankZero = nullptr) {
  auto server = StoreServer::start("127.0.0.1", 0, "s3cret");
  EXPECT_TRUE(server.ok());
  const int port = (*server)->port();
  std::vector<Outcome> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Outcome& o = out[static_cast<std::size_t>(r)];
      const auto t0 = std::chrono::steady_clock::now();
      const Deadline d = Deadline::after(timeoutSec);
      auto store = StoreClient::connect("127.0.0.1", port, "s3cret", r, n, Deadline::after(10));
      if (!store.ok()) { o.status = store.status(); return; }
      if (skip && skip(r)) {
        if (!vanish) std::this_thread::sleep_for(std::chrono::duration<double>(timeoutSec + 3));
        ::shutdown((*store)->noticeFd(), SHUT_RDWR);  // gone without a goodbye, as a crash would
        return;
      }
      auto tree = RosterTree::listen("127.0.0.1", "127.0.0.1", !RosterTree::childrenOf(r, n).empty());
      if (!tree.ok()) { o.status = tree.status(); return; }
      Status s = (*store)->set("boot/" + std::to_string(r), (*tree)->address().empty() ? "-" : (*tree)->address(), d);
      if (!s.ok()) { o.status = s; return; }
      if (r == 0 && atRankZero) atRankZero((*tree)->address());
      RosterTree::Job job{r, n, "s3cret", "comm-nonce", d};
      auto all = (*tree)->allGather(job, entryOf(r), [&]() {
        return (*store)->get("boot/" + std::to_string(RosterTree::parentOf(r)), d);
      }, **store);
      o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!all.ok()) { o.status = all.status(); (*store)->close(); return; }
      o.roster = std::move(*all);
      (*store)->close();
    });
  for (auto& t : threads) t.join();
  (*server)->waitUntilAllLeft(Deadline::after(5));
  if (keep) *keep = std::move(server.value());
  return out;
}

// Every rank but `missing` failed within `seconds`, its error containing `text`.
void expectEveryOtherRankFailed(const std::vector<Outcome>& out, int missing, const std::string& text, double seconds) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    if (static_cast<int>(r) == missing) continue;
    const Outcome& o = out[r];
    ASSERT_FALSE(o.status.ok()) << "rank " << r;
    EXPECT_NE(o.status.message().find(text), std::string::npos) << "rank " << r << ": " << o.status.message();
    EXPECT_LT(o.seconds, seconds) << "rank " << r;
  }
}

TEST(Roster, TheTreeIsEightWideAndCoversEveryRankOnce) {
  for (int n : {1, 2, 9, 10, 73, 585, 586, 16384}) {
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    seen[0] = 1;
    for (int r = 0; r < n; ++r)
      for (int c : RosterTree::childrenOf(r, n)) {
        EXPECT_EQ(RosterTree::parentOf(c), r);
        ++seen[static_cast<std::size_t>(c)];
      }
    for (int r = 0; r < n; ++r) ASSERT_EQ(seen[static_cast<std::size_t>(r)], 1) << "rank " << r << " of " << n;
  }
  EXPECT_EQ(RosterTree::childrenOf(0, 100).size(), static_cast<std::size_t>(RosterTree::kFanOut));
  EXPECT_EQ(RosterTree::childrenOf(12, 100), (std::vector<int>{97, 98, 99}));
}

TEST(Roster, EveryRankGetsEveryEntryInRankOrderWithAFewStoreRequestsEach) {
  for (int n : {1, 2, 8, 9, 10, 17, 73}) {
    std::unique_ptr<StoreServer> server;
    auto out = run(n, 30, nullptr, false, &server);
    for (int r = 0; r < n; ++r) {
      const Outcome& o = out[static_cast<std::size_t>(r)];
      ASSERT_TRUE(o.status.ok()) << n << " ranks, rank " << r << ": " << o.status.message();
      ASSERT_EQ(o.roster.size(), static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) ASSERT_EQ(o.roster[static_cast<std::size_t>(q)], entryOf(q)) << "rank " << r;
    }
    // Per rank: hello, its own set, its parent's get, goodbye. Nothing grows with n.
    std::printf("%d ranks: %lld store requests, %lld bytes\n", n, static_cast<long long>(server->requests()),
                static_cast<long long>(server->bytes()));
    EXPECT_LE(server->requests(), 4 * n) << n << " ranks";
    EXPECT_LE(server->bytes(), 400 * n) << n << " ranks";
  }
}

// A rank that joins the store but never the tree: its parent names it once BRAID_TIMEOUT passes,
// and every other rank stops then with the parent's words (their own waits last a second longer
// per level of the tree, so they do not blame their own parent or child first).
TEST(Roster, AChildThatNeverComesIsNamedByItsParentAndEveryRankStopsWithIt) {
  const int n = 20;  // rank 19 is rank 2's child
  auto out = run(n, 2, [](int r) { return r == 19; });
  // (rank 2 waits a level's second longer than BRAID_TIMEOUT)
  expectEveryOtherRankFailed(out, 19, "rank 2 waited for rank(s) 19 (its children in the set-up tree)", 2 + 2.5);
}

// A rank that vanishes (its store connection drops): every rank names it at once.
TEST(Roster, ARankThatVanishesIsNamedByEveryRankAtOnce) {
  const int n = 20;
  auto out = run(n, 30, [](int r) { return r == 11; }, /*vanish=*/true);
  expectEveryOtherRankFailed(out, 11, "rank 11 exited or closed its connection during setup", 5);
}

// At rank 0's listener, before its children come: a silent connection, one that claims to be
// rank 1 with a wrong proof, garbage, and a hang-up. The real ranks finish as if nobody came, and
// the silent connection holds up nobody.
TEST(Roster, StrangersAtAParentTakeNoChildsPlaceAndHoldUpNobody) {
  std::vector<net::Fd> held;
  std::thread attacker;
  // The four connect in rank 0's thread before its gather starts (its listener is open until
  // the gather ends, which could otherwise come first); then they speak, beside the gather.
  std::vector<net::Fd> strangers;
  auto connectAll = [&](const std::string& address) {
    const std::string ip = address.substr(0, address.rfind(':'));
    const int port = std::atoi(address.c_str() + address.rfind(':') + 1);
    for (int kind = 0; kind < 4; ++kind) {
      auto fd = net::connectTo(ip, port, Deadline::after(5));
      ASSERT_TRUE(fd.ok());
      strangers.push_back(std::move(fd.value()));
    }
  };
  auto attack = [&]() {
    for (int kind = 0; kind < static_cast<int>(strangers.size()); ++kind) {
      net::Fd* fd = &strangers[static_cast<std::size_t>(kind)];
      std::uint32_t magic = 0x54525242;
      std::int32_t child = 1;
      std::string hello(reinterpret_cast<const char*>(&magic), 4);
      hello += std::string(reinterpret_cast<const char*>(&child), 4) + std::string(16, 'c');
      if (kind == 0) { held.push_back(std::move(*fd)); continue; }  // silent
      if (kind == 1) {  // claims rank 1, answers the challenge without the secret
        (void)net::sendAll(fd->get(), hello.data(), hello.size(), Deadline::after(1));
        std::string answer(48, '\0');
        (void)net::recvAll(fd->get(), answer.data(), answer.size(), Deadline::after(2));
        auth::Digest wrong = auth::hmacSha256("not the secret", answer.substr(0, 16));
        (void)net::sendAll(fd->get(), wrong.data(), wrong.size(), Deadline::after(1));
        held.push_back(std::move(*fd));
        continue;
      }
      if (kind == 2) (void)net::sendAll(fd->get(), std::string(4096, 'g').data(), 4096, Deadline::after(1));
      fd->reset();  // garbage, or nothing, then a hang-up
    }
  };
  const int n = 9;
  auto out = run(n, 30, nullptr, false, nullptr,
                 [&](const std::string& address) { connectAll(address); attacker = std::thread(attack); });
  attacker.join();
  for (int r = 0; r < n; ++r) {
    const Outcome& o = out[static_cast<std::size_t>(r)];
    ASSERT_TRUE(o.status.ok()) << "rank " << r << ": " << o.status.message();
    for (int q = 0; q < n; ++q) ASSERT_EQ(o.roster[static_cast<std::size_t>(q)], entryOf(q));
    EXPECT_LT(o.seconds, 4) << "rank " << r;  // the silent one had 5 s to prove itself
  }
}

}  // namespace
}  // namespace braid
