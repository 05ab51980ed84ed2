// braid doctor's findings from made-up data: each rule names the guilty link, host, rank or setting
// and nothing else; healthy data gives none. (The runs across test hosts are in tests/hosts/.)
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "tools/doctor.h"

namespace braid::tools::doctor {
namespace {

// n ranks, `perHost` to a host named braid-h1, braid-h2, ...; every check healthy; every pair
// measured at `gbps` over shm within a host and tcp across.
Data healthy(int n, int perHost, double gbps = 1.0) {
  Data d;
  d.slowRatio = 0.5;
  for (int r = 0; r < n; ++r) {
    RankFacts f;
    f.rank = r;
    f.host = "braid-h" + std::to_string(r / perHost + 1);
    f.bootId = f.host;
    f.cpus = std::to_string(r % perHost);
    f.numa = "0";
    f.shmSize = f.shmFree = 1u << 30;
    f.shmNeed = 8u << 20;
    f.localRanks = perHost;
    f.memlock = kUnlimited;
    f.nofile = 1u << 20;
    f.nofileNeed = 100;
    f.tcpIface = "eth0";
    f.tcpAddr = "10.213.0." + std::to_string(r / perHost + 1);
    f.tcpMtu = 1500;
    f.ifaces = {{"lo", "127.0.0.1", 8, 65536, true, ""}, {"eth0", f.tcpAddr, 24, 1500, true, ""}};
    f.ibProbe = "no InfiniBand device found";
    f.settings = {{"BRAID_SECRET", "(digest 1)"}};
    for (int p = 0; p < n; ++p) {
      f.transportTo.push_back(p == r ? "self" : (p / perHost == r / perHost ? "shm" : "tcp"));
      f.skippedTo.push_back("");
    }
    d.ranks.push_back(f);
  }
  d.pairs = PairTable(n);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) d.pairs[a][b] = {true, 10.0, gbps, 1, 0.0};
  return d;
}

void setPair(Data& d, int a, int b, double gbps) { d.pairs[a][b].gbps = d.pairs[b][a].gbps = gbps; }

std::string subjects(const std::vector<Finding>& f) {
  std::string s;
  for (const Finding& x : f) s += "[" + x.subject + "]";
  return s;
}

// Exactly one finding, about `subject`, whose text says `inText`.
void expectOneFinding(const Data& d, const std::string& subject, const std::string& inText) {
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, subject);
  EXPECT_NE((f[0].text + " fix: " + f[0].fix).find(inText), std::string::npos) << f[0].text << " fix: " << f[0].fix;
}

// Rounds of disjoint pairs: every pair once on one host or one rank a host; one pair of first ranks
// per two hosts, then each host's first two ranks, where hosts hold several ranks.
TEST(Doctor, MeasurementRoundsMeetEveryHostPairOnce) {
  struct Shape { std::vector<int> sizes; };
  for (const Shape& shape : {Shape{{8}}, Shape{{1, 1, 1, 1, 1, 1, 1}}, Shape{{4, 4}}, Shape{{3, 1, 2, 4, 2}},
                             Shape{std::vector<int>(32, 4)}, Shape{std::vector<int>(33, 8)}}) {
    HostLayout h;
    int n = 0;
    for (std::size_t k = 0; k < shape.sizes.size(); ++k) {
      std::string name(1, 'h');
      name += std::to_string(k);
      h.names.push_back(name);
      h.ranks.emplace_back();
      for (int i = 0; i < shape.sizes[k]; ++i) h.ranks.back().push_back(n), h.hostOf.push_back(static_cast<int>(k)), ++n;
    }
    const int hosts = static_cast<int>(h.names.size());
    const auto rounds = measurementRounds(h, n);
    std::map<std::pair<int, int>, int> met;
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (auto [a, b] : round) {
        EXPECT_LT(a, b);
        EXPECT_TRUE(busy.insert(a).second && busy.insert(b).second) << "a rank twice in one round";
        ++met[{a, b}];
      }
    }
    const std::string what = std::to_string(n) + " ranks on " + std::to_string(hosts) + " hosts";
    if (!measuresByHost(h, n)) {
      EXPECT_EQ(static_cast<int>(rounds.size()), roundsFor(n)) << what;
      EXPECT_EQ(static_cast<int>(met.size()), n * (n - 1) / 2) << what;
      continue;
    }
    EXPECT_EQ(static_cast<int>(rounds.size()), roundsFor(hosts) + 1) << what;
    std::map<std::pair<int, int>, int> hostPairs;
    int within = 0;
    for (auto& [pair, times] : met) {
      EXPECT_EQ(times, 1) << what;
      const int ha = h.hostOf[pair.first], hb = h.hostOf[pair.second];
      if (ha == hb) {
        ++within;
        continue;
      }
      EXPECT_EQ(pair.first, h.ranks[ha][0]);
      EXPECT_EQ(pair.second, h.ranks[hb][0]);
      ++hostPairs[{std::min(ha, hb), std::max(ha, hb)}];
    }
    EXPECT_EQ(static_cast<int>(hostPairs.size()), hosts * (hosts - 1) / 2) << what;
    int several = 0;
    for (int size : shape.sizes) several += size > 1;
    EXPECT_EQ(within, several) << what;
  }
}

