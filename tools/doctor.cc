// `braid doctor`: every rank takes part, rank 0 prints one report. The run: local checks
// (tools/doctor_checks.cc), a communicator (with a setting that cannot work here left out, and
// said so), the facts and transport choices gathered to rank 0, pairwise latency and bandwidth in
// n-1 rounds of disjoint pairs (the circle method), a ring all-reduce in two orders, then the
// findings (tools/doctor_verdict.cc) and the report (tools/doctor_report.cc).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sched.h>

#include "braid/braid.h"
#include "braid_version.h"
#include "base/config.h"
#include "base/socket.h"
#include "comm/algorithms/cma.h"
#include "comm/bootstrap/init.h"
#include "comm/introspect.h"
#include "tools/doctor.h"
#include "topology/topology.h"
#include "tools/tools.h"

namespace braid::tools {
namespace {
using namespace doctor;

const char* kUsage =
    "usage: braid doctor [--bytes SIZE] [--iters N] [--slow RATIO] [--one-kernel half|full] [--baseline FILE]\n"
    "                    [--json FILE] [--svg FILE]\n"
    "  run it like any Braid program: braid run -n 4 braid doctor; torchrun ... --no_python braid doctor; mpirun\n"
    "  --bytes SIZE   what each pair sends both ways per iteration, and the ring all-reduce's size (default 4M)\n"
    "  --iters N      timed iterations per pair and per ring, after one warm-up; the best counts (default 3)\n"
    "  --slow RATIO   a link between hosts is slow below RATIO x the fastest one of its transport (default 0.5;\n"
    "                 half of it between hosts on one kernel, namespaces or containers of one machine)\n"
    "  --one-kernel full  hold links between hosts of one kernel to the whole RATIO too, as between machines\n"
    "                 (where their links are capped, so that the CPUs they share are not what limits them)\n"
    "  --baseline FILE  an earlier healthy run's --json: links between hosts are also held to its fastest\n"
    "                 (so that a system where every link is equally slow is found)\n"
    "  --json FILE    everything, for tools;  --svg FILE: the pair bandwidth matrix as a heatmap\n"
    "  exit status: 0 healthy, 1 something was found, 2 the doctor could not run; rank 0 exits with it,\n"
    "                 the others 0 unless the doctor could not run there (a launcher stops the job at the\n"
    "                 first non-zero status, so across hosts the launcher of node rank 0 carries it)\n";

struct Options {
  std::size_t bytes = 4u << 20;
  int iters = 3;
  double slow = 0.5;
  bool halveOnOneKernel = true;
  std::string json, svg, baseline;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
std::int64_t wallUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool parseSize(const char* text, std::size_t* out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) return false;
  if (*end == 'K' || *end == 'k') v *= 1024, ++end;
  else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, ++end;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, ++end;
  if (*end) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--bytes" && (v = value()) && parseSize(v, &o.bytes) && o.bytes >= 8) {
    } else if (a == "--iters" && (v = value()) && (o.iters = std::atoi(v)) >= 1) {
    } else if (a == "--slow" && (v = value()) && (o.slow = std::atof(v)) > 0 && o.slow < 1) {
    } else if (a == "--one-kernel" && (v = value()) && (std::string(v) == "half" || std::string(v) == "full")) {
      o.halveOnOneKernel = std::string(v) == "half";
    } else if (a == "--json" && (v = value())) {
      o.json = v;
    } else if (a == "--baseline" && (v = value())) {
      o.baseline = v;
    } else if (a == "--svg" && (v = value())) {
      o.svg = v;
    } else {
      std::fprintf(stderr, "braid doctor: bad argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  return -1;
}

// Each rank's text, on every rank (lengths first, then the texts padded to the longest).
Result<std::vector<std::string>> allGatherText(braidComm_t comm, int n, const std::string& mine) {
  std::uint64_t len = mine.size();
  std::vector<std::uint64_t> lens(static_cast<std::size_t>(n));
  if (braidAllGather(&len, lens.data(), 1, braidUint64, comm, nullptr) != braidSuccess)
    return Status::Internal(braidGetLastError(comm));
  std::uint64_t width = 1;
  for (std::uint64_t l : lens) width = std::max(width, l);
  std::string padded = mine;
  padded.resize(width, '\0');
  std::string all(width * static_cast<std::size_t>(n), '\0');
  if (braidAllGather(padded.data(), all.data(), width, braidUint8, comm, nullptr) != braidSuccess)
    return Status::Internal(braidGetLastError(comm));
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(r * width, lens[static_cast<std::size_t>(r)]));
  return out;
}

struct Doctor {
  Options o;
  braidComm_t comm = nullptr;
  int rank = 0, n = 1;
  std::string error;  // what stopped the run
  const std::vector<RankFacts>* facts = nullptr;  // every rank's, once gathered

