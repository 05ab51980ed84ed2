#include "tools/perf_report.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <map>

#include "comm/introspect.h"
#include "tools/json.h"
#include "tools/tools.h"
#include "topology/topology.h"

namespace braid::tools {

namespace {

// -c 0 checks nothing: the count of wrong elements is unknown (nccl-tests prints N/A), never 0.
std::string wrongText(std::uint64_t wrong, bool checked, const char* unknown) {
  return checked ? std::to_string(wrong) : unknown;
}

std::string cellJson(const PerfCell& c, bool checked) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "{\"time_us\": %.3f, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, \"wrong\": %s",
                c.timeUs, c.algbw, c.busbw, wrongText(c.wrong, checked, "null").c_str());
  std::string out = buf;
  if (c.floorShare >= 0) {
    std::snprintf(buf, sizeof(buf), ", \"floor_share\": %.4f", c.floorShare);
    out += buf;
  }
  if (c.iters.samples) {
    std::snprintf(buf, sizeof(buf), ", \"iterations\": {\"samples\": %zu, \"min_us\": %.3f, \"p50_us\": %.3f, "
                  "\"p99_us\": %.3f, \"max_us\": %.3f, \"cv\": %.4f}", c.iters.samples, c.iters.min, c.iters.p50,
                  c.iters.p99, c.iters.max, c.iters.cv);
    out += buf;
  }
  auto list = [&](const char* name, const std::vector<double>& v) {
    if (v.empty()) return;
    out += std::string(", \"") + name + "\": [";
    for (std::size_t r = 0; r < v.size(); ++r) {
      std::snprintf(buf, sizeof(buf), "%s%.3f", r ? ", " : "", v[r]);
      out += buf;
    }
    out += "]";
  };
  list("per_rank_us", c.perRankUs);
  list("per_rank_busy_us", c.perRankBusyUs);
  return out + "}";
}

// %floor as a share of the floor ("0.82"), or N/A where the row has none.
std::string shareText(double share) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", share);
  return share < 0 ? "N/A" : b;
}

std::string gbpsText(double gbps) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", gbps);
  return b;
}

// "min 10.1 p50 11.0 p99 14.2 max 15.0 us, cv 3.2%"
std::string statsText(const IterStats& s) {
  char b[160];
  std::snprintf(b, sizeof(b), "min %.2f p50 %.2f p99 %.2f max %.2f us, cv %.1f%%", s.min, s.p50, s.p99, s.max, s.cv * 100);
  return b;
}
}  // namespace

std::vector<std::string> transportLines(braidComm_t comm, int rank, int nranks) {
  // One fixed-size line per rank: its host and the transports to its peers, the peers connected
  // when the communicator was created first, then those left for first use (BRAID_CONNECT).
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::map<std::string, int> counts, later;
  const CommView view(comm);
  for (int p = 0; p < nranks; ++p)
    if (p != rank) (view.connected(p) ? counts : later)[view.transportTo(p)]++;
  std::string line = "rank " + std::to_string(rank) + " on " + host + ":";
  for (auto& [name, k] : counts) line += " " + name + " x" + std::to_string(k);
  for (auto& [name, k] : later) line += " (" + name + " x" + std::to_string(k) + " on first use)";
  if (counts.empty() && later.empty()) line += " no peers";
  line += "; cpus " + topology::cpuListText(topology::allowedCpus());  // what braid run pinned the rank to
  constexpr std::size_t kWidth = 128;
  std::vector<char> mine(kWidth, 0), all(kWidth * static_cast<std::size_t>(nranks), 0);
  std::snprintf(mine.data(), kWidth, "%s", line.c_str());
  if (braidAllGather(mine.data(), all.data(), kWidth, braidUint8, comm, nullptr) != braidSuccess) return {};
  std::vector<std::string> lines;
  for (int r = 0; r < nranks; ++r) lines.emplace_back(all.data() + static_cast<std::size_t>(r) * kWidth);
  return lines;
}

PerfHeader describeRun(braidComm_t comm, int rank, int nranks, const PerfOptions& o, const char* commit, const char* isa) {
  PerfHeader h;
  h.options = o;
  h.nranks = nranks;
  h.commit = commit;
  h.isa = isa;
  h.algo = describeAlgoSetting();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  h.host = host;
  std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  h.startedAt = when;
  std::vector<std::string> lines = transportLines(comm, rank, nranks);
  h.transports = lines;
  const PerfReport names(h);
  std::map<std::string, int> hosts;
  for (int r = 0; r < static_cast<int>(lines.size()); ++r)
    if (std::string host = names.hostOf(r); !host.empty()) hosts[host]++;
  h.hosts = static_cast<int>(hosts.size());
  return h;
}

