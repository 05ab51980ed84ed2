// Transport conformance, written once and instantiated for every transport of the registry: two
// ranks' connections are made by the transport itself (tests/common/transport_pair.h, no
// communicator), and a single thread then drives both ends of one channel through the nonblocking
// Channel interface, so every case is deterministic and needs no sleeps. A second fixture runs a
// communicator over each transport for what needs the whole stack (a collective, an abort).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "tests/common/harness.h"
#include "tests/common/transport_pair.h"
#include "base/socket.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/transport.h"

namespace braid {
namespace {

class TransportConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Config config;
    config.timeoutSec = 20;
    config.ibverbsLib = test::fakeIbverbsLib();  // ib over the verbs emulation (tests/fakeibv)
    auto pair = test::TransportPair::make(GetParam(), config);
    if (!pair.ok() && pair.status().message().find("cannot run here") != std::string::npos)
      GTEST_SKIP() << pair.status().toString();
    ASSERT_TRUE(pair.ok()) << pair.status().toString();
    pair_ = std::move(*pair);
    EXPECT_EQ(pair_->connection(0).transport(), GetParam());
    EXPECT_EQ(pair_->connection(0).peer(), 1);
    EXPECT_EQ(pair_->connection(1).peer(), 0);
    EXPECT_EQ(pair_->connection(0).numChannels(), config.nsocks);
    tx_ = &pair_->channel(0);
    rx_ = &pair_->channel(1);
  }
  // The receiver's three ways to read: peek and consume, tryRecv, and tryRecvLarge (which the
  // engine takes for pieces past largeCopyBytes(), a figure it computes from the host's cache: so
  // it is called here directly, whatever that figure is on this machine).
  enum ReadPath { kPeek, kRecv, kRecvLarge };
  // Moves `n` bytes from tx to rx, alternating sends and receives, in pieces of at most `piece`.
  std::vector<std::byte> pump(const std::vector<std::byte>& data, std::size_t piece, ReadPath path) {
    std::vector<std::byte> got(data.size());
    std::size_t sent = 0, recvd = 0;
    for (int spins = 0; recvd < data.size() && spins < 10000000; ++spins) {
      if (sent < data.size()) {
        auto k = tx_->trySend(data.data() + sent, std::min(piece, data.size() - sent));
        EXPECT_TRUE(k.ok());
        sent += *k;
      }
      if (path == kPeek) {
        auto v = rx_->peek();
        EXPECT_TRUE(v.ok());
        std::size_t k = std::min(v->size(), data.size() - recvd);
        std::memcpy(got.data() + recvd, v->data(), k);
        rx_->consume(k);
        recvd += k;
      } else {
        auto k = path == kRecv ? rx_->tryRecv(got.data() + recvd, data.size() - recvd)
                               : rx_->tryRecvLarge(got.data() + recvd, data.size() - recvd);
        EXPECT_TRUE(k.ok());
        recvd += *k;
      }
    }
    EXPECT_EQ(recvd, data.size());
    return got;
  }
  static std::vector<std::byte> bytes(std::size_t n, int seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(seed)) & 0xff);
    return v;
  }
  std::unique_ptr<test::TransportPair> pair_;
  Channel* tx_ = nullptr;
  Channel* rx_ = nullptr;
};

TEST_P(TransportConformance, EmptySendTakesNothingAndNothingArrives) {
  auto k = tx_->trySend(nullptr, 0);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, 0u);
  auto v = rx_->peek();
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
}

TEST_P(TransportConformance, OneByte) {
  auto data = bytes(1, 7);
  EXPECT_EQ(pump(data, 1, kRecv), data);
}

