// The ib transport's fallback and failures, over the verbs emulation (tests/fakeibv): each reason
// ib cannot run gives tcp on every pair that involves the rank, with the reason in every rank's
// record of the pair (what `braid info`, the INFO log and `braid doctor` show); errors name the
// peer and the verbs status; an aborted communicator leaves no verbs object behind.
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "comm/communicator.h"
#include "tests/common/harness.h"
#include "tests/common/transport_pair.h"
#include "transport/ib/ib_channel.h"
#include "transport/ib/ib_port.h"

namespace braid {
namespace {

using test::Env;

// Every rank checks every peer: `transport` in use, and `why` (when not empty) in the reasons.
int checkPairs(int rank, int n, braidComm_t comm, const std::string& transport, const std::string& why) {
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    // (The reason names whichever rank of the pair comes first; every rank has this one.)
    const std::string got = comm->impl->transportOf(p), skipped = comm->impl->skippedTransports(p);
    if (got != transport || skipped.find(why) == std::string::npos) {
      test::report(rank, "to rank " + std::to_string(p) + ": " + got + " (skipped: " + skipped + "); wanted " + transport +
                             " with '" + why + "'");
      return 1;
    }
  }
  float x = static_cast<float>(rank + 1), y = 0;
  if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 2;
  return y == static_cast<float>(n * (n + 1) / 2) ? 0 : 3;
}

struct Fallback {
  const char* name;
  Env env;
  const char* why;
};

class IbFallback : public ::testing::TestWithParam<Fallback> {};

TEST_P(IbFallback, GivesTcpWithTheReasonOnEveryRank) {
  const Fallback& f = GetParam();
  Env env = {{"BRAID_SHM_DISABLE", "1"}, {"BRAID_IBVERBS_LIB", test::fakeIbverbsLib()}, {"BRAID_TIMEOUT", "30"}};
  for (const auto& kv : f.env) env.push_back(kv);
  const std::string why = f.why;
  auto outcome = test::runRanks(3, [&](int rank, braidComm_t comm) { return checkPairs(rank, 3, comm, "tcp", why); }, env);
  test::expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(
    Reasons, IbFallback,
    ::testing::Values(
        Fallback{"disabled", {{"BRAID_IB_DISABLE", "1"}}, "disabled by BRAID_IB_DISABLE=1"},
        Fallback{"no_library", {{"BRAID_IBVERBS_LIB", "/nonexistent/libibverbs.so.1"}},
                 "cannot load /nonexistent/libibverbs.so.1: /nonexistent/libibverbs.so.1: cannot open shared object file"},
        Fallback{"no_device", {{"FAKEIBV_DEVICES", ""}}, "no InfiniBand device found"},
        Fallback{"port_down", {{"FAKEIBV_DEVICES", "fib0:state=down"}}, "no ACTIVE port to use: fib0:1 (DOWN)"},
        Fallback{"hca_matches_nothing", {{"BRAID_IB_HCA", "mlx5"}}, "fib0:1 (not in BRAID_IB_HCA=mlx5)"},
        Fallback{"memlock", {{"TEST_MEMLOCK_BYTES", "65536"}},
                 "the memlock limit (ulimit -l) is 64 KiB, below the 4104 KiB one ib connection registers"}),
    [](const auto& info) { return std::string(info.param.name); });

// The mixed job in detail: rank 1 has no ib; 0 and 2 use ib between them and tcp to rank 1,
// every rank naming rank 1 as the reason.
TEST(IbFallbackMixed, PairsWithTheRankWithoutIbUseTcpTheOthersIb) {
  Env env = {{"BRAID_SHM_DISABLE", "1"},
             {"BRAID_IBVERBS_LIB", test::fakeIbverbsLib()},
             {"BRAID_IB_DISABLE", "{rank%2}"},
             {"BRAID_TIMEOUT", "30"}};
  auto outcome = test::runRanks(3, [](int rank, braidComm_t comm) {
    for (int p = 0; p < 3; ++p) {
      if (p == rank) continue;
      const bool withOne = rank == 1 || p == 1;
      const std::string want = withOne ? "tcp" : "ib", got = comm->impl->transportOf(p);
      const std::string skipped = comm->impl->skippedTransports(p);
      if (got != want || (withOne && skipped.find("unusable on rank 1: disabled by BRAID_IB_DISABLE=1") == std::string::npos)) {
        test::report(rank, "to rank " + std::to_string(p) + ": " + got + " (" + skipped + ")");
        return 1;
      }
    }
    float x = 1, y = 0;
    return braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) == braidSuccess && y == 3 ? 0 : 2;
  }, env);
  test::expectEveryRankSucceeded(outcome);
}

// One of the emulation's reports for this process ("" if it is not loaded): fakeibv_live, what
// it holds ("ctx=0 pd=0 mr=0 ..."), or fakeibv_stats, what its NIC met ("rnr_naks=2 ...").
std::string emulationSays(const char* what) {
  void* h = dlopen(test::fakeIbverbsLib().c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return "";
  auto say = reinterpret_cast<int (*)(char*, std::size_t)>(dlsym(h, what));
  char buf[256] = {};
  if (say) say(buf, sizeof(buf));
  dlclose(h);
  return buf;
}
std::string liveVerbsObjects() { return emulationSays("fakeibv_live"); }

// The figure `key` of fakeibv_stats.
int emulationStat(const std::string& key) {
  const std::string s = emulationSays("fakeibv_stats");
  const std::size_t at = s.find(key + "=");
  return at == std::string::npos ? -1 : std::atoi(s.c_str() + at + key.size() + 1);
}

// Two ranks in this process over ib: a collective, then one aborts while the other waits in a
// receive; the waiter fails naming rank 0, and once both are gone the emulation holds nothing.
TEST(IbResources, AbortAndDestroyLeaveNoQpMrCqOrFd) {
  setenv("BRAID_SHM_DISABLE", "1", 1);
  setenv("BRAID_IBVERBS_LIB", test::fakeIbverbsLib().c_str(), 1);
  setenv("BRAID_TIMEOUT", "20", 1);
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  braidComm_t a = nullptr, b = nullptr;
  braidResult_t rb = braidInternalError;
  std::thread t([&] { rb = braidCommInitRank(&b, 2, id, 1); });
  ASSERT_EQ(braidCommInitRank(&a, 2, id, 0), braidSuccess);
  t.join();
  ASSERT_EQ(rb, braidSuccess);
  ASSERT_EQ(a->impl->transportOf(1), "ib");
  const std::string during = liveVerbsObjects();
  EXPECT_NE(during.find("qp=4"), std::string::npos) << during;  // 2 ranks x BRAID_NSOCKS=2 queue pairs
  std::vector<float> x(1 << 16, 1.0f), y(x.size());
  std::thread u([&] { EXPECT_EQ(braidAllReduce(x.data(), y.data(), x.size(), braidFloat32, braidSum, b, nullptr), braidSuccess); });
  EXPECT_EQ(braidAllReduce(x.data(), y.data(), x.size(), braidFloat32, braidSum, a, nullptr), braidSuccess);
  u.join();
  EXPECT_EQ(y[12345], 2.0f);
  braidResult_t r = braidSuccess;
  std::thread v([&] { r = braidRecv(y.data(), y.size(), braidFloat32, 0, b, nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  braidCommAbort(a);
  v.join();
  EXPECT_NE(r, braidSuccess);
  EXPECT_NE(std::string(braidGetLastError(b)).find("rank 0"), std::string::npos) << braidGetLastError(b);
  braidCommDestroy(b);
  EXPECT_EQ(liveVerbsObjects(), "ctx=0 pd=0 mr=0 cq=0 qp=0 srq=0 channel=0 ah=0 fd=0");
  unsetenv("BRAID_SHM_DISABLE");
  unsetenv("BRAID_IBVERBS_LIB");
}

// Faults the emulation injects, seen through one channel of a pair made by the ib transport
// itself (tests/common/transport_pair.h): what the error says, and that it comes within the QP's
// retry budget (here BRAID_IB_TIMEOUT=10, 4 ms a try, and one retry).
class IbFaults : public ::testing::Test {
 protected:
  Config config() {
    Config c;
    c.timeoutSec = 20;
    c.ibverbsLib = test::fakeIbverbsLib();
    c.ibTimeout = 10;
    c.ibRetryCnt = 1;
    return c;
  }
  // Sends `n` bytes on channel 0, in writes of at most `piece`, until the transfer fails or
  // completes; the error, if any.
  Status pump(test::TransportPair& pair, std::size_t n, double* seconds, std::size_t piece = SIZE_MAX) {
    std::vector<std::byte> data(n, std::byte{7}), got(n);
    std::size_t sent = 0, recvd = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int spins = 0; recvd < n && spins < 20000000; ++spins) {
      if (sent < n) {
        auto k = pair.channel(0).trySend(data.data() + sent, std::min(piece, n - sent));
        if (!k.ok()) return k.status();
        sent += *k;
      }
      auto k = pair.channel(1).tryRecv(got.data() + recvd, n - recvd);
      if (!k.ok()) return k.status();
      recvd += *k;
    }
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return recvd == n && got == data ? Status::Ok() : Status::Internal("lost or changed bytes");
  }
  Status sendUntilError(test::TransportPair& pair, double* seconds) {
    std::byte b{1};
    auto t0 = std::chrono::steady_clock::now();
    for (int spins = 0; spins < 20000000; ++spins) {
      auto k = pair.channel(0).trySend(&b, 1);
      if (!k.ok()) {
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return k.status();
      }
    }
    return Status::Ok();
  }
};

TEST_F(IbFaults, ThePeerGoneIsRetryExceededNamingItAndTheKnob) {
  auto pair = test::TransportPair::make("ib", config());
  ASSERT_TRUE(pair.ok()) << pair.status().toString();
  double s = 0;
  ASSERT_TRUE(pump(**pair, 1 << 20, &s).ok());
  (*pair)->close(1);  // rank 1 goes away: its queue pairs with it
  Status e = sendUntilError(**pair, &s);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("rank 1 unreachable over ib (fib0:1): transport retry counter exceeded (IBV_WC_RETRY_EXC_ERR)"),
            std::string::npos) << e.message();
  EXPECT_NE(e.message().find("BRAID_IB_TIMEOUT"), std::string::npos) << e.message();
  EXPECT_LT(s, 5.0);
}

TEST_F(IbFaults, APortGoingDownIsRetryExceeded) {
  auto pair = test::TransportPair::make("ib", config());
  ASSERT_TRUE(pair.ok()) << pair.status().toString();
  double s = 0;
  ASSERT_TRUE(pump(**pair, 1 << 16, &s).ok());
  auto verbs = Verbs::load(test::fakeIbverbsLib());
  ASSERT_TRUE(verbs.ok());
  PortSearch ports = findPorts(**verbs, config());
  ASSERT_FALSE(ports.ports.empty()) << ports.whyNone;
  const char* dirEnv = environmentValue("FAKEIBV_DIR");
  const std::string down = (dirEnv ? std::string(dirEnv) : "/tmp/fakeibv-" + std::to_string(getuid())) + "/down." +
                           std::to_string(ports.ports[0].attr.lid);
  { FILE* f = std::fopen(down.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  // Traffic both ways (data, and credits back) meets the dead port, whichever side sees it first.
  const int before = emulationStat("no_response");
  Status e = pump(**pair, 256 << 20, &s);
  std::remove(down.c_str());
  EXPECT_GT(emulationStat("no_response"), before);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("transport retry counter exceeded"), std::string::npos) << e.message();
}

TEST_F(IbFaults, ReceiverNotReadyIsRetriedAndNothingIsLost) {
  setenv("FAKEIBV_FAULT", "rnr:5", 1);
  auto pair = test::TransportPair::make("ib", config());
  unsetenv("FAKEIBV_FAULT");
  ASSERT_TRUE(pair.ok()) << pair.status().toString();
  double s = 0;
  const int before = emulationStat("rnr_naks");
  Status e = pump(**pair, 3 << 20, &s);
  EXPECT_TRUE(e.ok()) << e.toString();
  EXPECT_GE(emulationStat("rnr_naks") - before, 5);  // the NAKs happened, and were ridden out
}

TEST_F(IbFaults, ARemoteAccessErrorNamesThePeer) {
  setenv("FAKEIBV_FAULT", "access:3", 1);
  auto pair = test::TransportPair::make("ib", config());
  unsetenv("FAKEIBV_FAULT");
  ASSERT_TRUE(pair.ok()) << pair.status().toString();
  double s = 0;
  const int before = emulationStat("access_errors");
  Status e = pump(**pair, 8 << 20, &s, 256 << 10);  // the third write into either side meets the fault
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(emulationStat("access_errors") - before, 1);
  // The writer got the access error; the other side's queue pair failed with it (flushed). The
  // pump may have met either first: ask both ends.
  std::string both;
  for (int side = 0; side < 2; ++side) {
    auto k = (**pair).channel(side).trySend(nullptr, 0);
    both += (k.ok() ? std::string("ok") : k.status().message()) + "\n";
  }
  EXPECT_NE(both.find("refused a write over ib (fib0:1): remote access error (IBV_WC_REM_ACCESS_ERR)"),
            std::string::npos) << both;
}

// The rendezvous (transport/ib/ib_channel.h): a reader that asks for a large piece while its
// inbox is empty advertises its buffer, and the sender writes straight into it. One thread drives
// both ends of a pair: the sender's writes cycle through `pieces`; the reader's steps through
// `reads`, where r > 0 is a tryRecv of r bytes carried on until all r came (the contract in
// transport.h), and 0 a peek whose bytes are consumed (a reader that reduces on receive). Both
// buffers start 3 bytes past an alignment. Returns "" when every byte arrived unchanged.
std::string transfer(Channel& tx, Channel& rx, std::size_t n, const std::vector<std::size_t>& pieces,
                     const std::vector<std::size_t>& reads) {
  std::vector<std::byte> src(n + 3), dst(n + 3, std::byte{0});
  for (std::size_t i = 0; i < n; ++i) src[i + 3] = static_cast<std::byte>((i * 131 + 7) % 251);
  std::size_t sent = 0, recvd = 0, piece = 0, pieceDone = 0, step = 0, stepDone = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (recvd < n) {
    if (std::chrono::steady_clock::now() > deadline)
      return "stuck: " + std::to_string(sent) + " sent, " + std::to_string(recvd) + " received of " + std::to_string(n);
    if (sent < n) {
      const std::size_t want = std::min(pieces[piece % pieces.size()], n - sent + pieceDone) - pieceDone;
      auto k = tx.trySend(src.data() + 3 + sent, want);
      if (!k.ok()) return "send: " + k.status().toString();
      sent += *k;
      pieceDone += *k;
      if (*k == want) piece++, pieceDone = 0;
    }
    const std::size_t r = reads[step % reads.size()];
    if (r == 0) {
      auto v = rx.peek();
      if (!v.ok()) return "peek: " + v.status().toString();
      const std::size_t k = std::min(v->size(), n - recvd);
      if (k) std::memcpy(dst.data() + 3 + recvd, v->data(), k);
      rx.consume(k);
      recvd += k;
      step += k > 0;
    } else {
      const std::size_t want = std::min(r, n - recvd + stepDone) - stepDone;
      auto k = rx.tryRecv(dst.data() + 3 + recvd, want);
      if (!k.ok()) return "recv: " + k.status().toString();
      recvd += *k;
      stepDone += *k;
      if (*k == want) step++, stepDone = 0;
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    if (dst[i + 3] != src[i + 3]) return "byte " + std::to_string(i) + " differs";
  return "";
}

class IbZeroCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    Config c;
    c.timeoutSec = 20;
    c.ibverbsLib = test::fakeIbverbsLib();
    c.ibZcopyBytes = zcopyBytes();
    c.ibOdp = odp();
    if (devices()) ::setenv("FAKEIBV_DEVICES", devices(), 1);
    auto p = test::TransportPair::make("ib", c);
    if (devices()) ::unsetenv("FAKEIBV_DEVICES");
    ASSERT_TRUE(p.ok()) << p.status().toString();
    pair_ = std::move(*p);
  }
  Channel& tx() { return pair_->channel(0); }
  Channel& rx() { return pair_->channel(1); }
  IbChannel& ibTx() { return dynamic_cast<IbChannel&>(tx()); }
  IbChannel& ibRx() { return dynamic_cast<IbChannel&>(rx()); }
  std::uint64_t direct() { return ibRx().directBytes(); }
  virtual std::size_t zcopyBytes() const { return 64u << 10; }  // BRAID_IB_ZCOPY_BYTES
  virtual bool odp() const { return true; }                      // BRAID_IB_ODP
  virtual const char* devices() const { return nullptr; }        // FAKEIBV_DEVICES (null: its default)
  // One message of n bytes from src into dst, which the reader expects (as the engine does).
  std::string message(const std::byte* src, std::byte* dst, std::size_t n) {
    rx().expect(dst, n, 0);
    std::size_t sent = 0, recvd = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (recvd < n) {
      if (std::chrono::steady_clock::now() > deadline) return "stuck at " + std::to_string(recvd);
      if (sent < n) {
        auto k = tx().trySend(src + sent, n - sent);
        if (!k.ok()) return k.status().toString();
        sent += *k;
      }
      auto k = rx().tryRecv(dst + recvd, n - recvd);
      if (!k.ok()) return k.status().toString();
      recvd += *k;
    }
    return std::memcmp(src, dst, n) == 0 ? "" : "bytes differ";
  }
  // The registrations five messages of 2 MiB make, after a first one, between the same buffers.
  int registrationsOfFiveMessages(std::string* error) {
    const std::size_t n = (2u << 20) + 5;
    std::vector<std::byte> src(n, std::byte{7}), dst(n);
    *error = message(src.data(), dst.data(), n);
    const int before = emulationStat("registrations");
    for (int m = 0; m < 5 && error->empty(); ++m) *error = message(src.data(), dst.data(), n);
    return emulationStat("registrations") - before;
  }
  std::unique_ptr<test::TransportPair> pair_;
};

class IbZeroCopyOff : public IbZeroCopy {
  std::size_t zcopyBytes() const override { return 0; }
};

TEST_F(IbZeroCopyOff, EveryPieceGoesThroughTheRings) {
  EXPECT_EQ(transfer(tx(), rx(), (4u << 20) + 5, {1u << 20, 65537}, {1u << 20, 0}), "");
  EXPECT_EQ(direct(), 0u);
}

// The default: pieces of at most half the inbox (what the tuner gives collectives) go through
// the rings; larger ones (send/recv's) are written in place.
class IbZeroCopyAuto : public IbZeroCopy {
  std::size_t zcopyBytes() const override { return Config::kZcopyAuto; }
};

TEST_F(IbZeroCopyAuto, OnlyPiecesOfMoreThanHalfTheInboxGoInPlace) {
  Config c;
  const std::size_t from = IbChannel::zeroCopyFrom(c, c.buffSize);
  ASSERT_GT(from, c.buffSize / 2);
  ASSERT_LE(from, c.buffSize);
  const std::size_t half = c.buffSize / 2;
  EXPECT_EQ(transfer(tx(), rx(), 8 * half + 5, {half}, {half}), "");
  EXPECT_EQ(direct(), 0u);
  const std::size_t n = 4 * from + 3;
  EXPECT_EQ(transfer(tx(), rx(), n, {n}, {n}), "");
  EXPECT_GT(direct(), n / 2);
}

TEST_F(IbZeroCopy, LargeReceivesAreWrittenInPlace) {
  const std::size_t n = (8u << 20) + 7;
  EXPECT_EQ(transfer(tx(), rx(), n, {1u << 20}, {n}), "");
  EXPECT_GT(direct(), n / 2);  // the first piece may go eagerly; the rest in place
}

TEST_F(IbZeroCopy, ExactWhateverTheMixOfReadersAndPieces) {
  // Small eager pieces void an advert half used; peeks between large reads switch the sender back
  // to eager; odd sizes straddle the ring's end and the zero-copy threshold.
  const std::vector<std::size_t> pieces{65536, 1, 200003, 65535, 1048579, 4096, 3u << 20};
  const std::vector<std::size_t> reads{1u << 20, 0, 17, 300007, 0, 65536, 5u << 20};
  EXPECT_EQ(transfer(tx(), rx(), (12u << 20) + 11, pieces, reads), "");
  EXPECT_GT(direct(), 0u);
  // and the channel goes on: a plain stream after the mix
  EXPECT_EQ(transfer(tx(), rx(), 3u << 20, {1u << 20}, {1u << 20}), "");
}

TEST_F(IbZeroCopy, AReaderThatOnlyPeeksGetsEverythingEagerly) {
  EXPECT_EQ(transfer(tx(), rx(), (4u << 20) + 1, {1u << 20}, {0}), "");
  EXPECT_EQ(direct(), 0u);
}

// A reader that only asks for small pieces says it reads eagerly, so a large sender does not hold
// its pieces back for an advert each time the reader has caught up (100 us each, before).
TEST_F(IbZeroCopy, AReaderOfSmallPiecesIsNotWaitedFor) {
  // Each step the reader takes all but a few bytes of what came: the sender has always just
  // caught up, where it holds back for an advert.
  EXPECT_EQ(transfer(tx(), rx(), (4u << 20) + 3, {65536}, {65535}), "");
  EXPECT_EQ(direct(), 0u);
  EXPECT_LE(dynamic_cast<IbChannel&>(tx()).heldBack(), 1u);  // before the reader's first call at most
}

// A buffer the device will not register (past its max_mr_size here; a low memlock limit does the
// same) is received eagerly, and asked for once, not at every poll of that message.
TEST_F(IbZeroCopy, ARefusedRegistrationIsAskedOnce) {
  ::setenv("FAKEIBV_MAX_MR_SIZE", std::to_string(6u << 20).c_str(), 1);  // above the 4 MiB rings
  const std::string res = transfer(tx(), rx(), (16u << 20) + 9, {1u << 20}, {(16u << 20) + 9});
  ::unsetenv("FAKEIBV_MAX_MR_SIZE");
  EXPECT_EQ(res, "");
  EXPECT_EQ(direct(), 0u);
  EXPECT_EQ(dynamic_cast<IbChannel&>(rx()).refusedAdverts(), 1u);
  EXPECT_LE(dynamic_cast<IbChannel&>(tx()).heldBack(), 1u);  // the refusal said "eager"
}

// Messages as the engine sends them: a header, then the payload offered whole, with the reader's
// expect() made before it reads the header. A reader there first gets the whole payload in place,
// the header eagerly before it; one that comes late, when the sender has filled the ring eagerly,
// advertises past that ring and gets the rest in place.
TEST_F(IbZeroCopy, EngineShapedMessagesGoInPlaceEvenWhenTheReaderIsLate) {
  const std::size_t ring = Config{}.buffSize, h = 64, n = 2 * ring + 4099;
  std::vector<std::byte> hdr(h), src(n + 3), gotHdr(h), dst(n + 3);
  for (std::size_t i = 0; i < n; ++i) src[i + 3] = static_cast<std::byte>((i * 131 + 7) % 251);
  auto& ib = dynamic_cast<IbChannel&>(rx());
  std::size_t sent = 0, recvd = 0;  // of header and payload together
  auto sendStep = [&]() -> Result<std::size_t> {
    if (sent < h) return tx().trySend(hdr.data() + sent, h - sent);
    return tx().trySend(src.data() + 3 + (sent - h), n - (sent - h));
  };
  auto recvStep = [&]() -> Result<std::size_t> {
    if (recvd < h) return rx().tryRecv(gotHdr.data() + recvd, h - recvd);
    return rx().tryRecv(dst.data() + 3 + (recvd - h), n - (recvd - h));
  };
  for (int late = 0; late < 2; ++late) {
    SCOPED_TRACE(late ? "the reader late" : "the reader first");
    std::fill(dst.begin(), dst.end(), std::byte{0});
    for (std::size_t i = 0; i < h; ++i) hdr[i] = static_cast<std::byte>(late * 100 + i);
    sent = recvd = 0;
    const std::uint64_t directBefore = ib.directBytes();
    if (late) {
      // The sender holds the payload back a little for an advert (the reader had caught up), then
      // fills the ring eagerly before the reader starts on the message.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (sent < ring && std::chrono::steady_clock::now() < until) {
        auto k = sendStep();
        ASSERT_TRUE(k.ok()) << k.status().toString();
        sent += *k;
        if (*k == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      ASSERT_GE(sent, ring / 2);
      ASSERT_LE(sent, ring);
      EXPECT_EQ(dynamic_cast<IbChannel&>(tx()).heldBack(), 1u);
    }
    rx().expect(dst.data() + 3, n, h);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (recvd < h + n) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << sent << " sent, " << recvd << " received";
      if (sent < h + n) {
        auto k = sendStep();
        ASSERT_TRUE(k.ok()) << k.status().toString();
        sent += *k;
      }
      auto k = recvStep();
      ASSERT_TRUE(k.ok()) << k.status().toString();
      recvd += *k;
    }
    EXPECT_EQ(gotHdr, hdr);
    EXPECT_TRUE(std::equal(src.begin() + 3, src.end(), dst.begin() + 3)) << "payload differs";
    const std::uint64_t direct = ib.directBytes() - directBefore;
    if (late) {
      EXPECT_GE(direct, n - ring);  // all but the ring's worth written before the advert
      EXPECT_LT(direct, n);
    } else {
      EXPECT_EQ(direct, n);
    }
  }
  // Held back once, before the late reader came; never while an advert (ahead) was out.
  EXPECT_EQ(dynamic_cast<IbChannel&>(tx()).heldBack(), 1u);
}

// braidMemAlloc memory is registered once per allocation, at its first use, and that registration
// serves every later message until braidMemFree drops it; the next allocation (maybe at the same
// address) is registered anew. Other memory is registered per message (the tests above).
TEST_F(IbZeroCopy, BraidMemoryIsRegisteredOnceAndDroppedAtItsFree) {
  const std::size_t n = (2u << 20) + 5;
  const auto liveMrs = [] {
    const std::string s = liveVerbsObjects();
    const std::size_t at = s.find(" mr=");
    return at == std::string::npos ? -1 : std::atoi(s.c_str() + at + 4);
  };
  const int liveBefore = liveMrs();
  ASSERT_GE(liveBefore, 0);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("allocation " + std::to_string(round));
    void *s = nullptr, *d = nullptr;
    ASSERT_EQ(braidMemAlloc(&s, n), braidSuccess);
    ASSERT_EQ(braidMemAlloc(&d, n), braidSuccess);
    auto* src = static_cast<std::byte*>(s);
    auto* dst = static_cast<std::byte*>(d);
    for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::byte>((i * 131 + 7 * round) % 251);
    const int regBefore = emulationStat("registrations");
    const std::uint64_t directBefore = direct();
    for (int m = 0; m < 5; ++m) {
      std::memset(dst, 0, n);
      ASSERT_EQ(message(src, dst, n), "") << "message " << m;
    }
    EXPECT_EQ(emulationStat("registrations") - regBefore, 2);  // one per buffer, not per message
    EXPECT_EQ(direct() - directBefore, 5 * n);                 // and every payload in place
    EXPECT_EQ(liveMrs(), liveBefore + 2);
    // Each end's device keeps its own: the reader's for dst, the sender's for src.
    EXPECT_EQ(ibRx().ownedRegistrations(), 1u);
    EXPECT_EQ(ibTx().ownedRegistrations(), 1u);
    EXPECT_EQ(braidMemFree(d), braidSuccess);
    EXPECT_EQ(braidMemFree(s), braidSuccess);
    EXPECT_EQ(liveMrs(), liveBefore);  // the free dropped both
  }
}

// Other memory with on-demand paging (the emulation's default device offers implicit ODP, as
// mlx5 from ConnectX-5 on does): the sender's writes use the one registration of the whole
// address space, and the reader's buffer gets one per range, kept and used again; so five
// messages make one registration, not ten. Buffers freed and allocated again are still written
// right (ODP follows the page tables), and the cache keeps at most kOdpRanges ranges.
TEST_F(IbZeroCopy, OnDemandPagingRegistersOrdinaryMemoryOncePerRange) {
  const std::size_t n = (2u << 20) + 5;
  std::vector<std::byte> src(n), dst(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  ASSERT_EQ(message(src.data(), dst.data(), n), "");  // the first one makes the registrations
  const int regBefore = emulationStat("registrations");
  const std::uint64_t directBefore = direct();
  for (int m = 0; m < 5; ++m) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    ASSERT_EQ(message(src.data(), dst.data(), n), "") << "message " << m;
  }
  EXPECT_EQ(emulationStat("registrations") - regBefore, 0);
  EXPECT_EQ(direct() - directBefore, 5 * n);
  EXPECT_EQ(ibRx().odpRanges(), 1u);
  EXPECT_EQ(ibTx().odpRanges(), 0u);  // implicit: no range of its own
  for (int b = 0; b < 3 * static_cast<int>(IbDevice::kOdpRanges) / 2; ++b) {
    std::vector<std::byte> fresh(n + static_cast<std::size_t>(b) * 4096);
    ASSERT_EQ(message(src.data(), fresh.data(), n), "") << "buffer " << b;
    ASSERT_LE(ibRx().odpRanges(), IbDevice::kOdpRanges);
  }
}

// Without it (a device that has none, or BRAID_IB_ODP=0) each message registers both ends' memory
// and drops the registrations at its end; a device with explicit ODP only gives the sender a
// cached range too.
class IbNoOdp : public IbZeroCopy {
  const char* devices() const override { return "fib0:odp=none"; }
};
class IbOdpOff : public IbZeroCopy {
  bool odp() const override { return false; }
};
class IbExplicitOdp : public IbZeroCopy {
  const char* devices() const override { return "fib0:odp=explicit"; }
};

TEST_F(IbNoOdp, EachMessageRegistersBothEnds) {
  std::string e;
  EXPECT_EQ(registrationsOfFiveMessages(&e), 10);
  EXPECT_EQ(e, "");
  EXPECT_EQ(ibRx().odpRanges(), 0u);
}

TEST_F(IbOdpOff, EachMessageRegistersBothEnds) {
  std::string e;
  EXPECT_EQ(registrationsOfFiveMessages(&e), 10);
  EXPECT_EQ(e, "");
}

TEST_F(IbExplicitOdp, BothEndsKeepARange) {
  std::string e;
  EXPECT_EQ(registrationsOfFiveMessages(&e), 0);
  EXPECT_EQ(e, "");
  EXPECT_EQ(ibRx().odpRanges(), 1u);
  EXPECT_EQ(ibTx().odpRanges(), 1u);
}

TEST_F(IbZeroCopy, ReceivingIntoOtherMemoryThanAdvertisedIsAnError) {
  std::vector<std::byte> a(1u << 20), b(1u << 20);
  auto k = rx().tryRecv(a.data(), a.size());  // nothing sent: it advertises `a`
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, 0u);
  auto e = rx().tryRecv(b.data(), b.size());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("other memory than the buffer it advertised"), std::string::npos)
      << e.status().message();
}

// BRAID_IB_HCA in NCCL's syntax.
TEST(IbHca, FilterSyntax) {
  EXPECT_TRUE(HcaFilter::parse("").matches("mlx5_0", 1));
  EXPECT_TRUE(HcaFilter::parse("mlx5").matches("mlx5_1", 2));  // prefix
  EXPECT_FALSE(HcaFilter::parse("=mlx5").matches("mlx5_1", 1));
  EXPECT_TRUE(HcaFilter::parse("=mlx5_1").matches("mlx5_1", 1));
  EXPECT_TRUE(HcaFilter::parse("mlx5_0:1,mlx5_1").matches("mlx5_0", 1));
  EXPECT_FALSE(HcaFilter::parse("mlx5_0:1,mlx5_1").matches("mlx5_0", 2));
  EXPECT_TRUE(HcaFilter::parse("mlx5_0:1,mlx5_1").matches("mlx5_1", 2));
  EXPECT_FALSE(HcaFilter::parse("^mlx5_1").matches("mlx5_1", 1));
  EXPECT_TRUE(HcaFilter::parse("^mlx5_1").matches("mlx5_0", 1));
  EXPECT_FALSE(HcaFilter::parse("^=mlx5").matches("mlx5", 1));
  EXPECT_TRUE(HcaFilter::parse("^=mlx5").matches("mlx5_0", 1));
  EXPECT_FALSE(HcaFilter::parse("^mlx5_0:1").matches("mlx5_0", 1));
  EXPECT_TRUE(HcaFilter::parse("^mlx5_0:1").matches("mlx5_0", 2));
}

}  // namespace
}  // namespace braid
