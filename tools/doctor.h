// `braid doctor`: what each rank found about itself, what the job measured, and the findings drawn
// from both. The run (tools/doctor.cc) gathers RankFacts (tools/doctor_checks.cc) and the pair and
// ring figures; analyse() (tools/doctor_verdict.cc) turns them into findings, a pure function the
// unit tests drive with made-up data; tools/doctor_report.cc writes the text, JSON and SVG.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "braid/status.hpp"
#include "base/config.h"

namespace braid::tools::doctor {

inline constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

struct Iface {
  std::string name, addr;  // IPv4
  int prefix = 0;          // subnet prefix length
  int mtu = 0;
  bool up = false;
  std::string route;  // "" when its subnet routes through it; else "blackhole", "unreachable", "prohibited"
};

struct IbPortFact {
  std::string name;   // device:port
  std::string state;  // "ACTIVE", "DOWN", ...
  std::string link;   // "ib" or "eth" (RoCE)
  int mtu = 0;        // active MTU in bytes
  int gidIndex = -1;  // the GID index Braid would use (ACTIVE ports), else -1
  int numa = -1;
};

// What one rank found about itself before and after joining the doctor's communicator.
struct RankFacts {
  int rank = -1;
  std::string host, bootId;
  int pid = 0;
  std::uint64_t cmaAddr = 0;  // an address of this process that same-host peers try to read
  std::string cpus, numa;     // Linux list text: the CPUs it may run on, their NUMA nodes
  // /dev/shm
  std::uint64_t shmSize = 0, shmFree = 0, shmNeed = 0;  // need: what this job's shm segments take here
  int localRanks = 1;
  bool shmOffByDoctor = false;  // too little room: the doctor ran this rank with shm off
  std::string shmProbe;         // "" usable, else the transport's reason
  // Segments that dead processes left in /dev/shm, removed by this rank's check (ShmSegment::removeLeftovers)
  int shmLeftovers = 0;
  std::uint64_t shmLeftoverBytes = 0;
  std::string shmLeftoverPids;
  int ptraceScope = -1;         // kernel.yama.ptrace_scope, -1 where there is no Yama
  std::string cmaRefused;       // "" attach works (or no same-host peer), else the reason
  std::string unreachable;      // "" every other host's tcp address has a route from here, else which not
  // limits
  std::uint64_t memlock = 0, memlockNeed = 0;  // bytes (kUnlimited); need: one ib connection's
  bool ipcLock = false;                        // CAP_IPC_LOCK: memlock does not bind
  std::uint64_t nofile = 0, nofileNeed = 0;
  // network
  std::string ifSpec;         // BRAID_SOCKET_IFNAME as set ("" when not)
  std::string ifSpecProblem;  // why the doctor ran without it ("" when it works here)
  std::string tcpIface, tcpAddr;  // the interface tcp listens on here, and its address
  int tcpMtu = 0;
  int nicNuma = -1;  // that interface's NUMA node, -1 unknown
  std::vector<Iface> ifaces;
  // ib
  std::string ibProbe;  // "" usable, else the reason ("not built" in builds without the headers)
  bool ibDisabled = false;
  std::vector<IbPortFact> ibPorts;
  // BRAID_* variables set for this rank, with BRAID_SECRET's value replaced by a digest
  std::vector<std::pair<std::string, std::string>> settings;
  // by peer rank: the transport chosen ("self" for this rank) and why the ones before it were not.
  // Empty from braid doctor (Data::choiceOf works any pair out); tests may fill them.
  std::vector<std::string> transportTo, skippedTo;
  // per peer: connected when the communicator was made (BRAID_CONNECT), else on first use; a peer
  // past the end counts as connected. On the wire: the peers not connected, as ranges.
  std::vector<bool> connectedTo;