TEST_P(TransportConformance, UnalignedSizesAndOffsetsArriveIntactThroughEveryReadPath) {
  for (std::size_t n : {3u, 17u, 4093u, 65537u, 3000001u}) {
    auto data = bytes(n + 3, static_cast<int>(n));
    std::vector<std::byte> src(data.begin() + 3, data.end());  // odd offset in the source
    for (ReadPath path : {kPeek, kRecv, kRecvLarge}) EXPECT_EQ(pump(src, 12345, path), src) << n << " bytes, path " << path;
  }
}

TEST_P(TransportConformance, ManyMessagesInFlightKeepTheirOrder) {
  // 2000 messages of varied sizes queued back to back, far more than the staging buffers hold.
  std::vector<std::byte> stream;
  for (int m = 0; m < 2000; ++m) {
    auto msg = bytes(static_cast<std::size_t>(1 + (m * 977) % 5000), m);
    stream.insert(stream.end(), msg.begin(), msg.end());
  }
  EXPECT_EQ(pump(stream, 5000, kPeek), stream);
}

// A reader that takes only part of what it sees each time keeps bytes staged while the stream goes
// on (tcp: also while its staging ring grows from its first size to BRAID_BUFFSIZE), mixing small
// tryRecvs in: every byte arrives once, in order.
TEST_P(TransportConformance, BytesStagedWhileTheStreamGoesOnArriveInOrder) {
  const auto data = bytes(1u << 20, 3);
  std::vector<std::byte> got(data.size());
  std::size_t sent = 0, recvd = 0;
  for (int spins = 0; recvd < data.size() && spins < 10000000; ++spins) {
    if (sent < data.size()) {
      auto k = tx_->trySend(data.data() + sent, std::min<std::size_t>(3001, data.size() - sent));
      ASSERT_TRUE(k.ok());
      sent += *k;
    }
    if (spins % 3 == 2) {  // a small read now and then
      auto k = rx_->tryRecv(got.data() + recvd, std::min<std::size_t>(7, data.size() - recvd));
      ASSERT_TRUE(k.ok());
      recvd += *k;
      continue;
    }
    auto v = rx_->peek();
    ASSERT_TRUE(v.ok());
    const std::size_t k = std::min((v->size() + 2) / 3, data.size() - recvd);
    std::memcpy(got.data() + recvd, v->data(), k);
    rx_->consume(k);
    recvd += k;
  }
  ASSERT_EQ(recvd, data.size());
  EXPECT_TRUE(got == data);
}

TEST_P(TransportConformance, BytesSentBeforeThePeerClosesAreStillDelivered) {
  auto data = bytes(100000, 3);
  std::size_t sent = 0;
  std::vector<std::byte> got(data.size());
  std::size_t recvd = 0;
  // Send everything (draining the receiver only as far as needed to make room), then close.
  while (sent < data.size()) {
    auto k = tx_->trySend(data.data() + sent, data.size() - sent);
    ASSERT_TRUE(k.ok());
    sent += *k;
    if (*k == 0) {
      auto r = rx_->tryRecv(got.data() + recvd, std::min<std::size_t>(4096, data.size() - recvd));
      ASSERT_TRUE(r.ok());
      recvd += *r;
    }
  }
  pair_->close(0);
  // Read the rest through peek(), which stages what has arrived (and then sees the close).
  for (int spins = 0; recvd < data.size() && spins < 1000000; ++spins) {
    auto v = rx_->peek();
    ASSERT_TRUE(v.ok()) << v.status().toString() << " after " << recvd << " bytes";
    std::size_t k = std::min(v->size(), std::min<std::size_t>(1000, data.size() - recvd));
    std::memcpy(got.data() + recvd, v->data(), k);
    rx_->consume(k);
    recvd += k;
  }
  EXPECT_EQ(got, data);
  if (GetParam() == "tcp") {  // the close itself is reported once the data is read
    Result<std::size_t> after = std::size_t{0};
    for (int spins = 0; spins < 100000 && after.ok(); ++spins) {
      std::byte b;
      after = rx_->tryRecv(&b, 1);
    }
    EXPECT_FALSE(after.ok());
  }
}

