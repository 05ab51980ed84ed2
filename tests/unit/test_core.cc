// In-process unit tests of the pieces under the communicator: config parsing, interface matching,
// unique ids, fingerprints, partitioning and the tuner (the rendezvous store: test_store.cc).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <thread>

#include "braid/braid.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator.h"
#include "base/config.h"
#include "comm/fingerprint.h"
#include "base/hostlist.h"
#include "comm/bootstrap/init.h"
#include "comm/tuner.h"
#include "comm/waiter.h"
#include "tests/common/harness.h"
#include "topology/topology.h"
#include "transport/ib/ib_channel.h"
#include "transport/registry.h"
#include "base/socket.h"

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

// BRAID_TIMEOUT=inf or a huge value is a wait without a limit, never an overflow that expires at
// once ("timed out after -9223372036854775808 s").
TEST(Config, HugeOrInfiniteTimeoutsMeanNoLimit) {
  for (const char* v : {"inf", "1e10", "1e300", "infinity"}) {
    setenv("BRAID_TIMEOUT", v, 1);
    auto c = Config::fromEnvironment();
    ASSERT_TRUE(c.ok()) << v << ": " << c.status().toString();
    EXPECT_DOUBLE_EQ(c->timeoutSec, kNoTimeLimitSec) << v;
    Deadline d = Deadline::after(c->timeoutSec);
    EXPECT_FALSE(d.expired()) << v;
    EXPECT_EQ(d.msLeft(), 1 << 30) << v;
  }
  unsetenv("BRAID_TIMEOUT");
  for (double sec : {1e10, 1e300, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    EXPECT_FALSE(Deadline::after(sec).expired()) << sec;
  setenv("BRAID_TIMEOUT", "nan", 1);
  EXPECT_FALSE(Config::fromEnvironment().ok());
  unsetenv("BRAID_TIMEOUT");
  Config c;
  CommOptions o;
  o.timeoutSec = 1e12;  // torch's timeout=timedelta(days=1e7)
  ASSERT_TRUE(applyOptions(o, &c).ok());
  EXPECT_DOUBLE_EQ(c.timeoutSec, kNoTimeLimitSec);
}

// A wait that checks its deadline on every idle pass does not count time the process was stopped.
TEST(Config, DeadlinesDoNotCountTimeTheProcessWasStopped) {
  Deadline d = Deadline::after(2);
  Clock::time_point last{};
  EXPECT_FALSE(d.expiredWhileRunning(&last));
  last -= std::chrono::seconds(30);  // as if SIGSTOPped for 30 s since the last check
  EXPECT_FALSE(d.expiredWhileRunning(&last));
  EXPECT_GT(d.msLeft(), 1000);
  Deadline e = Deadline::after(0.05);
  Clock::time_point l{};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a short gap counts
  EXPECT_TRUE(e.expiredWhileRunning(&l));
}

TEST(Config, ASecretThatIsRefusedIsNotPrinted) {
  setenv("BRAID_SECRET", "hunter2-short", 1);
  auto c = Config::fromEnvironment();
  unsetenv("BRAID_SECRET");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("hunter2"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("BRAID_SECRET (13 characters)"), std::string::npos) << c.status().message();
}

TEST(Config, UnknownBraidVariablesAreNamedWithTheNearestSetting) {
  setenv("BRAID_TIMEUOT", "30", 1);
  setenv("BRAID_NOTHING_LIKE_ANY", "1", 1);
  setenv("BRAID_LAUNCHER", "1", 1);
  auto unknown = unknownVariables();
  unsetenv("BRAID_TIMEUOT");
  unsetenv("BRAID_NOTHING_LIKE_ANY");
  unsetenv("BRAID_LAUNCHER");
  std::sort(unknown.begin(), unknown.end());
  ASSERT_EQ(unknown.size(), 2u);
  EXPECT_EQ(unknown[0], "BRAID_NOTHING_LIKE_ANY");
  EXPECT_EQ(unknown[1], "BRAID_TIMEUOT (did you mean BRAID_TIMEOUT?)");
}

TEST(Config, ASizeOfZeroOrARankOutsideTheJobIsNotCalledUnset) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  auto p = paramsFromEnv({});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().find("not set"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("at least 1 rank"), std::string::npos) << p.status().message();
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  p = paramsFromEnv({});
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("rank 2 (torchrun) is outside 0..1"), std::string::npos) << p.status().message();
}

TEST(Config, EveryRowIsDocumented) {
  auto rows = describeConfig();
  EXPECT_GE(rows.size(), 10u);
  for (auto& r : rows) {
    EXPECT_EQ(std::string(r.name).rfind("BRAID_", 0), 0u);
    EXPECT_GT(std::string(r.meaning).size(), 10u) << r.name;
  }
}