// 128 ranks on 32 hosts x 4, measured one rank pair per two hosts (the pairs never measured
// cleared), every link of braid-h17 (its first rank: 64) at a fifth of the others.
Data atScaleWithHost17Slow() {
  Data d = healthy(128, 4);
  const HostLayout h = layOut(d.ranks);
  std::set<std::pair<int, int>> measured;
  for (const auto& round : measurementRounds(h, 128))
    for (auto p : round) measured.insert(p);
  for (int a = 0; a < 128; ++a)
    for (int b = 0; b < 128; ++b)
      if (a != b && !measured.count({std::min(a, b), std::max(a, b)})) d.pairs[a][b] = {};
  d.rounds = static_cast<int>(measurementRounds(h, 128).size());
  d.byHost = true;
  for (int b = 0; b < 128; b += 4)
    if (b != 64) setPair(d, 64, b, 0.2);
  return d;
}

// At scale, the host whose links are slow is named, and the report shows the hosts' matrix, not
// the ranks'.
TEST(Doctor, AtScaleOneHostsLinksSlowAreNamedFromHostPairs) {
  const Data d = atScaleWithHost17Slow();
  expectOneFinding(d, "host braid-h17", "every link of braid-h17 is slow");
  const std::string report = textReport(d, analyse(d));
  EXPECT_NE(report.find("bandwidth per direction between hosts"), std::string::npos);
  EXPECT_NE(report.find("one rank pair per two hosts"), std::string::npos);
  EXPECT_NE(report.find("the 32 slowest of 496"), std::string::npos) << report.substr(0, 2000);
  EXPECT_LT(std::count(report.begin(), report.end(), '\n'), 200) << "the report is " << report.size() << " bytes";
}

// At scale, the first pass's noise (healthy links measured slow on shared cores) is measured again
// link by link, not only the first few suspects: 12 noisy links off the slow host among 496 are all
// confirmed (each healthy when alone), and the verdict names the host alone. (A cap of 6 left 6 of
// them judged on their first figures.)
TEST(Doctor, AtScaleEveryNoisySuspectIsMeasuredAgain) {
  Data d = atScaleWithHost17Slow();
  const HostLayout h = layOut(d.ranks);
  std::vector<std::pair<int, int>> noisy;   // host pairs (a < b) off braid-h17 (host 16)
  for (int k = 0; k < 12; ++k) {
    const int a = k, b = 20 + k;
    setPair(d, 4 * a, 4 * b, 0.1);
    noisy.emplace_back(a, b);
  }
  EXPECT_GE(confirmAtMost(496), 12u);
  const auto which = linksToConfirm(hostLinks(d, h), d.slowRatio);
  for (auto p : noisy) EXPECT_NE(std::find(which.begin(), which.end(), p), which.end()) << p.first << "-" << p.second;
  for (auto p : which) d.confirmed[p] = {p.first == 16 || p.second == 16 ? 0.2 : 1.0, 1.0};
  expectOneFinding(d, "host braid-h17", "of braid-h17 are slow");
}

// At scale, a link measured again while the whole machine ran slower (the fastest link, measured
// alternately with it, as slow too) is held to what the fastest managed then, not to the first
// pass's median: only the slow host is named. (Held to the median, the link at 18% was named too.)
TEST(Doctor, AtScaleALinkSlowOnlyWhileEverythingWasIsNotNamed) {
  Data d = atScaleWithHost17Slow();
  const HostLayout h = layOut(d.ranks);
  setPair(d, 4 * 3, 4 * 4, 0.1);  // braid-h4–braid-h5 in the first pass
  const auto which = linksToConfirm(hostLinks(d, h), d.slowRatio);
  ASSERT_NE(std::find(which.begin(), which.end(), std::make_pair(3, 4)), which.end());
  for (auto p : which) {
    const double again = p.first == 16 || p.second == 16 ? 0.02 : p == std::make_pair(3, 4) ? 0.18 : 0.2;
    d.confirmed[p] = {again, again};
  }
  expectOneFinding(d, "host braid-h17", "0.20 GB/s (20%)");
}