  // While a rank pair on different hosts of one machine (namespaces or containers sharing a kernel:
  // the same boot id) measures their link, each runs on a CPU of its own: unpinned, the scheduler
  // may put both on one core, and the figures then measure it, not the link (3 test hosts on the
  // 2-core CI machine: latency 66-142 us for half the links, 6.6-8.8 us for every link pinned).
  struct PairPin {
    cpu_set_t saved;
    bool pinned = false;
    PairPin(const std::vector<RankFacts>* facts, int me, int peer) {
      if (!facts || facts->size() <= static_cast<std::size_t>(std::max(me, peer))) return;
      const RankFacts& a = (*facts)[static_cast<std::size_t>(std::min(me, peer))];
      const RankFacts& b = (*facts)[static_cast<std::size_t>(std::max(me, peer))];
      if (a.host == b.host || a.bootId.empty() || a.bootId != b.bootId) return;
      const std::vector<int> ca = topology::parseCpuList(a.cpus), cb = topology::parseCpuList(b.cpus);
      if (ca.empty()) return;
      int cpu = ca[0];  // the lower rank's first CPU; the higher rank's first other one
      if (me != std::min(me, peer)) {
        auto other = std::find_if(cb.begin(), cb.end(), [&](int c) { return c != ca[0]; });
        if (other == cb.end()) return;
        cpu = *other;
      }
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      pinned = ::sched_getaffinity(0, sizeof(saved), &saved) == 0 && ::sched_setaffinity(0, sizeof(set), &set) == 0;
    }
    ~PairPin() {
      if (pinned) ::sched_setaffinity(0, sizeof(saved), &saved);
    }
  };

  bool ok(braidResult_t r, const char* what) {
    if (r == braidSuccess) return true;
    if (error.empty()) error = std::string(what) + ": " + braidGetLastError(comm);
    return false;
  }
  bool exchange(const void* s, std::size_t sBytes, void* r, std::size_t rBytes, int to, int from) {
    return ok(braidGroupStart(), "group") && ok(braidSend(s, sBytes, braidUint8, to, comm, nullptr), "send") &&
           ok(braidRecv(r, rBytes, braidUint8, from, comm, nullptr), "recv") && ok(braidGroupEnd(), "group");
  }

  // One pair's figures, measured by both ends; the lower rank's count.
  PairFigure measurePair(int peer) {
    PairFigure f;
    f.measured = true;
    const bool lower = rank < peer;
    std::vector<double> rtts;
    double bestRtt = 1e30;
    std::int64_t msg = 0, reply = 0;
    for (int i = 0; i < 21 && error.empty(); ++i) {
      if (lower) {
        const std::int64_t w0 = wallUs();
        const double t0 = now();
        if (!ok(braidSend(&msg, 8, braidUint8, peer, comm, nullptr), "send") ||
            !ok(braidRecv(&reply, 8, braidUint8, peer, comm, nullptr), "recv"))
          break;
        const double rtt = now() - t0;
        const std::int64_t w1 = wallUs();
        if (i == 0) continue;  // the first round trip warms the path up
        rtts.push_back(rtt);
        if (rtt < bestRtt) {
          bestRtt = rtt;
          f.clockOffsetUs = static_cast<double>(reply) - (static_cast<double>(w0) + static_cast<double>(w1)) / 2;
        }
      } else {
        if (!ok(braidRecv(&msg, 8, braidUint8, peer, comm, nullptr), "recv")) break;
        reply = wallUs();
        if (!ok(braidSend(&reply, 8, braidUint8, peer, comm, nullptr), "send")) break;
      }
    }
    if (!rtts.empty()) {
      std::sort(rtts.begin(), rtts.end());
      f.latUs = rtts[rtts.size() / 2] / 2 * 1e6;
    }
    std::vector<std::byte> out(o.bytes, std::byte{1}), in(o.bytes);
    double best = 1e30;
    for (int i = 0; i <= o.iters && error.empty(); ++i) {
      const double t0 = now();
      if (!exchange(out.data(), o.bytes, in.data(), o.bytes, peer, peer)) break;
      if (i > 0) best = std::min(best, now() - t0);
    }
    if (error.empty()) f.gbps = static_cast<double>(o.bytes) / best / 1e9;
    return f;
  }