// Channels of other indices are independent streams.
TEST_P(TransportConformance, EveryChannelIsItsOwnStream) {
  const int n = pair_->connection(0).numChannels();
  for (int i = 0; i < n; ++i) {
    auto data = bytes(1000 + static_cast<std::size_t>(i), i);
    std::size_t sent = 0;
    while (sent < data.size()) {
      auto k = pair_->channel(0, i).trySend(data.data() + sent, data.size() - sent);
      ASSERT_TRUE(k.ok());
      sent += *k;
    }
  }
  for (int i = n; i-- > 0;) {  // read back in the other order
    auto want = bytes(1000 + static_cast<std::size_t>(i), i);
    std::vector<std::byte> got(want.size());
    std::size_t recvd = 0;
    for (int spins = 0; recvd < got.size() && spins < 1000000; ++spins) {
      auto k = pair_->channel(1, i).tryRecv(got.data() + recvd, got.size() - recvd);
      ASSERT_TRUE(k.ok());
      recvd += *k;
    }
    EXPECT_EQ(got, want) << "channel " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportConformance, ::testing::ValuesIn(test::TransportPair::registryNames()),
                         [](const auto& info) { return info.param; });

// A communicator over each transport (BRAID_SHM_DISABLE=1 for tcp): the whole stack on the same connections.
class CommunicatorOverTransport : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("BRAID_SHM_DISABLE", GetParam() == "shm" ? "0" : "1", 1);
    setenv("BRAID_TIMEOUT", "20", 1);
    setenv("BRAID_IBVERBS_LIB", test::fakeIbverbsLib().c_str(), 1);
    setenv("BRAID_IB_DISABLE", GetParam() == "ib" ? "0" : "1", 1);
    braidUniqueId id;
    ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
    braidResult_t r1 = braidInternalError;
    std::thread t([&] { r1 = braidCommInitRank(&b_, 2, id, 1); });
    ASSERT_EQ(braidCommInitRank(&a_, 2, id, 0), braidSuccess);
    t.join();
    ASSERT_EQ(r1, braidSuccess);
    ASSERT_EQ(a_->impl->transportOf(1), GetParam());
  }
  void TearDown() override {
    if (a_ && b_) {
      std::thread t([&] { braidCommDestroy(b_); });
      braidCommDestroy(a_);
      t.join();
    }
    unsetenv("BRAID_SHM_DISABLE");
    unsetenv("BRAID_IBVERBS_LIB");
    unsetenv("BRAID_IB_DISABLE");
  }
  braidComm_t a_ = nullptr, b_ = nullptr;
};

TEST_P(CommunicatorOverTransport, CollectiveOverTheSameConnectionStillWorks) {
  float x0 = 1, x1 = 2, y0 = 0, y1 = 0;
  std::thread t([&] { EXPECT_EQ(braidAllReduce(&x1, &y1, 1, braidFloat32, braidSum, b_, nullptr), braidSuccess); });
  EXPECT_EQ(braidAllReduce(&x0, &y0, 1, braidFloat32, braidSum, a_, nullptr), braidSuccess);
  t.join();
  EXPECT_EQ(y0, 3);
  EXPECT_EQ(y1, 3);
}

TEST_P(CommunicatorOverTransport, AbortWhileAReceiveIsPendingEndsItQuickly) {
  std::vector<float> buf(1 << 16);
  braidResult_t r = braidSuccess;
  auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] { r = braidRecv(buf.data(), buf.size(), braidFloat32, 0, b_, nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  braidCommAbort(a_);  // the peer goes away while rank 1 waits for it
  a_ = nullptr;
  t.join();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r, braidSuccess);
  EXPECT_LT(took, 5.0);
  std::string msg = braidGetLastError(b_);
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  braidCommDestroy(b_);
  b_ = nullptr;
}