TEST(Doctor, HealthyDataHasNoFinding) {
  for (auto [n, per] : {std::pair{1, 1}, {8, 8}, {3, 1}, {6, 2}, {4, 2}}) {
    const auto f = analyse(healthy(n, per));
    EXPECT_TRUE(f.empty()) << n << " ranks, " << per << " per host: " << subjects(f);
  }
}

TEST(Doctor, OneSlowLinkIsNamed) {
  Data d = healthy(3, 1);
  setPair(d, 0, 1, 0.02);
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "link braid-h1–braid-h2");
  EXPECT_NE(f[0].text.find("0.0200 GB/s"), std::string::npos) << f[0].text;
}

TEST(Doctor, EveryLinkOfOneHostSlowNamesTheHost) {
  Data d = healthy(6, 2);  // 3 hosts x 2 ranks: host 3 holds ranks 4 and 5
  for (int a = 0; a < 4; ++a)
    for (int b = 4; b < 6; ++b) setPair(d, a, b, 0.02);
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "host braid-h3");
}

TEST(Doctor, SharedLinksAreNotSlow) {
  // Two pairs crossed between the same hosts in one round and got half each: not slow.
  Data d = healthy(6, 2);
  d.pairs[0][2].gbps = d.pairs[2][0].gbps = 0.5;
  d.pairs[0][2].share = d.pairs[2][0].share = 2;
  d.pairs[1][3].gbps = d.pairs[3][1].gbps = 0.5;
  d.pairs[1][3].share = d.pairs[3][1].share = 2;
  EXPECT_TRUE(analyse(d).empty()) << subjects(analyse(d));
}

TEST(Doctor, MeasuredAgainDecides) {
  Data d = healthy(3, 1);
  setPair(d, 0, 1, 0.3);  // the first pass: below half of the others
  const HostLayout h = layOut(d.ranks);
  const auto which = linksToConfirm(hostLinks(d, h), d.slowRatio);
  ASSERT_EQ(which.size(), 2u);  // the suspect and the fastest
  EXPECT_EQ(which[0], std::make_pair(0, 1));
  d.confirmed = {{which[0], {0.8, 0.9}}, {which[1], {1.0, 1.1}}};  // alone, they are alike: noise
  EXPECT_TRUE(analyse(d).empty()) << subjects(analyse(d));
  d.confirmed = {{which[0], {0.3, 0.9}}, {which[1], {1.0, 1.1}}};  // a slow median, a healthy best: noise
  EXPECT_TRUE(analyse(d).empty()) << subjects(analyse(d));
  d.confirmed = {{which[0], {0.1, 0.1}}, {which[1], {1.0, 1.1}}};  // confirmed
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "link braid-h1–braid-h2");
  EXPECT_NE(f[0].text.find("runs at 0.10 GB/s (10%)"), std::string::npos) << f[0].text;
}

TEST(Doctor, HostsOnOneKernelAreHeldToHalfTheRatio) {
  // One host's links at 47% of the third: a finding between machines, the scatter of the shared
  // CPUs between namespaces of one machine (the same boot id), where 20% is still one.
  for (const bool oneKernel : {false, true}) {
    Data d = healthy(3, 1);
    if (oneKernel)
      for (RankFacts& f : d.ranks) f.bootId = "one-boot-id";
    setPair(d, 0, 1, 0.47);
    setPair(d, 0, 2, 0.47);
    const HostLayout h = layOut(d.ranks);
    for (const HostLink& l : hostLinks(d, h)) {
      EXPECT_EQ(l.oneKernel, oneKernel);
      EXPECT_EQ(slowRatioOf(l, d.slowRatio), oneKernel ? 0.25 : 0.5);
    }
    EXPECT_EQ(subjects(analyse(d)), oneKernel ? "" : "[host braid-h1]");
    EXPECT_EQ(linksToConfirm(hostLinks(d, h), d.slowRatio).size(), oneKernel ? 0u : 3u);
    setPair(d, 0, 1, 0.2);
    setPair(d, 0, 2, 0.2);
    EXPECT_EQ(subjects(analyse(d)), "[host braid-h1]") << (oneKernel ? "one kernel" : "three");
  }
}