// docs/ENVIRONMENT.md has one row per variable, with the table's default ("(unset)" for none).
TEST(Config, TheEnvironmentDocGivesEveryVariableItsDefault) {
  std::ifstream doc(BRAID_SOURCE_ROOT "/docs/ENVIRONMENT.md");
  ASSERT_TRUE(doc) << BRAID_SOURCE_ROOT "/docs/ENVIRONMENT.md";
  std::vector<std::string> lines;
  for (std::string l; std::getline(doc, l);) lines.push_back(l);
  for (auto& r : describeConfig()) {
    const std::string head = std::string("| `") + r.name + "` | ";
    const std::string def = *r.defaultValue ? std::string("`") + r.defaultValue + "` |" : std::string("(unset) |");
    int rows = 0;
    for (auto& l : lines)
      if (l.rfind(head, 0) == 0) {
        ++rows;
        EXPECT_EQ(l.compare(head.size(), def.size(), def), 0) << r.name << " documented as: " << l.substr(0, 80);
      }
    EXPECT_EQ(rows, 1) << r.name;
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

TEST(Hostlist, ExpandsSlurmExpressions) {
  using V = std::vector<std::string>;
  struct Case { const char* expr; V want; };
  const Case cases[] = {
      {"node1", {"node1"}},
      {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
      {"a,b[8-10],c", {"a", "b8", "b9", "b10", "c"}},
      {"r[1-2]-n[3,5]", {"r1-n3", "r1-n5", "r2-n3", "r2-n5"}},
      {"gpu[7]", {"gpu7"}},
      {"10.0.0.[1-2]", {"10.0.0.1", "10.0.0.2"}},
  };
  for (const Case& c : cases) {
    auto got = expandHostlist(c.expr);
    ASSERT_TRUE(got.ok()) << c.expr << ": " << got.status().toString();
    EXPECT_EQ(*got, c.want) << c.expr;
  }
  EXPECT_EQ(*expandHostlist("n[098-101]x"), (V{"n098x", "n099x", "n100x", "n101x"}));
  auto first = expandHostlist("big[000000-999999],more[1-5]", 1);  // nothing past the limit is made
  ASSERT_TRUE(first.ok()) << first.status().toString();
  EXPECT_EQ(*first, V{"big000000"});
  for (const char* bad : {"", ",", "a,", ",a", "a,,b", "n[", "n]", "n[]", "n[1-]", "n[-1]", "n[3-1]", "n[a]",
                          "n[1[2]]", "n[1,,2]", "a b", "n[0-99999999]"}) {
    auto got = expandHostlist(bad);
    EXPECT_FALSE(got.ok()) << "'" << bad << "' expanded to " << (got.ok() ? got->size() : 0) << " hosts";
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
    }
  }
  // Round trip on random lists: a list printed as Slurm would (prefix[lo-hi,...]) expands back.
  std::uint64_t seed = 12345;
  auto next = [&](std::uint64_t m) { seed = seed * 6364136223846793005ull + 1442695040888963407ull; return (seed >> 33) % m; };
  for (int trial = 0; trial < 500; ++trial) {
    const std::size_t width = 1 + next(4);
    std::string expr = "h[";
    V want;
    std::uint64_t v = next(5);
    for (int r = 0, n = 1 + static_cast<int>(next(4)); r < n; ++r) {
      const std::uint64_t lo = v, hi = lo + next(4);
      auto pad = [&](std::uint64_t x) {
        std::string t = std::to_string(x);
        t.insert(0, t.size() < width ? width - t.size() : 0, '0');
        return t;
      };
      if (r) expr += ',';
      expr += pad(lo);
      if (hi > lo) expr.append("-").append(pad(hi));
      for (std::uint64_t x = lo; x <= hi; ++x) want.push_back(std::string("h").append(pad(x)));
      v = hi + 2 + next(3);
    }
    expr += "]";
    auto got = expandHostlist(expr);
    ASSERT_TRUE(got.ok()) << expr;
    EXPECT_EQ(*got, want) << expr;
  }
}

// Slurm: rank 0's host from the step's node list (else the job's), the port from MASTER_PORT or
// the job id; a job on several hosts with no way to find rank 0 is refused with what to export.
TEST(Config, SlurmNodeListGivesTheRendezvousHostAndOpenMpiAcrossHostsNeedsMasterAddr) {
  const char* all[] = {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                       "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
                       "SLURM_NNODES", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* v : all) unsetenv(v);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_JOB_NODELIST", "gpu[07-10]", 1);
  setenv("SLURM_STEP_NODELIST", "gpu[08-09]", 1);
  setenv("SLURM_JOB_ID", "123456", 1);
  auto le = readLaunchEnv();
  ASSERT_TRUE(le.ok()) << le.status().toString();
  EXPECT_EQ(le->masterAddr, "gpu08");
  EXPECT_EQ(le->masterAddrFrom, "the first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(le->masterPort, kSlurmPortBase + 123456 % kSlurmPortSpan);
  unsetenv("SLURM_STEP_NODELIST");
  setenv("MASTER_PORT", "31000", 1);
  le = readLaunchEnv();
  EXPECT_EQ(le->masterAddr, "gpu07");
  EXPECT_EQ(le->masterPort, 31000);
  setenv("SLURM_JOB_NODELIST", "gpu[07-", 1);
  EXPECT_FALSE(readLaunchEnv().ok());
  unsetenv("SLURM_JOB_NODELIST");
  setenv("SLURM_NNODES", "2", 1);
  auto comm = initFromEnv();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), Code::kInvalidUsage);
  EXPECT_NE(comm.status().message().find("export MASTER_ADDR"), std::string::npos) << comm.status().toString();
  for (const char* v : all) unsetenv(v);
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  comm = initFromEnv();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), Code::kInvalidUsage);
  EXPECT_NE(comm.status().message().find("mpirun -x MASTER_ADDR="), std::string::npos) << comm.status().toString();
  setenv("MASTER_PORT", "0", 1);
  EXPECT_FALSE(readLaunchEnv().ok());
  for (const char* v : all) unsetenv(v);
}