  std::string serialize() const;
  static RankFacts parse(const std::string& text);
};

// One unordered pair's figures, measured by the lower rank of the pair.
struct PairFigure {
  bool measured = false;
  double latUs = 0;        // one way, half the median round trip of small messages
  double gbps = 0;         // per direction, both directions at once, best of the iterations
  int share = 1;           // pairs of the same round that crossed the busier host's link
  double clockOffsetUs = 0;  // higher rank's clock minus the lower's
};

// The figures of the pairs measured, read as [a][b] either way round (a pair not measured reads
// as PairFigure{}, measured false). Held sparse: over H hosts the doctor measures O(H^2 + n)
// pairs, not n^2 (a dense matrix would take 4 GB at 10,000 ranks).
class PairTable {
 public:
  PairTable() = default;
  explicit PairTable(int n) : n_(n) {}
  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const PairFigure& at(int a, int b) const {
    auto it = cells_.find(key(a, b));
    return it == cells_.end() ? kNone : it->second;
  }
  PairFigure& cell(int a, int b) { return cells_[key(a, b)]; }  // made (not measured) if absent
  // `f` as the lower rank measured it, and its mirror (the clock offset seen from the other end).
  void set(int a, int b, PairFigure f) {
    cell(a, b) = f;
    f.clockOffsetUs = -f.clockOffsetUs;
    cell(b, a) = f;
  }
  // Every measured pair once, a < b.
  template <typename F>
  void forEachMeasured(F&& f) const {
    for (const auto& [k, fig] : cells_) {
      const int a = static_cast<int>(k >> 32), b = static_cast<int>(k & 0xffffffffu);
      if (a < b && fig.measured) f(a, b, fig);
    }
  }
  struct Row {
    PairTable* t;
    int a;
    PairFigure& operator[](int b) const { return t->cell(a, b); }
  };
  struct ConstRow {
    const PairTable* t;
    int a;
    const PairFigure& operator[](int b) const { return t->at(a, b); }
  };
  Row operator[](int a) { return {this, a}; }
  ConstRow operator[](int a) const { return {this, a}; }