  // The pairs of `rounds` (measurementRounds), round by round; every measured pair's figures on
  // every rank (rank 0 reports them), the other pairs not measured. One all-reduce of 3 doubles a
  // pair measured, each filled by the pair's lower rank: O(H^2 + n) over H hosts, not n x n.
  PairTable measurePairs(const std::vector<std::vector<std::pair<int, int>>>& rounds) {
    std::vector<std::pair<int, int>> list;  // (lower, higher), in round order
    std::vector<std::size_t> first;         // each round's first index into it
    for (const auto& round : rounds) {
      first.push_back(list.size());
      for (auto [a, b] : round) list.push_back({std::min(a, b), std::max(a, b)});
    }
    std::vector<double> mine(list.size() * 3, 0.0), all(mine.size());
    for (std::size_t r = 0; r < rounds.size() && error.empty(); ++r) {
      for (std::size_t k = first[r]; k < first[r] + rounds[r].size(); ++k) {
        auto [a, b] = list[k];
        if (a != rank && b != rank) continue;
        const int peer = a == rank ? b : a;
        PairPin pin(facts, rank, peer);
        PairFigure f = measurePair(peer);
        if (rank == a) mine[k * 3] = f.latUs, mine[k * 3 + 1] = f.gbps, mine[k * 3 + 2] = f.clockOffsetUs;
      }
      if (error.empty()) ok(braidBarrier(comm), "barrier between rounds");
    }
    PairTable m(n);
    if (!error.empty() ||
        !ok(braidAllReduce(mine.data(), all.data(), mine.size(), braidFloat64, braidSum, comm, nullptr), "gather"))
      return m;
    for (std::size_t k = 0; k < list.size(); ++k) {
      PairFigure f;
      f.measured = true;
      f.latUs = all[k * 3], f.gbps = all[k * 3 + 1], f.clockOffsetUs = all[k * 3 + 2];
      m.set(list[k].first, list[k].second, f);
    }
    return m;
  }

  // The links `which` (host indexes) measured again, each by its hosts' first ranks while every
  // other rank waits, in turn and `reps` times over: the median and best per link, on every rank.
  std::map<std::pair<int, int>, Data::Remeasured> confirm(const HostLayout& h, const std::vector<std::pair<int, int>>& which,
                                                          int reps) {
    std::vector<double> samples(which.size() * static_cast<std::size_t>(reps), 0.0), all(samples.size());
    std::vector<std::byte> out(o.bytes, std::byte{1}), in(o.bytes);
    for (int rep = 0; rep < reps && error.empty(); ++rep)
      for (std::size_t i = 0; i < which.size() && error.empty(); ++i) {
        const int a = h.ranks[which[i].first][0], b = h.ranks[which[i].second][0];
        if (rank == a || rank == b) {
          const int peer = rank == a ? b : a;
          PairPin pin(facts, rank, peer);
          if (rep == 0 && !exchange(out.data(), o.bytes, in.data(), o.bytes, peer, peer)) break;  // warm-up
          const double t0 = now();
          if (!exchange(out.data(), o.bytes, in.data(), o.bytes, peer, peer)) break;
          samples[i * static_cast<std::size_t>(reps) + static_cast<std::size_t>(rep)] = static_cast<double>(o.bytes) / (now() - t0) / 1e9;
        }
        ok(braidBarrier(comm), "barrier between links");
      }
    std::map<std::pair<int, int>, Data::Remeasured> figures;
    if (!error.empty() || !ok(braidAllReduce(samples.data(), all.data(), all.size(), braidFloat64, braidMax, comm, nullptr), "gather"))
      return figures;
    for (std::size_t i = 0; i < which.size(); ++i) {
      std::vector<double> v(all.begin() + static_cast<std::ptrdiff_t>(i) * reps, all.begin() + static_cast<std::ptrdiff_t>(i + 1) * reps);
      std::sort(v.begin(), v.end());
      figures[which[i]] = {v[v.size() / 2], v.back()};
    }
    return figures;
  }