// torchrun's elastic agent holds MASTER_PORT with its own store: Braid's goes on the next port.
TEST(Config, UnderTorchrunTheStoreTakesTheNextPort) {
  const char* all[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"};
  for (const char* v : all) unsetenv(v);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_PORT", "29777", 1);
  EXPECT_EQ(readLaunchEnv()->masterPort, 29777);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  auto le = readLaunchEnv();
  ASSERT_TRUE(le.ok());
  EXPECT_EQ(le->masterPort, 29778);
  EXPECT_NE(le->masterPortFrom.find("torchrun"), std::string::npos);
  setenv("MASTER_PORT", "65535", 1);
  EXPECT_FALSE(readLaunchEnv().ok());
  for (const char* v : all) unsetenv(v);
}

TEST(Topology, CpuListsRoundTripInLinuxSyntax) {
  using braid::topology::cpuListText;
  using braid::topology::parseCpuList;
  EXPECT_EQ(cpuListText({}), "");
  EXPECT_EQ(cpuListText({3}), "3");
  EXPECT_EQ(cpuListText({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(parseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parseCpuList("5,1-2,2"), (std::vector<int>{1, 2, 5}));  // sorted, each once
  for (const char* bad : {"", "x", "1-", "3-1", "1,,2", "1,", "-1", "1-2-3", "70000"})
    EXPECT_TRUE(parseCpuList(bad).empty()) << bad;
  // This process's own mask, through the text peers exchange at setup, comes back the same.
  const std::vector<int> mine = braid::topology::allowedCpus();
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(parseCpuList(cpuListText(mine)), mine);
  // Cores partition the allowed CPUs.
  std::vector<int> covered;
  for (const auto& core : braid::topology::allowedCores()) covered.insert(covered.end(), core.begin(), core.end());
  std::sort(covered.begin(), covered.end());
  EXPECT_EQ(covered, mine);
}

// The L3 figure is a tuning input the machine may get wrong: sizes parse as sysfs writes them, and a
// figure no CPU has (508 MiB for one vCPU, as one VM type reports) is not believed.
TEST(Topology, L3FiguresParseAndImplausibleOnesAreNotBelieved) {
  using braid::topology::parseCacheSize;
  using braid::topology::plausibleL3;
  EXPECT_EQ(parseCacheSize("32768K"), std::size_t{32} << 20);
  EXPECT_EQ(parseCacheSize("8M"), std::size_t{8} << 20);
  EXPECT_EQ(parseCacheSize("1G"), std::size_t{1} << 30);
  EXPECT_EQ(parseCacheSize("512"), 512u);
  for (const char* bad : {"", "K", "32KB", "x32K", "-1K", "32T"}) EXPECT_EQ(parseCacheSize(bad), 0u) << bad;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  EXPECT_FALSE(plausibleL3(0, 8, false));
  EXPECT_TRUE(plausibleL3(32 * MiB, 16, true));   // a Zen CCD, 8 cores x 2 threads
  EXPECT_TRUE(plausibleL3(96 * MiB, 16, true));   // its V-Cache twin
  EXPECT_TRUE(plausibleL3(504 * MiB, 256, false));  // a whole-socket L3 of many cores
  EXPECT_FALSE(plausibleL3(508 * MiB, 1, true));  // what this workplace's VM type reports per vCPU
  EXPECT_FALSE(plausibleL3(508 * MiB, 1, false));
  EXPECT_TRUE(plausibleL3(508 * MiB, 0, false));  // sysconf's machine-wide figure, on bare metal
  EXPECT_FALSE(plausibleL3(508 * MiB, 0, true));  // and under a hypervisor
  // What tuning uses on this host follows from what the host reports.
  const auto& t = braid::topology::summary();
  EXPECT_EQ(t.l3Plausible, plausibleL3(t.l3Bytes, t.l3SharedBy, t.hypervisor));
  EXPECT_EQ(braid::topology::tuningL3Bytes(), t.l3Plausible ? t.l3Bytes : braid::topology::kAssumedL3Bytes);
  EXPECT_FALSE(t.l3Source.empty());
}

// Where cross-memory attach takes over (comm/algorithms/cma.cc): from the L3 tuning uses at 2
// ranks, fixed points with more.
TEST(CrossMemoryAttachRule, SwitchPointsFollowTheCacheAtTwoRanks) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kBroadcast, 2, 32 * MiB), 8 * MiB);
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kBroadcast, 2, 2 * MiB), 1 * MiB);  // never below 1 MiB
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kBroadcast, 3, 508 * MiB), 128u << 10);
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kAllGather, 2, 32 * MiB), SIZE_MAX);
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kAllGather, 4, 32 * MiB), 512u << 10);
  EXPECT_EQ(braid::cmaMinBytes(braid::CollKind::kAllReduce, 4, 32 * MiB), SIZE_MAX);
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