 private:
  static std::uint64_t key(int a, int b) { return static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32 | static_cast<std::uint32_t>(b); }
  static inline const PairFigure kNone{};
  int n_ = 0;
  std::unordered_map<std::uint64_t, PairFigure> cells_;
};

struct RingFigure {
  std::vector<int> order;
  double busbw = 0;     // GB/s, nccl-tests' all-reduce factor 2(n-1)/n
  double slowestHop = 0;  // the slowest pair figure along the ring (GB/s)
  std::size_t wrong = 0;  // elements that differ from the exact sum, over all ranks
};

// A pair's transport and why the transports before it were skipped ("" when none was).
struct PairChoice {
  std::string transport, skipped;
};

struct Data {
  std::vector<RankFacts> ranks;
  // Each pair's choice, on demand: braid doctor asks the communicator, which works any pair out
  // from its roster, so that no rank ships a line per peer (n^2 in all). Unset: the ranks'
  // transportTo and skippedTo.
  std::function<PairChoice(int a, int b)> choiceOf;
  PairChoice choice(int a, int b) const {
    if (a == b) return {"self", ""};
    if (choiceOf) return choiceOf(a, b);
    const RankFacts& f = ranks[static_cast<std::size_t>(a)];
    const auto k = static_cast<std::size_t>(b);
    return {k < f.transportTo.size() ? f.transportTo[k] : "", k < f.skippedTo.size() ? f.skippedTo[k] : ""};
  }
  PairTable pairs;      // [a][b]: the pairs measured, each both ways round
  int rounds = 0;       // rounds of disjoint pairs measured (measurementRounds)
  bool byHost = false;  // one rank pair per two hosts, not every pair
  bool oneAtATime = false;  // a pair a round: every host on one kernel
  std::vector<RingFigure> rings;
  // Links between hosts that the first pass found slow, and the fastest of their transport,
  // measured again one rank pair at a time, alternately (per link, GB/s, the median and the best
  // of the rounds): the verdict holds only if these confirm it. Keyed by host indexes (a < b) of
  // layOut's order.
  struct Remeasured {
    double median = 0, best = 0;
  };
  std::map<std::pair<int, int>, Remeasured> confirmed;
  // --baseline FILE: the fastest link between hosts of each transport in an earlier run's --json
  // (GB/s, as measured again where it was): the reference when it is faster than this run's.
  std::map<std::string, double> baseline;
  std::string baselineFrom;  // "FILE (its started_at)"
  std::size_t bytes = 0;
  int iters = 0;
  double slowRatio = 0.5;
  bool halveOnOneKernel = true;  // --one-kernel half (default): links between hosts of one kernel held to half the ratio
  std::string startedAt, version;
};

struct Finding {
  std::string subject;  // "link braid-h1–braid-h2", "host braid-h2", "rank 3", "BRAID_NSOCKS", ...
  std::string text;     // what is wrong, with the figures
  std::string fix;      // the knob or command that fixes it
};

// The hosts in order of their first rank, and each rank's host index.
struct HostLayout {
  std::vector<std::string> names;
  std::vector<std::vector<int>> ranks;
  std::vector<int> hostOf;
};
HostLayout layOut(const std::vector<RankFacts>& ranks);

// A link between two hosts: the median over its rank pairs of gbps x share (what the link carried
// when the round's pairs across it shared it), and of gbps alone (each pair's own figure; where
// the hosts' CPUs, not the link, bound the pairs, sharing took nothing from the link).
struct HostLink {
  int a = 0, b = 0;
  double gbps = 0;
  double raw = 0;
  double confirmed = 0;      // Data::confirmed's median, 0 when it was not measured again
  double confirmedBest = 0;  // and its best
  double latUs = 0;
  int pairs = 0;
  std::string transport;
  bool oneKernel = false;  // both hosts run on one kernel (the same boot id), held to half the ratio (--one-kernel half)
};
std::vector<HostLink> hostLinks(const Data& d, const HostLayout& h);
// The ratio `link` is held to: `ratio`, or half of it between hosts on one kernel. Their link is
// that kernel's copies, bound by the CPUs the hosts share, and healthy ones scatter by 2x there: 3
// test hosts on the 2-core CI machine once measured 2.3 GB/s on two links against 4.9 on the
// third, alternately and again, with nothing capped.
double slowRatioOf(const HostLink& link, double ratio);

// The verdict on the links between hosts: one slow link; every link of one host slow; slow links
// that neither explains. Slow: even its shared figure (gbps) below ratio x the fastest link's own
// figure (raw), among the links of one transport: each side of the comparison the kindest to the
// link judged, so that neither way of sharing makes a healthy link look slow. Measured again, the
// same holds: its best round against the fastest link's median one. (ratio: see slowRatioOf.)
struct Baseline {
  std::map<std::string, double> best;  // Data::baseline
  std::string from;
};
std::vector<Finding> judgeLinks(const std::vector<std::string>& hosts, const std::vector<HostLink>& links, double ratio,
                                const Baseline& baseline = {});
// What the first pass would call slow (the confirmAtMost slowest of a transport), with the fastest
// link of each such transport: the links to measure again (host indexes, a < b).
inline constexpr std::size_t kConfirmAtMost = 6;
// How many of a transport's suspects are measured again: kConfirmAtMost, or among many links twice
// the square root of their number (496 links between 32 hosts: 45; 499,500 between 1,000: 1,414).
// Each costs a few exchanges of --bytes while every rank waits; a suspect left out keeps its first
// figure, and on shared cores first figures of healthy links scatter down to a tenth of the median.
std::size_t confirmAtMost(std::size_t links);
// What a transport's links between hosts are held to: with kMedianFromLinks links or more (and no
// baseline), the median link's figure (one outlier, fast or slow, moves it little: many links
// measured on shared cores scatter), else 0, and the fastest link (or the baseline) is the reference.
inline constexpr std::size_t kMedianFromLinks = 16;
double linkReference(const std::vector<HostLink>& links, double baseline);
std::vector<std::pair<int, int>> linksToConfirm(const std::vector<HostLink>& links, double ratio, const Baseline& baseline = {});
// The baseline from an earlier run's --json text; `from` names it in the findings.
Result<Baseline> readBaseline(const std::string& json, const std::string& from);

// Every finding, local checks first, then the measurement's.
std::vector<Finding> analyse(const Data& d);

// The circle method's rounds of disjoint pairs for n ranks: n-1, or n for odd n (one rank sits out
// each), none for one rank.
inline int roundsFor(int n) { return n < 2 ? 0 : n - 1 + (n & 1); }
// Round r of those: its disjoint pairs (a < b).
std::vector<std::pair<int, int>> roundPairs(int n, int r);
// The rank pairs the doctor measures, in rounds of disjoint pairs. Every pair (the circle method
// over the ranks) where each host holds one rank or there is one host. Otherwise one pair per two
// hosts, their first ranks (the circle method over the hosts: H-1 rounds, H for odd H), and a last
// round pairing each host's first two ranks: so 128 hosts x 8 ranks take 128 rounds, not 1,023,
// and rank 0 meets every host's first rank (the clocks). `oneAtATime`: the same pairs, a round
// each (hosts that share one kernel share its cores too: pairs measured side by side would measure
// the CPUs, not the links).
std::vector<std::vector<std::pair<int, int>>> measurementRounds(const HostLayout& h, int n, bool oneAtATime = false);
inline bool measuresByHost(const HostLayout& h, int n) { return h.names.size() > 1 && static_cast<int>(h.names.size()) < n; }

// "ranks 0-3", "rank 2"; and "1.5 MiB"-style sizes.
std::string rankText(const std::vector<int>& ranks);
std::string bytesText(std::uint64_t bytes);

// tools/doctor_checks.cc: this rank's local checks before the communicator exists. `storeIp` is the
// rendezvous address (tcp's interface is the one toward it unless BRAID_SOCKET_IFNAME says).
RankFacts collectLocal(const Config& config, const std::string& storeIp, int nranks, int localRanks);

// tools/doctor_report.cc
std::string textReport(const Data& d, const std::vector<Finding>& findings);
std::string jsonReport(const Data& d, const std::vector<Finding>& findings);
std::string svgHeatmap(const Data& d);

}  // namespace braid::tools::doctor
