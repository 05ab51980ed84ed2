// In-process unit tests of the pieces under the communicator: config parsing, interface matching,
// unique ids, fingerprints, partitioning, the tuner, and the rendezvous store.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "braid/braid.h"
#include "comm/algorithms/algorithms.h"
#include "comm/config.h"
#include "comm/fingerprint.h"
#include "comm/init.h"
#include "comm/store.h"
#include "comm/tuner.h"
#include "transport/socket.h"

namespace braid {
namespace {

TEST(Config, SizesAcceptSuffixes) {
  EXPECT_EQ(*parseSize("4096"), 4096u);
  EXPECT_EQ(*parseSize("4K"), 4096u);
  EXPECT_EQ(*parseSize("1M"), 1u << 20);
  EXPECT_EQ(*parseSize("2G"), 2ull << 30);
  EXPECT_FALSE(parseSize("").ok());
  EXPECT_FALSE(parseSize("12Q").ok());
  EXPECT_FALSE(parseSize("-1").ok());
  EXPECT_FALSE(parseSize("99999999999999999999G").ok());
}

TEST(Config, BadValuesNameTheVariable) {
  setenv("BRAID_NSOCKS", "1", 1);
  auto c = Config::fromEnvironment();
  unsetenv("BRAID_NSOCKS");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("BRAID_NSOCKS"), std::string::npos);
  setenv("BRAID_TIMEOUT", "abc", 1);
  EXPECT_FALSE(Config::fromEnvironment().ok());
  setenv("BRAID_TIMEOUT", "2.5", 1);
  auto ok = Config::fromEnvironment();
  unsetenv("BRAID_TIMEOUT");
  ASSERT_TRUE(ok.ok());
  EXPECT_DOUBLE_EQ(ok->timeoutSec, 2.5);
  setenv("BRAID_BUFFSIZE", "3000", 1);
  EXPECT_FALSE(Config::fromEnvironment().ok());  // not a power of two
  unsetenv("BRAID_BUFFSIZE");
}

TEST(Config, EveryRowIsDocumented) {
  auto rows = describeConfig();
  EXPECT_GE(rows.size(), 10u);
  for (auto& r : rows) {
    EXPECT_EQ(std::string(r.name).rfind("BRAID_", 0), 0u);
    EXPECT_GT(std::string(r.meaning).size(), 10u) << r.name;
  }
}

TEST(Config, LaunchEnvFallsBackToOpenMpiAndSlurm) {
  unsetenv("RANK");
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  auto le = readLaunchEnv();
  ASSERT_TRUE(le.ok());
  EXPECT_EQ(le->rank, 3);
  EXPECT_EQ(le->worldSize, 8);
  EXPECT_EQ(le->source, "Open MPI");
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  le = readLaunchEnv();
  EXPECT_EQ(le->rank, 1);
  EXPECT_EQ(le->source, "torchrun");
  setenv("RANK", "x", 1);
  EXPECT_FALSE(readLaunchEnv().ok());
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) unsetenv(v);
}