// A rank's PeerInfo as setup publishes it: its host, and the transports of the registry with
// shm usable or not and the identity of the /dev/shm it sees.
PeerInfo infoOf(int rank, const std::string& host, bool shm = true, const std::string& devShm = "22:1") {
  PeerInfo p;
  p.rank = rank;
  p.host = host;
  p.bootId = "boot-" + host;
  p.transports = {{"shm", shm, shm ? devShm : "disabled by BRAID_SHM_DISABLE=1"},
                  {"tcp", true, "10.0.0." + std::to_string(rank + 1) + ":4000"}};
  return p;
}

// The link the tuner gets for these ranks, as a communicator would compute it.
LinkClass linkOf(const Config& c, const std::vector<PeerInfo>& infos) { return slowestLink(makeTransports(c), infos); }

// Selection per pair: the first transport of the registry both ends can use and that reaches,
// the same whichever end asks, with a reason for every transport skipped.
TEST(Registry, SelectionIsSymmetricAndNamesWhyATransportWasSkipped) {
  Config c;
  const TransportList ts = makeTransports(c);
  ASSERT_GE(ts.size(), 2u);
  EXPECT_EQ(ts.front()->name(), "shm");  // the priority order the docs promise
  EXPECT_EQ(ts.back()->name(), "tcp");
  struct Case { PeerInfo a, b; const char* want; const char* why; };
  const Case cases[] = {
      {infoOf(0, "a"), infoOf(1, "a"), "shm", ""},
      {infoOf(0, "a"), infoOf(3, "b"), "tcp", "shm skipped: rank 3 is on host b, rank 0 on a"},
      {infoOf(0, "a"), infoOf(1, "a", false), "tcp", "shm skipped: unusable on rank 1: disabled by BRAID_SHM_DISABLE=1"},
      {infoOf(0, "a"), infoOf(1, "a", true, "23:1"), "tcp", "see different /dev/shm"},
  };
  for (const Case& k : cases) {
    Selection ab = selectTransport(ts, k.a, k.b), ba = selectTransport(ts, k.b, k.a);
    EXPECT_EQ(ab.transport, k.want) << ab.skipped;
    EXPECT_EQ(ba.transport, ab.transport);
    EXPECT_EQ(ba.skipped, ab.skipped);
    EXPECT_NE(ab.skipped.find(k.why), std::string::npos) << ab.skipped;
    if (!*k.why) {
      EXPECT_EQ(ab.skipped, "");
    }
    ASSERT_GE(ab.index, 0);
    EXPECT_EQ(ts[static_cast<std::size_t>(ab.index)]->name(), ab.transport);
  }
  PeerInfo old = infoOf(1, "a");
  old.transports.pop_back();  // a rank that does not offer tcp at all (another build)
  EXPECT_NE(selectTransport(ts, infoOf(0, "b"), old).skipped.find("tcp skipped: rank 1 does not offer it"),
            std::string::npos);
  EXPECT_EQ(selectTransport(ts, infoOf(0, "b"), old).index, -1);
}

// The tuner's link is the slowest pair's: one pair across hosts makes the whole communicator's.
TEST(Registry, SlowestLinkIsTheSlowestPairs) {
  Config c;
  const LinkClass shm = linkOf(c, {infoOf(0, "a"), infoOf(1, "a"), infoOf(2, "a")});
  EXPECT_TRUE(shm.sharedMemory);
  EXPECT_TRUE(shm.sameHost);
  const LinkClass mixed = linkOf(c, {infoOf(0, "a"), infoOf(1, "a"), infoOf(2, "b")});
  EXPECT_FALSE(mixed.sharedMemory);
  EXPECT_FALSE(mixed.sameHost);
  EXPECT_GT(mixed.latencyUs, shm.latencyUs);
  EXPECT_FALSE(mixed.oneStreamBest);
  EXPECT_TRUE(linkOf(c, {infoOf(0, "a")}).sharedMemory);  // one rank: nothing but its own memory
}

