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
  // Sends `n` bytes on channel 0 until the transfer fails or completes; the error, if any.
  Status pump(test::TransportPair& pair, std::size_t n, double* seconds) {
    std::vector<std::byte> data(n, std::byte{7}), got(n);
    std::size_t sent = 0, recvd = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int spins = 0; recvd < n && spins < 20000000; ++spins) {
      if (sent < n) {
        auto k = pair.channel(0).trySend(data.data() + sent, n - sent);
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
  Status e = pump(**pair, 8 << 20, &s);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(emulationStat("access_errors") - before, 1);
  EXPECT_NE(e.message().find("refused a write over ib (fib0:1): remote access error (IBV_WC_REM_ACCESS_ERR)"),
            std::string::npos) << e.message();
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