TEST(Interfaces, NcclSyntax) {
  EXPECT_TRUE(net::interfaceMatches("eth", "eth0"));
  EXPECT_FALSE(net::interfaceMatches("eth", "ib0"));
  EXPECT_TRUE(net::interfaceMatches("eth,ib", "ib1"));
  EXPECT_FALSE(net::interfaceMatches("^docker,lo", "docker0"));
  EXPECT_TRUE(net::interfaceMatches("^docker,lo", "eth0"));
  EXPECT_TRUE(net::interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(net::interfaceMatches("=eth0", "eth01"));
  EXPECT_FALSE(net::addressForInterfaces("=nosuchif0").ok());
}

TEST(UniqueId, StringRoundTrip) {
  auto id = uniqueIdFromString("10.1.2.3:4567/deadbeefdeadbeefdeadbeefdeadbeef");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(uniqueIdToString(*id), "10.1.2.3:4567/deadbeefdeadbeefdeadbeefdeadbeef");
  EXPECT_FALSE(uniqueIdFromString("nonsense").ok());
  EXPECT_FALSE(uniqueIdFromString("host:99999/abc").ok());
  EXPECT_FALSE(uniqueIdFromString(std::string("\0host:1/ab", 10)).ok());  // found by fuzz_parsers
  EXPECT_FALSE(uniqueIdFromString("bad host:1/ab").ok());
  EXPECT_FALSE(uniqueIdFromString("host:1/not-hex").ok());
  char buf[8];
  EXPECT_EQ(braidUniqueIdToString(&*id, buf, sizeof(buf)), braidInvalidArgument);
  braidUniqueId fresh;
  ASSERT_EQ(braidGetUniqueId(&fresh), braidSuccess);
  char text[BRAID_UNIQUE_ID_BYTES];
  ASSERT_EQ(braidUniqueIdToString(&fresh, text, sizeof(text)), braidSuccess);
  braidUniqueId back;
  ASSERT_EQ(braidUniqueIdFromString(text, &back), braidSuccess);
  EXPECT_EQ(uniqueIdToString(back), text);
}

TEST(Fingerprint, DescribesCallsTheWayErrorsQuoteThem) {
  Fingerprint f;
  f.kind = CollKind::kAllReduce;
  f.dtype = DataType::kFloat32;
  f.op = ReduceOp::kSum;
  f.count = 1024;
  EXPECT_EQ(f.describe(), "allreduce(count=1024, float32, sum)");
  f.kind = CollKind::kAllGather;
  f.count = 256;
  EXPECT_EQ(f.describe(), "allgather(count=256, float32)");
  f.kind = CollKind::kBroadcast;
  f.root = 2;
  EXPECT_EQ(f.describe(), "broadcast(count=256, float32, root=2)");
  WireHeader h = makeHeader(f, 7, 1, 1024, 3);
  EXPECT_TRUE(fingerprintOf(h).sameCall(f));
}

TEST(Split, PartsCoverEverythingOnce) {
  for (std::size_t total : {0u, 1u, 7u, 4097u, 1000003u})
    for (std::size_t parts : {1u, 2u, 3u, 8u}) {
      std::size_t next = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        Range r = split(total, parts, i);
        EXPECT_EQ(r.off, next);
        next += r.len;
      }
      EXPECT_EQ(next, total);
    }
}

TEST(Tuner, TreeForSmallMessagesOnManyRanksRingForLarge) {
  Config c;
  auto small = tune({CollKind::kAllReduce, 8, 8, 2, false}, c);
  auto large = tune({CollKind::kAllReduce, 256u << 20, 8, 2, false}, c);
  EXPECT_EQ(small.algo, Algo::kTree);
  EXPECT_EQ(large.algo, Algo::kRing);
  EXPECT_EQ(large.channels, 2);
  EXPECT_EQ(tune({CollKind::kAllGather, 8, 8, 2, false}, c).algo, Algo::kRing);  // no tree all-gather
  c.algo = "ring";
  EXPECT_EQ(tune({CollKind::kAllReduce, 8, 8, 2, false}, c).algo, Algo::kRing);
  c.chunkSize = 12345;
  EXPECT_EQ(tune({CollKind::kAllReduce, 8, 8, 2, false}, c).chunk, 12288u);  // whole 64-byte units
}

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

TEST(Store, WrongNonceAndGarbageAreDroppedWithoutHarm) {
  auto server = StoreServer::start("127.0.0.1", 0, "right");
  ASSERT_TRUE(server.ok());
  int port = (*server)->port();
  auto d = Deadline::after(5);
  EXPECT_FALSE(StoreClient::connect("127.0.0.1", port, "wrong", 0, 1, Deadline::after(2)).ok());
  {
    auto raw = net::connectTo("127.0.0.1", port, d);
    ASSERT_TRUE(raw.ok());
    std::uint32_t huge = 0xffffffffu;  // a frame length past the limit
    ASSERT_TRUE(net::sendAll(raw->get(), &huge, 4, d).ok());
    char c;
    EXPECT_FALSE(net::recvAll(raw->get(), &c, 1, d).ok());  // dropped
  }
  auto good = StoreClient::connect("127.0.0.1", port, "right", 0, 1, d);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)->set("a", "b", d).ok());
  (*good)->close();
  (*server)->waitUntilAllLeft(Deadline::after(5));
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
  pid_t pid = fork();
  if (pid == 0) {
    auto b = StoreClient::connect("127.0.0.1", port, "x", 1, 2, Deadline::after(5));
    _exit(b.ok() ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_EQ(WEXITSTATUS(st), 0);
  for (int i = 0; i < 500 && gone < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(gone.load(), 1);
  (*a)->close();
}

}  // namespace
}  // namespace braid