// slowestLink weighs one pair of each kind (two reach profiles, one host or two); every pair,
// weighed one by one, must give the same link. Random jobs of 1 to 40 ranks over 1 to 5 hosts, shm
// usable or not, two /dev/shm identities, with BRAID_TCP_CONGESTION=auto and =system (which
// changes tcp's link within a host).
TEST(Registry, SlowestLinkOfOnePairOfEachKindIsThatOfEveryPair) {
  auto everyPair = [](const TransportList& ts, const std::vector<PeerInfo>& infos, bool withinHosts) {
    LinkClass worst;
    bool any = false;
    for (std::size_t i = 0; i < infos.size(); ++i)
      for (std::size_t j = i + 1; j < infos.size(); ++j) {
        if (withinHosts && !infos[i].sameHostAs(infos[j])) continue;
        Selection sel = selectTransport(ts, infos[i], infos[j]);
        if (sel.index < 0) continue;
        LinkClass l = ts[static_cast<std::size_t>(sel.index)]->linkClass(infos[i], infos[j]);
        worst = any ? LinkClass::slower(worst, l) : l;
        any = true;
      }
    return worst;
  };
  auto same = [](const LinkClass& a, const LinkClass& b) {
    return a.latencyUs == b.latencyUs && a.bytesPerUs == b.bytesPerUs && a.minPiece == b.minPiece &&
           a.sameHost == b.sameHost && a.sharedMemory == b.sharedMemory && a.oneStreamBest == b.oneStreamBest &&
           a.maxPiece == b.maxPiece;
  };
  std::uint64_t seed = 12345;
  auto next = [&](int m) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((seed >> 33) % static_cast<std::uint64_t>(m));
  };
  int differing = 0;
  for (const char* congestion : {"auto", "system"}) {
    Config c;
    c.tcpCongestion = congestion;
    const TransportList ts = makeTransports(c);
    for (int trial = 0; trial < 300; ++trial) {
      const int n = 1 + next(40), hosts = 1 + next(5);
      std::vector<PeerInfo> infos;
      for (int r = 0; r < n; ++r) {
        std::string host(1, 'h');
        host += std::to_string(next(hosts));
        infos.push_back(infoOf(r, host, next(4) != 0, next(6) ? "22:1" : "23:1"));
      }
      for (bool within : {false, true}) {
        const LinkClass got = slowestLink(ts, infos, within), want = everyPair(ts, infos, within);
        EXPECT_TRUE(same(got, want)) << "trial " << trial << " (" << n << " ranks on " << hosts << " hosts, within "
                                     << within << "): latency " << got.latencyUs << " vs " << want.latencyUs;
      }
      differing += !same(everyPair(ts, infos, false), everyPair(ts, infos, true));
    }
  }
  EXPECT_GT(differing, 100);  // the cases tell the two questions apart
}

TEST(Registry, PeerInfoRoundTripsAnyAddressBytes) {
  PeerInfo p = infoOf(5, "host-x");
  p.pid = 1234;
  p.settings = "BRAID_NSOCKS=2 BRAID_ALGO=auto";
  p.cmaProbe = 0x7fff12345678ull;
  p.cpus = "0-3,8";
  p.tuningL3 = 32u << 20;
  p.transports.push_back({"blob", true, std::string("a\nb c\0\xff", 7)});
  auto q = PeerInfo::parse(p.serialize());
  ASSERT_TRUE(q.ok()) << q.status().toString();
  EXPECT_EQ(q->rank, 5);
  EXPECT_EQ(q->host, "host-x");
  EXPECT_EQ(q->pid, 1234);
  EXPECT_EQ(q->settings, p.settings);
  EXPECT_EQ(q->cmaProbe, p.cmaProbe);
  EXPECT_EQ(q->cpus, "0-3,8");
  EXPECT_EQ(q->tuningL3, p.tuningL3);
  ASSERT_EQ(q->transports.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q->transports[i].name, p.transports[i].name);
    EXPECT_EQ(q->transports[i].usable, p.transports[i].usable);
    EXPECT_EQ(q->transports[i].address, p.transports[i].address);
  }
  ASSERT_NE(q->transport("shm"), nullptr);
  EXPECT_EQ(q->transport("ib"), nullptr);
  EXPECT_FALSE(PeerInfo::parse("1\nh\n").ok());
  std::string bad = p.serialize();
  bad.replace(bad.find(" 1 "), 3, " 7 ");
  EXPECT_FALSE(PeerInfo::parse(bad).ok());
}