void PerfReport::printHeader() const {
  const PerfOptions& o = h_.options;
  std::printf("# braid perf %s: %d ranks on %d host(s), iters %d, warmup %d, validation %d, root %d, memory %s\n",
              o.coll.c_str(), h_.nranks, h_.hosts, o.iters, o.warmup, o.check, o.root,
              o.device == "cuda" ? ("cuda device: " + o.deviceName).c_str() : o.mem.c_str());
  std::printf("# algorithm: %s; reduce kernels: %s; copies: %s; commit %s\n", h_.algo.c_str(), h_.isa.c_str(),
              h_.copies.c_str(), h_.commit.c_str());
  std::printf("# time: %s per call, %s (-a %d)%s%s%s%s%s\n", o.cputime ? "CPU time" : "wall time",
              timeOfName(o.timeOf), static_cast<int>(o.timeOf),
              o.graphs ? (", " + std::to_string(o.graphs) + " launches of a CUDA graph of the iterations' calls").c_str() : "",
              o.agg > 1 ? (", " + std::to_string(o.agg) + " calls per timed iteration").c_str() : "",
              o.blocking ? ", each call waited for" : "", o.misalign ? (", buffers " + std::to_string(o.misalign) + " B past 64 B").c_str() : "",
              o.perIteration() ? (", statistics without the first " + std::to_string(o.skip) + " iteration(s)").c_str() : "");
  if (o.split.op != Split::kNone)
    std::printf("# split %s: %d parallel communicators, rank 0's of %d ranks; every group times its calls at once\n",
                o.split.text().c_str(), h_.groups, h_.groupRanks);
  if (o.floor)
    std::printf("# floor: memory, each rank's copy and reduce at each size with every rank at once%s\n",
                h_.linkPairs ? (("; links between hosts: " + gbpsText(h_.linkGBps) + " GB/s each way, the slowest host's streams across together (" +
                                 std::to_string(h_.linkPairs) + " rank pair(s) streaming " + std::to_string(h_.linkBytes >> 20) +
                                 " MiB both ways at once)").c_str())
                             : "; one host: no link between hosts");
  for (const std::string& t : h_.transports) std::printf("#   %s\n", t.c_str());
  // The floor's column after each group's #wrong (with --floor only: the table is nccl-tests' otherwise).
  const char* f = o.floor ? " %7s" : "%.0s";
  const std::string line = std::string("# %10s %12s %8s %6s %6s %9s %8s %8s %6s") + f + " %9s %8s %8s %6s" + f + "\n";
  std::printf("#\n");
  std::printf(line.c_str(), "", "", "", "", "", "out-of-place", "", "", "", "", "in-place", "", "", "", "");
  std::printf(line.c_str(), "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "%floor", "time",
              "algbw", "busbw", "#wrong", "%floor");
  std::printf(line.c_str(), "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)",
              "(GB/s)", "", "");
  std::fflush(stdout);
}

void PerfReport::addRow(const PerfRow& r) {
  const bool checked = h_.options.check != 0;
  const char* f = h_.options.floor ? " %7s" : "%.0s";
  const std::string line = std::string("  %10zu %12zu %8s %6s %6d %9.2f %8.2f %8.2f %6s") + f + " %9.2f %8.2f %8.2f %6s" + f + "\n";
  std::printf(line.c_str(), r.bytes, r.count, r.type.c_str(), r.op.c_str(), r.root, r.out.timeUs, r.out.algbw, r.out.busbw,
              wrongText(r.out.wrong, checked, "N/A").c_str(), shareText(r.out.floorShare).c_str(), r.in.timeUs, r.in.algbw,
              r.in.busbw, wrongText(r.in.wrong, checked, "N/A").c_str(), shareText(r.in.floorShare).c_str());
  if (r.out.iters.samples)
    std::printf("#   iterations: out-of-place %s; in-place %s\n", statsText(r.out.iters).c_str(), statsText(r.in.iters).c_str());
  if (!r.out.perRankBusyUs.empty()) {
    const Straggler s = findStraggler({r.out.perRankBusyUs});
    const std::string host = hostOf(s.rank);
    const auto k = static_cast<std::size_t>(s.rank);
    std::printf("#   slowest rank %d%s: busy %.2f us per call (median; its mean time %.2f us), %.2fx the median rank's busy time\n",
                s.rank, host.empty() ? "" : (" (host " + host + ")").c_str(), r.out.perRankBusyUs[k], r.out.perRankUs[k], s.ratio);
  }
  std::fflush(stdout);
  busSum_ += r.out.busbw + r.in.busbw;
  busCount_ += 2;
  rows_.push_back(r);
}

void PerfReport::printFooter(std::uint64_t wrong) const {
  if (h_.options.check == 0)
    std::printf("# Out of bounds values : N/A (not checked: -c 0)\n");
  else
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong), wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n", busCount_ ? busSum_ / busCount_ : 0.0);
  if (h_.options.perIteration()) {
    const Straggler s = straggler();
    const std::string host = hostOf(s.rank);
    if (s.rank >= 0)
      std::printf("# Straggler            : rank %d%s, slowest in %d of %d sizes, busy %.2fx the median rank's\n", s.rank,
                  host.empty() ? "" : (" (host " + host + ")").c_str(), s.slowestIn, s.sizes, s.ratio);
  }
  std::printf("#\n");
}