TEST(Doctor, OneKernelFullHoldsSuchHostsToTheWholeRatio) {
  Data d = healthy(3, 1);
  for (auto& r : d.ranks) r.bootId = "one-kernel";
  setPair(d, 0, 1, 0.40);  // 40%: below 0.5, above its half
  EXPECT_TRUE(analyse(d).empty()) << subjects(analyse(d));
  d.halveOnOneKernel = false;  // --one-kernel full
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "link braid-h1–braid-h2");
}

TEST(Doctor, UnreachablePeerIsNamed) {
  Data d = healthy(2, 1);
  d.ranks[1].unreachable = "rank 0 (braid-h1) at 10.213.0.1: no route to 10.213.0.1: Network is unreachable";
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "routes from rank 1 on braid-h2");
}

TEST(Doctor, TwoHostsHaveNothingToCompare) {
  Data d = healthy(2, 1, 0.001);
  EXPECT_TRUE(judgeLinks({"a", "b"}, hostLinks(d, layOut(d.ranks)), 0.5).empty());
}

TEST(Doctor, SlowEverywhereIsSystemWide) {
  std::vector<HostLink> links;
  const double figures[] = {2.0, 0.1, 0.1, 0.1, 0.1, 0.1};  // 4 hosts: one fast link, five slow
  int i = 0;
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) links.push_back({a, b, figures[i], figures[i], 0, 0, 10, 1, "tcp"}), ++i;
  const auto f = judgeLinks({"h1", "h2", "h3", "h4"}, links, 0.5);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "system-wide");
}

TEST(Doctor, BaselineFindsWhatNoComparisonInOneRunCan) {
  const char* earlier = R"({"tool": "braid doctor", "started_at": "2026-12-01T00:00:00Z", "host_links": [
      {"a": "braid-h1", "b": "braid-h2", "transport": "tcp", "gbps": 1.5, "confirmed_gbps": 0},
      {"a": "braid-h1", "b": "braid-h3", "transport": "tcp", "gbps": 3, "confirmed_gbps": 2}]})";
  auto b = readBaseline(earlier, "healthy.json");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->best.at("tcp"), 2.0);  // a link measured again counts at that figure
  EXPECT_FALSE(readBaseline("{\"tool\": \"braid perf\"}", "x.json").ok());
  EXPECT_FALSE(readBaseline("{", "x.json").ok());
  // Every link equally slow: nothing in the run stands out; against the baseline, system-wide.
  Data d = healthy(3, 1, 0.1);
  EXPECT_TRUE(analyse(d).empty());
  d.baseline = b->best;
  d.baselineFrom = b->from;
  auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "system-wide");
  EXPECT_NE(f[0].text.find("in the baseline, healthy.json of 2026-12-01T00:00:00Z, ran at 2.00 GB/s"), std::string::npos)
      << f[0].text;
  // Two hosts: their one link, held to the baseline.
  Data two = healthy(2, 1, 0.1);
  two.baseline = b->best;
  f = analyse(two);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "link braid-h1–braid-h2");
  two = healthy(2, 1, 1.5);  // as fast as the baseline: nothing
  two.baseline = b->best;
  EXPECT_TRUE(analyse(two).empty());
}

TEST(Doctor, MtuMismatchNamesTheOddHost) {
  Data d = healthy(3, 1);
  d.ranks[2].tcpMtu = 1400;
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "MTU on host braid-h3");
  EXPECT_NE(f[0].fix.find("mtu 1500"), std::string::npos) << f[0].fix;
}

TEST(Doctor, SettingThatDiffersNamesTheRank) {
  Data d = healthy(4, 4);
  d.ranks[3].settings.emplace_back("BRAID_BUFFSIZE", "1048576");
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "BRAID_BUFFSIZE on rank 3 on braid-h1");
}

TEST(Doctor, IbUnusableOnOneHostIsNamedWithTheFix) {
  Data d = healthy(4, 2);
  for (auto& r : d.ranks) r.ibProbe = "";
  for (int r = 2; r < 4; ++r) {
    d.ranks[r].ibProbe = "no ACTIVE port to use: fib0:1 (DOWN)";
    d.ranks[r].ibPorts = {{"fib0:1", "DOWN", "ib", 4096, -1, -1}};
  }
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);  // and not also "transports between hosts"
  EXPECT_EQ(f[0].subject, "ib on host braid-h2");
  EXPECT_NE(f[0].fix.find("subnet manager"), std::string::npos);
}