TEST(Tuner, OneShotForTinyTreeForSmallRingForLarge) {
  Config c;
  const LinkClass shm = linkOf(c, {infoOf(0, "a"), infoOf(1, "a")});
  auto tiny = tune({CollKind::kAllReduce, 8, 8, 2, shm}, c);
  auto small = tune({CollKind::kAllReduce, 64u << 10, 8, 2, shm}, c);
  auto large = tune({CollKind::kAllReduce, 256u << 20, 8, 2, shm}, c);
  EXPECT_EQ(tiny.algo, Algo::kOneShot);
  EXPECT_EQ(tiny.channels, 1);
  EXPECT_EQ(tune({CollKind::kBarrier, 0, 8, 2, shm}, c).algo, Algo::kOneShot);
  EXPECT_EQ(small.algo, Algo::kTree);
  EXPECT_EQ(large.algo, Algo::kRing);
  EXPECT_EQ(large.channels, 2);
  // No tree all-gather: the log-step one where every pair is connected at creation, else the ring.
  EXPECT_EQ(tune({CollKind::kAllGather, 8, 8, 2, shm}, c).algo, Algo::kBruck);
  EXPECT_EQ(tune({CollKind::kAllGather, 8, 8, 2, shm, {}, false}, c).algo, Algo::kRing);
  EXPECT_EQ(tune({CollKind::kAllGather, 256u << 20, 8, 2, shm}, c).algo, Algo::kRing);
  c.algo = "ring";
  EXPECT_EQ(tune({CollKind::kAllReduce, 8, 8, 2, shm}, c).algo, Algo::kRing);
  c.algo = "oneshot";
  EXPECT_EQ(tune({CollKind::kAllReduce, 256u << 20, 8, 2, shm}, c).algo, Algo::kOneShot);
  EXPECT_EQ(tune({CollKind::kAllGather, 8, 8, 2, shm}, c).algo, Algo::kRing);  // all-reduce only; no other forced one
  Tuner memo(c, 8, 2, shm);
  EXPECT_EQ(memo.choose(CollKind::kAllReduce, 8).algo, Algo::kOneShot);
  EXPECT_EQ(memo.choose(CollKind::kAllGather, 8).algo, Algo::kRing);  // a new key is not the old answer
  c.algo = "ring";
  c.chunkSize = 12345;
  EXPECT_EQ(tune({CollKind::kAllReduce, 8, 8, 2, shm}, c).chunk, 12288u);  // whole 64-byte units
}

// tcp between ranks of one host under reno: one socket and pieces the size of the staging ring
// for the ring; the double tree keeps its two channels; anywhere else tcp keeps both sockets.
TEST(Tuner, TcpOnLoopbackUsesOneSocketAndRingSizedPieces) {
  Config c;
  const LinkClass shm = linkOf(c, {infoOf(0, "a"), infoOf(1, "a")});
  const LinkClass tcpAcross = linkOf(c, {infoOf(0, "a"), infoOf(1, "b")});
  const LinkClass tcpLoop = linkOf(c, {infoOf(0, "a", false), infoOf(1, "a", false)});
  EXPECT_FALSE(tcpAcross.oneStreamBest);
  EXPECT_TRUE(tcpLoop.oneStreamBest);
  c.tcpCongestion = "system";  // the system's congestion control on loopback: the rule does not apply
  EXPECT_FALSE(linkOf(c, {infoOf(0, "a", false), infoOf(1, "a", false)}).oneStreamBest);
  c.tcpCongestion = "auto";
  auto across = tune({CollKind::kAllReduce, 128u << 20, 2, 2, tcpAcross}, c);
  auto loop = tune({CollKind::kAllReduce, 128u << 20, 2, 2, tcpLoop}, c);
  EXPECT_EQ(across.channels, 2);
  EXPECT_EQ(across.chunk, 512u << 10);
  EXPECT_EQ(loop.algo, Algo::kRing);
  EXPECT_EQ(loop.channels, 1);
  EXPECT_EQ(loop.chunk, c.buffSize);
  EXPECT_EQ(tune({CollKind::kAllGather, 2u << 20, 2, 2, tcpLoop}, c).channels, 1);
  auto tree = tune({CollKind::kAllReduce, 96u << 10, 4, 2, tcpLoop}, c);
  ASSERT_EQ(tree.algo, Algo::kTree);
  EXPECT_EQ(tree.channels, 2);
  c.chunkSize = 64u << 10;  // BRAID_CHUNKSIZE still wins
  EXPECT_EQ(tune({CollKind::kAllReduce, 128u << 20, 2, 2, tcpLoop}, c).chunk, 64u << 10);
  Tuner memo(c, 2, 2, tcpLoop);
  EXPECT_EQ(memo.choose(CollKind::kAllReduce, 128u << 20).channels, 1);
  Tuner shmOnly(c, 2, 2, shm);  // no tcp anywhere: the rule does not apply
  EXPECT_EQ(shmOnly.choose(CollKind::kAllReduce, 128u << 20).channels, 2);
}