INSTANTIATE_TEST_SUITE_P(Transports, CommunicatorOverTransport, ::testing::Values("shm", "ib", "tcp"));

// BRAID_TCP_CONGESTION on two ranks of this host: auto gives every tcp connection reno, system
// leaves the system's default, a name the kernel does not know fails creation on the rank that sets
// it, saying which variable to change, and a malformed value is refused before any connection
// (already by braidGetUniqueId, which reads the configuration too).
class TcpCongestion : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("BRAID_SHM_DISABLE", "1", 1);
    setenv("BRAID_IB_DISABLE", "1", 1);
    setenv("BRAID_TIMEOUT", "20", 1);
  }
  void TearDown() override {
    unsetenv("BRAID_SHM_DISABLE");
    unsetenv("BRAID_IB_DISABLE");
    unsetenv("BRAID_TCP_CONGESTION");
  }
  // Creates two ranks under `value`; on success returns what each of rank 0's sockets to rank 1
  // uses, then destroys both. `error` gets rank 0's message when creation fails.
  std::vector<std::string> pairUsing(const char* value, braidResult_t* r0, std::string* error) {
    setenv("BRAID_TCP_CONGESTION", value, 1);
    braidUniqueId id;
    *r0 = braidGetUniqueId(&id);  // reads the configuration too
    if (*r0 != braidSuccess) {
      *error = braidGetLastError(nullptr);
      return {};
    }
    braidComm_t a = nullptr, b = nullptr;
    braidResult_t r1 = braidInternalError;
    std::thread t([&] { r1 = braidCommInitRank(&b, 2, id, 1); });
    *r0 = braidCommInitRank(&a, 2, id, 0);
    t.join();
    std::vector<std::string> used;
    if (*r0 != braidSuccess) *error = braidGetLastError(nullptr);
    if (*r0 == braidSuccess && r1 == braidSuccess) {
      Connection* c = a->impl->connection(1);
      for (int i = 0; i < c->numChannels(); ++i)
        used.push_back(net::congestionOf(static_cast<TcpChannel&>(c->channel(i)).fd()));
    }
    std::thread d([&] { if (b) braidCommDestroy(b); });
    if (a) braidCommDestroy(a);
    d.join();
    return used;
  }
};

TEST_F(TcpCongestion, AutoPicksRenoBetweenRanksOfOneHost) {
  braidResult_t r = braidInternalError;
  std::string error;
  auto used = pairUsing("auto", &r, &error);
  ASSERT_EQ(r, braidSuccess) << error;
  ASSERT_EQ(used.size(), 2u);
  for (const std::string& cc : used) EXPECT_EQ(cc, "reno");
}

TEST_F(TcpCongestion, SystemLeavesTheDefault) {
  const std::string def = net::systemCongestion();
  if (def.empty()) GTEST_SKIP() << "/proc/sys/net/ipv4/tcp_congestion_control is not readable here";
  braidResult_t r = braidInternalError;
  std::string error;
  auto used = pairUsing("system", &r, &error);
  ASSERT_EQ(r, braidSuccess) << error;
  for (const std::string& cc : used) EXPECT_EQ(cc, def);
}

TEST_F(TcpCongestion, UnknownNameFailsCreationNamingTheVariable) {
  braidResult_t r = braidSuccess;
  std::string error;
  pairUsing("nosuchcc", &r, &error);
  EXPECT_EQ(r, braidInvalidArgument);
  EXPECT_NE(error.find("BRAID_TCP_CONGESTION='nosuchcc'"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
}

TEST_F(TcpCongestion, MalformedValueIsRefusedUpFront) {
  braidResult_t r = braidSuccess;
  std::string error;
  pairUsing("Reno!", &r, &error);
  EXPECT_EQ(r, braidInvalidArgument);
  EXPECT_NE(error.find("BRAID_TCP_CONGESTION='Reno!'"), std::string::npos) << error;
}

}  // namespace
}  // namespace braid