  // A ring all-reduce (reduce-scatter, then all-gather) of o.bytes of floats along `order`, checked
  // exactly: integer values make the sum exact in any order.
  RingFigure ring(const std::vector<int>& order) {
    RingFigure rf;
    rf.order = order;
    std::size_t pos = 0;
    while (order[pos] != rank) ++pos;
    const int next = order[(pos + 1) % order.size()], prev = order[(pos + order.size() - 1) % order.size()];
    const std::size_t count = std::max<std::size_t>(o.bytes / 4, static_cast<std::size_t>(n));
    auto lo = [&](std::size_t c) { return count * c / static_cast<std::size_t>(n); };
    std::vector<float> data(count), tmp(count / static_cast<std::size_t>(n) + 1);
    const std::size_t nn = static_cast<std::size_t>(n);
    double best = 1e30;
    std::uint64_t wrong = 0;
    for (int it = 0; it <= o.iters && error.empty(); ++it) {
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
      if (!ok(braidBarrier(comm), "barrier")) break;
      const double t0 = now();
      for (std::size_t s = 0; s + 1 < nn && error.empty(); ++s) {
        const std::size_t sc = (pos + nn - s) % nn, rc = (pos + 2 * nn - s - 1) % nn;
        if (!exchange(&data[lo(sc)], (lo(sc + 1) - lo(sc)) * 4, tmp.data(), (lo(rc + 1) - lo(rc)) * 4, next, prev)) break;
        for (std::size_t i = lo(rc); i < lo(rc + 1); ++i) data[i] += tmp[i - lo(rc)];
      }
      for (std::size_t s = 0; s + 1 < nn && error.empty(); ++s) {
        const std::size_t sc = (pos + 1 + nn - s) % nn, rc = (pos + nn - s) % nn;
        if (!exchange(&data[lo(sc)], (lo(sc + 1) - lo(sc)) * 4, &data[lo(rc)], (lo(rc + 1) - lo(rc)) * 4, next, prev)) break;
      }
      const double t = now() - t0;
      if (it > 0) best = std::min(best, t);
      const float total = static_cast<float>(n * (n + 1) / 2);
      for (std::size_t i = 0; i < count; ++i) wrong += data[i] != total * static_cast<float>(i % 7 + 1);
    }
    double slowest = 0;
    std::uint64_t allWrong = 0;
    if (error.empty() && ok(braidAllReduce(&best, &slowest, 1, braidFloat64, braidMax, comm, nullptr), "ring time") &&
        ok(braidAllReduce(&wrong, &allWrong, 1, braidUint64, braidSum, comm, nullptr), "ring check")) {
      rf.busbw = static_cast<double>(count * 4) / slowest / 1e9 * 2.0 * (n - 1) / n;
      rf.wrong = allWrong;
    }
    return rf;
  }
};

// Two rings that cross as differently as the hosts allow: rank order, and (across hosts) each
// host's first ranks, then each host's second ranks, ... so that every hop changes hosts; on one host,
// the even ranks then the odd ones. The second is left out when it uses the same links.
std::vector<std::vector<int>> ringOrders(const HostLayout& h, int n) {
  std::vector<int> a(static_cast<std::size_t>(n)), b;
  for (int r = 0; r < n; ++r) a[r] = r;
  if (h.names.size() > 1) {
    for (std::size_t k = 0;; ++k) {
      bool any = false;
      for (const auto& ranks : h.ranks)
        if (k < ranks.size()) b.push_back(ranks[k]), any = true;
      if (!any) break;
    }
  } else {
    for (int r = 0; r < n; r += 2) b.push_back(r);
    for (int r = 1; r < n; r += 2) b.push_back(r);
  }
  auto edges = [](const std::vector<int>& o) {
    std::set<std::pair<int, int>> e;
    for (std::size_t i = 0; i < o.size(); ++i) {
      int x = o[i], y = o[(i + 1) % o.size()];
      e.emplace(std::min(x, y), std::max(x, y));
    }
    return e;
  };
  if (n < 2) return {};
  if (edges(a) == edges(b)) return {a};
  return {a, b};
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) std::fprintf(stderr, "braid doctor: cannot write %s\n", path.c_str());
}

}  // namespace