// A send/recv over ib with zero copy hands the channel pieces of the link's maxPiece (one RDMA
// write each into the receiver's buffer); without zero copy, and over tcp, the ring's half.
TEST(Tuner, SendRecvOverIbWithZeroCopyTakesTheLinksLargestPiece) {
  Config c;
  c.ibZcopyBytes = 256u << 10;
  const auto linkOfIb = [](const Config& conf) {
    for (const auto& t : makeTransports(conf))
      if (t->name() == "ib") return t->linkClass(infoOf(0, "a"), infoOf(1, "b"));
    ADD_FAILURE() << "no ib transport in the registry";
    return LinkClass{};
  };
  const LinkClass zc = linkOfIb(c);
  ASSERT_GT(zc.maxPiece, c.buffSize / 2);
  EXPECT_EQ(tune({CollKind::kSendRecv, 64u << 20, 2, 1, zc}, c).chunk, zc.maxPiece);
  EXPECT_EQ(tune({CollKind::kAllReduce, 64u << 20, 2, 1, zc}, c).chunk, c.buffSize / 2);  // a ring forwards its pieces
  c.ibZcopyBytes = 0;
  const LinkClass eager = linkOfIb(c);
  EXPECT_EQ(eager.maxPiece, 0u);
  EXPECT_EQ(tune({CollKind::kSendRecv, 64u << 20, 2, 1, eager}, c).chunk, c.buffSize / 2);
  EXPECT_EQ(LinkClass::slower(zc, eager).maxPiece, 0u);
  // By default (auto) only send/recv's pieces reach the channel's zero-copy size: collectives'
  // stay at most half the inbox, and go through the rings.
  c.ibZcopyBytes = Config::kZcopyAuto;
  const LinkClass def = linkOfIb(c);
  const std::size_t from = IbChannel::zeroCopyFrom(c, c.buffSize);
  EXPECT_GE(tune({CollKind::kSendRecv, 64u << 20, 2, 1, def}, c).chunk, from);
  for (CollKind k : {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter, CollKind::kBroadcast,
                     CollKind::kReduce})
    for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{64} << 20, std::size_t{1} << 30})
      for (int n : {2, 4, 8}) EXPECT_LT(tune({k, bytes, n, 1, def}, c).chunk, from) << int(k) << " " << bytes << " " << n;
}

// A waiter with sockets raises the transports' before-sleep flags (ib arms its CQs on them) one
// pass before it sleeps, not while it spins and yields, and lowers them once something moved.
TEST(Waiter, RaisesSleepFlagsOnlyBeforeItSleepsOnSockets) {
  Waiter w(0, false);
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  w.addSocket(fd);
  std::atomic<bool> flag{false};
  w.addSleepFlag(&flag);
  w.idle();  // the first idle pass yields: far from a sleep
  EXPECT_FALSE(flag.load());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!flag.load() && std::chrono::steady_clock::now() < until) w.idle();
  EXPECT_TRUE(flag.load());
  w.idle();  // the sleep itself (one short slice): the flag stays up while asleep
  EXPECT_TRUE(flag.load());
  w.progressed();
  EXPECT_FALSE(flag.load());
  ::close(fd);
}

// A Workspace with only a layout: ranks on hosts (rank order within each), for plan shapes.
class LayoutOnly : public Workspace {
 public:
  LayoutOnly(int rank, std::vector<std::vector<int>> hosts) : rank_(rank), hosts_(std::move(hosts)) {
    for (const auto& h : hosts_) order_.insert(order_.end(), h.begin(), h.end());
    pos_.resize(order_.size());
    for (std::size_t p = 0; p < order_.size(); ++p) pos_[static_cast<std::size_t>(order_[p])] = static_cast<int>(p);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return static_cast<int>(order_.size()); }
  std::byte* scratch(std::size_t) override { return nullptr; }
  const std::vector<int>& ringOrder() const override { return order_; }
  int ringPosition(int r) const override { return pos_[static_cast<std::size_t>(r)]; }
  const std::vector<std::vector<int>>& hosts() const override { return hosts_; }
  int hostIndex(int r) const override {
    for (std::size_t h = 0; h < hosts_.size(); ++h)
      if (std::count(hosts_[h].begin(), hosts_[h].end(), r)) return static_cast<int>(h);
    return -1;
  }

 private:
  int rank_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> order_, pos_;
};

// The tree of a broadcast or reduce spans every rank (each but the root has one parent, which lists
// it as a child) and enters each other host once, whatever the root, the shape and the ranks'
// numbering: hosts dealt round robin (the rank-order tree crossed hosts at nearly every edge), of
// unequal size, and one host.
TEST(Rooted, TreeEntersEachHostOnceFromEveryRoot) {
  const std::vector<std::vector<std::vector<int>>> layouts = {
      {{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 11}}, {{0, 1, 2}, {3, 4, 5, 6}, {7, 8, 9, 10, 11}, {12, 13, 14, 15}},
      {{0, 1, 2, 3, 4}}, {{0}, {1}, {2}, {3}, {4}}};
  for (const auto& hosts : layouts) {
    int n = 0;
    std::vector<int> hostOf(64, -1);
    for (std::size_t h = 0; h < hosts.size(); ++h)
      for (int r : hosts[h]) hostOf[static_cast<std::size_t>(r)] = static_cast<int>(h), ++n;
    for (Algo shape : {Algo::kTree, Algo::kRing})
      for (int root = 0; root < n; ++root) {
        std::vector<int> parent(static_cast<std::size_t>(n), -2);
        std::vector<std::vector<int>> children(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
          const RootedLinks l = rootedLinks(LayoutOnly(r, hosts), root, shape);
          parent[static_cast<std::size_t>(r)] = l.parent;
          children[static_cast<std::size_t>(r)] = l.children;
        }
        int crossings = 0;
        for (int r = 0; r < n; ++r) {
          const int p = parent[static_cast<std::size_t>(r)];
          const std::string at = "root " + std::to_string(root) + ", rank " + std::to_string(r);
          if (r == root) { EXPECT_EQ(p, -1) << at; continue; }
          ASSERT_GE(p, 0) << at;
          const auto& pc = children[static_cast<std::size_t>(p)];
          EXPECT_EQ(std::count(pc.begin(), pc.end(), r), 1) << at << ": its parent " << p << " does not list it";
          crossings += hostOf[static_cast<std::size_t>(p)] != hostOf[static_cast<std::size_t>(r)];
        }
        EXPECT_EQ(crossings, static_cast<int>(hosts.size()) - 1) << "root " << root << ", " << hosts.size() << " hosts";
        for (int r = 0, seen; r < n; ++r) {  // every rank reaches the root: no cycle
          int at = r;
          for (seen = 0; at != root && at >= 0 && seen <= n; ++seen) at = parent[static_cast<std::size_t>(at)];
          EXPECT_EQ(at, root) << "rank " << r << " does not reach root " << root;
        }
      }
  }
}