TEST(Doctor, NoIbAnywhereIsNoFinding) {
  Data d = healthy(4, 2);
  EXPECT_TRUE(analyse(d).empty());
}

TEST(Doctor, SmallShmAndBlackholeAndIfname) {
  Data d = healthy(4, 2);
  d.ranks[2].shmOffByDoctor = d.ranks[3].shmOffByDoctor = true;
  d.ranks[2].shmFree = d.ranks[3].shmFree = 1u << 20;
  for (auto& r : d.ranks) {
    r.ifaces.push_back({"bh0", "10.214.0.1", 24, 1500, true, "blackhole"});
    r.ifSpec = "nosuch0";
    r.ifSpecProblem = "BRAID_SOCKET_IFNAME='nosuch0' matches no interface";
  }
  for (int a : {2, 3})
    for (int p = 0; p < 4; ++p)
      if (p != a) d.ranks[a].transportTo[p] = d.ranks[p].transportTo[a] = "tcp";
  const auto f = analyse(d);
  EXPECT_EQ(subjects(f), "[BRAID_SOCKET_IFNAME on hosts braid-h1, braid-h2][interface bh0 on hosts braid-h1, braid-h2]"
                         "[/dev/shm on host braid-h2]");
}

TEST(Doctor, ShmLeftoversOfDeadProcessesAreNamedByHostWithThePids) {
  Data d = healthy(4, 2);
  d.ranks[2].shmLeftovers = 3;
  d.ranks[2].shmLeftoverBytes = 12u << 20;
  d.ranks[2].shmLeftoverPids = "4242";
  d.ranks[3].shmLeftovers = 1;
  d.ranks[3].shmLeftoverBytes = 4u << 20;
  d.ranks[3].shmLeftoverPids = "4243";
  expectOneFinding(d, "/dev/shm on host braid-h2", "4 shared-memory segments (16.0 MiB) that processes 4242, 4243 left");
  RankFacts g = RankFacts::parse(d.ranks[2].serialize());
  EXPECT_EQ(g.shmLeftovers, 3);
  EXPECT_EQ(g.shmLeftoverBytes, 12u << 20);
  EXPECT_EQ(g.shmLeftoverPids, "4242");
}

// Each rule below, its fault injected into otherwise healthy data: exactly that finding.
TEST(Doctor, ShmUnusableOnOneHostIsNamed) {
  Data d = healthy(4, 2);
  d.ranks[2].shmProbe = d.ranks[3].shmProbe = "/dev/shm is not writable";
  for (int a : {2, 3})
    for (int p = 0; p < 4; ++p)
      if (p != a) d.ranks[a].transportTo[p] = d.ranks[p].transportTo[a] = "tcp";
  expectOneFinding(d, "shm on host braid-h2", "/dev/shm is not writable");
}

TEST(Doctor, CrossMemoryAttachRefusedIsNamedWithPtraceScope) {
  Data d = healthy(4, 2);
  d.ranks[0].cmaRefused = "process_vm_readv to rank 1: Operation not permitted";
  d.ranks[0].ptraceScope = d.ranks[1].ptraceScope = 2;
  expectOneFinding(d, "cross-memory attach on host braid-h1", "kernel.yama.ptrace_scope=2");
}

TEST(Doctor, IbMtuAndGidIndexThatDisagreeNameTheOddHost) {
  Data d = healthy(3, 1);
  for (auto& r : d.ranks) {
    r.ibProbe = "";
    r.ibPorts = {{"mlx5_0:1", "ACTIVE", "eth", 4096, 3, -1}};
  }
  d.ranks[1].ibPorts[0].mtu = 1024;
  d.ranks[2].ibPorts[0].gidIndex = 1;
  const auto f = analyse(d);
  EXPECT_EQ(subjects(f), "[ib MTU on host braid-h2][ib GID index on host braid-h3]");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NE(f[1].fix.find("BRAID_IB_GID_INDEX=3"), std::string::npos) << f[1].fix;
}

TEST(Doctor, OpenFileLimitBelowTheJobsNeedIsNamed) {
  Data d = healthy(4, 2);
  d.ranks[3].nofile = 64;
  d.ranks[3].nofileNeed = 200;
  expectOneFinding(d, "open files on rank 3 on braid-h2", "ulimit -n");
}