std::string PerfReport::hostOf(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= h_.transports.size()) return "";
  const std::string& l = h_.transports[static_cast<std::size_t>(rank)];  // "rank R on HOST: ..."
  const std::size_t on = l.find(" on "), colon = l.find(':', on == std::string::npos ? 0 : on);
  return on == std::string::npos || colon == std::string::npos ? "" : l.substr(on + 4, colon - on - 4);
}

// Over every row's out-of-place per-rank medians.
Straggler PerfReport::straggler() const {
  std::vector<std::vector<double>> sizes;
  for (const PerfRow& r : rows_)
    if (!r.out.perRankBusyUs.empty()) sizes.push_back(r.out.perRankBusyUs);
  return findStraggler(sizes);
}

bool PerfReport::writeJson(const std::string& path, std::uint64_t wrong) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const PerfOptions& o = h_.options;
  std::fprintf(f, "{\n  \"schema\": \"braid.perf/2\",\n  \"tool\": \"braid perf\",\n  \"collective\": %s,\n  \"nranks\": %d,\n  \"hosts\": %d,\n",
               jsonString(o.coll).c_str(), h_.nranks, h_.hosts);
  std::fprintf(f, "  \"host\": %s,\n  \"commit\": %s,\n  \"started_at\": %s,\n  \"algorithm\": %s,\n  \"reduce_isa\": %s,\n  \"copies\": %s,\n",
               jsonString(h_.host).c_str(), jsonString(h_.commit).c_str(), jsonString(h_.startedAt).c_str(),
               jsonString(h_.algo).c_str(), jsonString(h_.isa).c_str(), jsonString(h_.copies).c_str());
  std::fprintf(f, "  \"settings\": {\"iters\": %d, \"warmup\": %d, \"check\": %d, \"root\": %d, \"transport\": %s, "
               "\"mem\": %s, \"device\": %s, \"time_of\": %d, \"agg_iters\": %d, \"blocking\": %d, \"cputime\": %d, "
               "\"timeout_s\": %g, \"misalign\": %zu, \"iter_stats\": %d, \"skip\": %d, \"per_rank\": %s, \"split\": %s, "
               "\"groups\": %d, \"graph_launches\": %d},\n", o.iters, o.warmup, o.check, o.root,
               jsonString(o.transport.empty() ? "auto" : o.transport).c_str(), jsonString(o.mem).c_str(),
               jsonString(o.device == "cuda" ? "cuda " + o.deviceName : "host").c_str(), static_cast<int>(o.timeOf), o.agg,
               o.blocking, o.cputime, o.timeoutSec, o.misalign, o.iterStats, o.skip, o.perIteration() ? "true" : "false",
               o.split.op == Split::kNone ? "null" : jsonString(o.split.text()).c_str(), h_.groups, o.graphs);
  std::fprintf(f, "  \"transports\": [");
  for (std::size_t i = 0; i < h_.transports.size(); ++i)
    std::fprintf(f, "%s%s", i ? ", " : "", jsonString(h_.transports[i]).c_str());
  std::fprintf(f, "],\n  \"rows\": [\n");
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const PerfRow& r = rows_[i];
    char floors[160] = "";
    if (o.floor)
      std::snprintf(floors, sizeof(floors), ", \"floor_gbps\": %.6g, \"copy_gbps\": %.6g, \"reduce_gbps\": %.6g", r.floorGBps,
                    r.copyGBps, r.reduceGBps);
    std::fprintf(f, "    {\"size\": %zu, \"count\": %zu, \"type\": %s, \"redop\": %s, \"root\": %d%s, \"out_of_place\": %s, "
                    "\"in_place\": %s}%s\n",
                 r.bytes, r.count, jsonString(r.type).c_str(), jsonString(r.op).c_str(), r.root, floors,
                 cellJson(r.out, o.check != 0).c_str(), cellJson(r.in, o.check != 0).c_str(), i + 1 < rows_.size() ? "," : "");
  }
  std::string straggling = "null";
  if (const Straggler s = straggler(); o.perIteration() && s.rank >= 0) {
    char b[200];
    std::snprintf(b, sizeof(b), "{\"rank\": %d, \"host\": %s, \"slowest_in\": %d, \"sizes\": %d, \"ratio\": %.4f}", s.rank,
                  jsonString(hostOf(s.rank)).c_str(), s.slowestIn, s.sizes, s.ratio);
    straggling = b;
  }
  std::string floor = "null";
  if (o.floor) {
    char b[160];
    std::snprintf(b, sizeof(b), "{\"link_gbps\": %.6g, \"link_pairs\": %d, \"link_bytes\": %zu}", h_.linkGBps, h_.linkPairs,
                  h_.linkBytes);
    floor = b;
  }
  std::fprintf(f, "  ],\n  \"wrong\": %s,\n  \"avg_busbw_gbps\": %.4f,\n  \"straggler\": %s,\n  \"floor\": %s\n}\n",
               wrongText(wrong, o.check != 0, "null").c_str(), busCount_ ? busSum_ / busCount_ : 0.0, straggling.c_str(),
               floor.c_str());
  return std::fclose(f) == 0;
}

}  // namespace braid::tools