// Across hosts the tuner takes the hierarchical all-reduce, all-gather and reduce-scatter for large
// calls (fewer bytes over the links between hosts), never on one host. Hosts of unequal size (3 and
// 2 ranks) keep them, with the extra rank's fold priced in.
TEST(Tuner, HierarchicalAcrossHosts) {
  Config c;
  const std::vector<PeerInfo> twoByTwo = {infoOf(0, "a"), infoOf(1, "a"), infoOf(2, "b"), infoOf(3, "b")};
  const LinkClass across = linkOf(c, twoByTwo);
  HostShape shape = hostShape({{0, 1}, {2, 3}});
  EXPECT_EQ(shape.hosts, 2);
  EXPECT_EQ(shape.perHost, 2);
  EXPECT_EQ(shape.maxPerHost, 2);
  shape.local = slowestLink(makeTransports(c), twoByTwo, true);
  EXPECT_TRUE(shape.local.sharedMemory);
  auto big = tune({CollKind::kAllReduce, 64u << 20, 4, 2, across, shape}, c);
  EXPECT_EQ(big.algo, Algo::kHier);
  EXPECT_LT(big.hierUs, big.ringUs);
  EXPECT_NE(tune({CollKind::kAllReduce, 8, 4, 2, across, shape}, c).algo, Algo::kHier);  // latency decides
  auto gather = tune({CollKind::kAllGather, 64u << 20, 4, 2, across, shape}, c);
  EXPECT_EQ(gather.algo, Algo::kHier);
  EXPECT_GT(gather.hierUs, 0);
  EXPECT_EQ(tune({CollKind::kReduceScatter, 64u << 20, 4, 2, across, shape}, c).algo, Algo::kHier);
  HostShape uneven = hostShape({{0, 1, 4}, {2, 3}});
  EXPECT_EQ(uneven.perHost, 2);
  EXPECT_EQ(uneven.maxPerHost, 3);
  uneven.local = shape.local;
  EXPECT_GT(tune({CollKind::kAllGather, 64u << 20, 5, 2, across, uneven}, c).hierUs,
            tune({CollKind::kAllGather, 64u << 20, 5, 2, across, shape}, c).hierUs);  // the extra's copy of the result
  EXPECT_GT(tune({CollKind::kReduceScatter, 64u << 20, 5, 2, across, uneven}, c).hierUs,
            tune({CollKind::kReduceScatter, 64u << 20, 5, 2, across, shape}, c).hierUs);
  const auto unevenBig = tune({CollKind::kAllReduce, 64u << 20, 5, 2, across, uneven}, c);
  EXPECT_GT(unevenBig.hierUs, tune({CollKind::kAllReduce, 64u << 20, 5, 2, across, shape}, c).hierUs);  // the fold
  HostShape oneHost = hostShape({{0, 1, 2, 3}});
  oneHost.local = shape.local;
  EXPECT_EQ(tune({CollKind::kAllReduce, 64u << 20, 4, 2, shape.local, oneHost}, c).hierUs, 0);
  c.algo = "hier";
  EXPECT_EQ(tune({CollKind::kAllReduce, 8, 4, 2, across, shape}, c).algo, Algo::kHier);
  EXPECT_EQ(tune({CollKind::kAllReduce, 64u << 20, 5, 2, across, uneven}, c).algo, Algo::kHier);
  EXPECT_EQ(tune({CollKind::kAllGather, 64u << 20, 5, 2, across, uneven}, c).algo, Algo::kHier);
  EXPECT_EQ(tune({CollKind::kAllGather, 8, 4, 2, across, shape}, c).algo, Algo::kHier);
  EXPECT_EQ(tune({CollKind::kReduceScatter, 8, 4, 2, across, shape}, c).algo, Algo::kHier);
  EXPECT_EQ(tune({CollKind::kReduceScatter, 64u << 20, 5, 2, across, uneven}, c).algo, Algo::kHier);
}

}  // namespace
}  // namespace braid