TEST(Doctor, RankAwayFromItsNicsNumaNodeIsNamed) {
  Data d = healthy(2, 1);
  d.ranks[1].numa = "1";
  d.ranks[1].nicNuma = 0;
  expectOneFinding(d, "rank 1 on braid-h2", "NUMA node 1");
}

TEST(Doctor, TransportsThatDifferBetweenOrWithinHostsAreNamed) {
  Data between = healthy(4, 1);
  between.ranks[0].transportTo[1] = between.ranks[1].transportTo[0] = "ib";
  auto f = analyse(between);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "transports between hosts");
  Data within = healthy(4, 4);
  within.ranks[0].transportTo[1] = within.ranks[1].transportTo[0] = "tcp";
  within.ranks[0].skippedTo[1] = "shm: BRAID_SHM_DISABLE=1 on rank 1";
  f = analyse(within);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "transports within hosts");
  EXPECT_NE(f[0].text.find("shm 5, tcp 1"), std::string::npos) << f[0].text;
}

TEST(Doctor, WrongAllReduceResultsAreAFinding) {
  Data d = healthy(2, 2);
  d.rings.push_back({{0, 1}, 3.0, 6.0, 0});
  EXPECT_TRUE(analyse(d).empty());
  d.rings.push_back({{1, 0}, 3.0, 6.0, 17});
  expectOneFinding(d, "all-reduce results", "17 elements");
}

TEST(Doctor, ClockFarOffIsNamed) {
  Data d = healthy(2, 1);
  d.pairs[0][1].clockOffsetUs = 2.5e6;
  const auto f = analyse(d);
  ASSERT_EQ(f.size(), 1u) << subjects(f);
  EXPECT_EQ(f[0].subject, "clock on host braid-h2");
}

TEST(Doctor, FactsSurviveTheirTextForm) {
  Data d = healthy(3, 1);
  RankFacts f = d.ranks[1];
  f.ibPorts = {{"mlx5_0:1", "ACTIVE", "eth", 4096, 3, 1}};
  f.ifSpecProblem = "tabs\tand\nnewlines";
  f.unreachable = "rank 0 (braid-h1) at 10.213.0.1: no route";
  f.memlock = kUnlimited;
  RankFacts g = RankFacts::parse(f.serialize());
  EXPECT_EQ(g.serialize(), f.serialize());
  EXPECT_EQ(g.ibPorts.size(), 1u);
  EXPECT_EQ(g.ibPorts[0].gidIndex, 3);
  EXPECT_EQ(g.memlock, kUnlimited);
  EXPECT_EQ(g.transportTo, f.transportTo);
  EXPECT_EQ(g.ifSpecProblem, "tabs and newlines");
}

// The peers connected at creation travel as the ranges of those that were not: a few ranges a
// rank whatever the size, read back exactly.
TEST(Doctor, PeersConnectedAtCreationSurviveAsRanges) {
  RankFacts f;
  f.connectedTo.assign(1000, true);
  for (int p : {3, 4, 5, 6, 9, 998, 999}) f.connectedTo[static_cast<std::size_t>(p)] = false;
  const std::string text = f.serialize();
  EXPECT_NE(text.find("connected\t1000\t3-6,9,998-999"), std::string::npos) << text;
  EXPECT_EQ(RankFacts::parse(text).connectedTo, f.connectedTo);
  EXPECT_EQ(text.find("peer\t"), std::string::npos);  // no line a peer
}

// A report made from choices asked on demand (braid doctor asks the communicator) reads as one
// made from the ranks' own tables.
TEST(Doctor, ChoicesAskedOnDemandReportAsTables) {
  Data tables = healthy(4, 2);
  tables.ranks[0].skippedTo[2] = tables.ranks[2].skippedTo[0] = "shm skipped: rank 2 is on host braid-h2";
  Data asked = tables;
  for (RankFacts& f : asked.ranks) f.transportTo.clear(), f.skippedTo.clear();
  asked.choiceOf = [&tables](int a, int b) { return tables.choice(a, b); };
  const auto findings = analyse(tables);
  EXPECT_EQ(textReport(asked, analyse(asked)), textReport(tables, findings));
  EXPECT_EQ(jsonReport(asked, analyse(asked)), jsonReport(tables, findings));
}

TEST(Doctor, RankText) {
  EXPECT_EQ(rankText({3}), "rank 3");
  EXPECT_EQ(rankText({0, 1, 2, 5, 7, 8}), "ranks 0-2,5,7-8");
}

}  // namespace
}  // namespace braid::tools::doctor