int runDoctor(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, o); rc >= 0) return rc;
  auto params = paramsFromEnv();
  if (!params.ok()) {
    std::fprintf(stderr, "braid doctor: cannot start: %s\n", params.status().message().c_str());
    return 2;
  }
  auto launch = readLaunchEnv();
  const int localRanks = launch.ok() && launch->localWorldSize > 0 ? launch->localWorldSize : params->nranks;
  RankFacts mine = collectLocal(params->config, params->storeIp, params->nranks, localRanks);
  mine.rank = params->rank;
  // What would stop a job here is a finding, not a reason for the doctor to fail: it runs
  // without that setting, and the report says so.
  if (!mine.ifSpecProblem.empty()) params->config.socketIfname.clear();
  if (mine.localRanks > 1 && mine.shmProbe.empty() && mine.shmFree < mine.shmNeed) {
    params->config.shmDisable = true;
    mine.shmOffByDoctor = true;
  }
  auto created = createComm(*params);
  if (!created.ok()) {
    std::fprintf(stderr, "braid doctor: rank %d could not join the job: %s\n", params->rank,
                 created.status().message().c_str());
    return 2;
  }
  Doctor d;
  d.o = o;
  d.comm = *created;
  d.rank = params->rank;
  d.n = params->nranks;
  const int n = d.n;
  const CommView view(d.comm);
  for (int p = 0; p < n; ++p) mine.connectedTo.push_back(p == d.rank || view.connected(p));
  mine.cmaAddr = cmaProbeAddress();  // what same-host peers read to test cross-memory attach
  Data data;
  data.choiceOf = [view](int a, int b) {
    const braid::PeerChoice c = view.choiceBetween(a, b);
    return PairChoice{c.transport, c.skipped};
  };
  data.bytes = o.bytes;
  data.iters = o.iters;
  data.slowRatio = o.slow;
  data.halveOnOneKernel = o.halveOnOneKernel;
  data.version = std::string("braid ") + std::to_string(BRAID_MAJOR) + "." + std::to_string(BRAID_MINOR) + "." +
                 std::to_string(BRAID_PATCH) + " (" + BRAID_VERSION_TAG + ")";
  if (!o.baseline.empty()) {
    // Rank 0's file, on every rank (each works out the links to measure again from it).
    std::string text;
    if (d.rank == 0) {
      std::ifstream f(o.baseline);
      std::ostringstream all;
      all << f.rdbuf();
      text = f ? all.str() : "";
      if (text.empty()) text = "!cannot read " + o.baseline;
    }
    auto got = allGatherText(d.comm, n, text);
    if (!got.ok()) {
      d.error = got.status().message();
    } else if ((*got)[0].rfind('!', 0) == 0) {
      d.error = "--baseline: rank 0 " + (*got)[0].substr(1);
    } else if (auto b = readBaseline((*got)[0], o.baseline); !b.ok()) {
      d.error = b.status().message();
    } else {
      data.baseline = b->best;
      data.baselineFrom = b->from;
    }
    if (!d.error.empty()) {  // the same on every rank
      if (d.rank == 0) std::fprintf(stderr, "braid doctor: %s\n", d.error.c_str());
      braidCommDestroy(d.comm);
      return 2;
    }
  }
  auto texts = allGatherText(d.comm, n, mine.serialize());
  if (texts.ok()) {
    for (const std::string& t : *texts) data.ranks.push_back(RankFacts::parse(t));
    // Cross-memory attach to each peer on this host, as the communicator's probe does.
    std::string refused;
    for (const RankFacts& p : data.ranks)
      if (p.rank != d.rank && p.host == mine.host && p.bootId == mine.bootId && refused.empty()) {
        Status s = cmaProbe(p.pid, p.cmaAddr);
        if (!s.ok()) refused = "rank " + std::to_string(d.rank) + " cannot read rank " + std::to_string(p.rank) + ": " + s.message();
      }
    // A route to every other host's tcp address (pairs on shm or ib never tried one).
    std::string unreachable;
    for (const RankFacts& p : data.ranks)
      if (p.host != mine.host && !p.tcpAddr.empty())
        if (auto a = net::localAddressToward(p.tcpAddr); !a.ok())
          unreachable += (unreachable.empty() ? "" : "; ") + std::string("rank ") + std::to_string(p.rank) + " (" + p.host +
                         ") at " + p.tcpAddr + ": " + a.status().message();
    auto second = allGatherText(d.comm, n, refused + '\n' + unreachable);
    if (second.ok())
      for (int r = 0; r < n; ++r) {
        const std::string& t = (*second)[r];
        const std::size_t nl = t.find('\n');
        data.ranks[r].cmaRefused = t.substr(0, nl);
        data.ranks[r].unreachable = nl == std::string::npos ? "" : t.substr(nl + 1);
      }
    else d.error = second.status().message();
  } else {
    d.error = texts.status().message();
  }
  const HostLayout hosts = layOut(data.ranks);
  d.facts = &data.ranks;
  // Hosts that are namespaces or containers of one kernel (one boot id) share its cores: their
  // pairs are measured one at a time.
  bool oneKernel = hosts.names.size() > 1;
  for (const auto& ranks : hosts.ranks) {
    const std::string& boot = data.ranks[static_cast<std::size_t>(ranks[0])].bootId;
    oneKernel = oneKernel && !boot.empty() && boot == data.ranks[0].bootId;
  }
  const auto rounds = measurementRounds(hosts, n, oneKernel);
  data.rounds = static_cast<int>(rounds.size());
  data.byHost = measuresByHost(hosts, n);
  data.oneAtATime = oneKernel;
  if (d.error.empty()) data.pairs = d.measurePairs(rounds);
  if (d.error.empty()) {
    // Which pairs crossed between hosts in the same round: they shared the busier host's link.
    for (const auto& pairs : rounds) {
      std::vector<int> across(hosts.names.size(), 0);
      for (auto [a, b] : pairs)
        if (hosts.hostOf[a] != hosts.hostOf[b]) ++across[hosts.hostOf[a]], ++across[hosts.hostOf[b]];
      for (auto [a, b] : pairs)
        if (hosts.hostOf[a] != hosts.hostOf[b])
          data.pairs[a][b].share = data.pairs[b][a].share = std::max(across[hosts.hostOf[a]], across[hosts.hostOf[b]]);
    }
  }
  if (d.error.empty()) {
    // Every rank works the same suspects out of the same data.
    const std::vector<std::pair<int, int>> which =
        linksToConfirm(hostLinks(data, hosts), o.slow, {data.baseline, data.baselineFrom});
    if (!which.empty()) data.confirmed = d.confirm(hosts, which, 5);
  }
  for (const auto& order : ringOrders(hosts, n)) {
    if (!d.error.empty()) break;
    RingFigure rf = d.ring(order);
    rf.slowestHop = 1e30;
    for (std::size_t i = 0; i < order.size(); ++i)  // the hops measured
      if (const PairFigure& f = data.pairs.at(order[i], order[(i + 1) % order.size()]); f.measured)
        rf.slowestHop = std::min(rf.slowestHop, f.gbps);
    if (rf.slowestHop > 1e29) rf.slowestHop = 0;
    data.rings.push_back(rf);
  }
  std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  data.startedAt = when;
  int verdict = 0;
  if (!d.error.empty()) {
    std::fprintf(stderr, "braid doctor: rank %d: the measurement stopped: %s\n", d.rank, d.error.c_str());
    verdict = 2;
  } else if (d.rank == 0) {
    const std::vector<Finding> findings = analyse(data);
    std::fputs(textReport(data, findings).c_str(), stdout);
    std::fflush(stdout);
    if (!o.json.empty()) writeFile(o.json, jsonReport(data, findings));
    if (!o.svg.empty()) writeFile(o.svg, svgHeatmap(data));
    verdict = findings.empty() ? 0 : 1;
  }
  if (d.error.empty()) {
    // Rank 0 alone exits with the verdict; the others exit 0. A launcher (braid run, torchrun,
    // mpirun) stops every rank once one exits non-zero: a rank still in its destroy would then die
    // without a goodbye, and its peers would call that a failure. Rank 0's destroy returns once
    // every rank has called destroy (and so said its goodbyes); where rank 0 hosts the rendezvous
    // store, only once every rank has left it (under braid run, node 0's launcher hosts it and
    // serves the other hosts' ranks until they have left).
    if (braidCommDestroy(d.comm) != braidSuccess) {
      std::fprintf(stderr, "braid doctor: rank %d: destroy failed: %s\n", d.rank, braidGetLastError(d.comm));
      verdict = 2;
    }
  } else {
    braidCommAbort(d.comm);
  }
  return verdict;
}

}  // namespace braid::tools
