// braid tune: for a world of H hosts (ranks per host equal or not) and the link classes within and
// across hosts, what the tuner chooses per collective and size, the model's predicted time, and what
// the plans it would run actually do: each rank's plan built by the real builders (sim/, World::
// planOnly), the critical path in messages, the most messages a rank sends and the most bytes a
// host sends to the others. Nothing is sent: plans are built over address space never touched.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/algorithms/algorithms.h"
#include "comm/fingerprint.h"
#include "sim/sim.h"
#include "tools/json.h"
#include "tools/tools.h"

namespace braid::tools {
namespace {

const char* kTuneUsage =
    "usage: braid tune [--hosts H] [--per-host L | LO-HI] [--interleave] [--collectives LIST] [--sizes LIST]\n"
    "                  [--within shm|tcp|ib] [--across tcp|ib] [--max-messages N] [--json]\n"
    "  For H hosts of L ranks (LO-HI: host h holds LO + h mod (HI-LO+1)), prints per collective and size\n"
    "  what the tuner chooses (BRAID_ALGO, BRAID_CHUNKSIZE and BRAID_NSOCKS apply), the model's time,\n"
    "  and what the chosen plans do, counted on every rank's plan as the real builders make it:\n"
    "    path       the longest chain of dependent messages (the model's alpha steps)\n"
    "    msgs       the most messages one rank sends\n"
    "    host out   the most bytes one host sends to the other hosts, and that as a share of the call's bytes\n"
    "  --hosts 4 --per-host 8               the world (default: 4 hosts x 8)\n"
    "  --interleave                         ranks dealt to hosts in turn, as a round-robin launcher places them\n"
    "  --collectives allreduce,allgather,reducescatter,broadcast,reduce,barrier  (default: all but barrier)\n"
    "  --sizes 8,1K,64K,1M,16M,256M         the call's bytes (all-gather: its output; reduce-scatter: its input)\n"
    "  --within shm --across tcp            the transports whose link classes the tuner sees\n"
    "  --max-messages 20000000              plans posting more sends and receives in all are not built (\"-\")\n"
    "  --json                               one object, schema braid.tune/1\n";

struct Options {
  int hosts = 4, perHostLo = 8, perHostHi = 8;
  bool interleave = false, json = false;
  std::vector<std::string> collectives = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"};
  std::vector<std::size_t> sizes = {8, 1u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20};
  std::string within = "shm", across = "tcp";
  std::uint64_t maxMessages = 20000000;
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = std::min(s.find(',', start), s.size());
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

const std::map<std::string, CollKind> kKinds = {{"allreduce", CollKind::kAllReduce},   {"allgather", CollKind::kAllGather},
                                                 {"reducescatter", CollKind::kReduceScatter}, {"broadcast", CollKind::kBroadcast},
                                                 {"reduce", CollKind::kReduce},         {"barrier", CollKind::kBarrier}};

// Parses argv into *o; returns "" or what was wrong.
std::string parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&]() -> bool { if (v) ++i; return v != nullptr; };
    if (a == "--json") { o->json = true; continue; }
    if (a == "--interleave") { o->interleave = true; continue; }
    if (!need()) return a.rfind("--", 0) == 0 ? a + " needs a value" : "unknown argument '" + a + "'";
    const std::string value = v;
    if (a == "--hosts") {
      o->hosts = std::atoi(v);
      if (o->hosts < 1 || o->hosts > 100000) return "--hosts takes 1 to 100000";
    } else if (a == "--per-host") {
      const std::size_t dash = value.find('-');
      o->perHostLo = std::atoi(value.substr(0, dash).c_str());
      o->perHostHi = dash == std::string::npos ? o->perHostLo : std::atoi(value.substr(dash + 1).c_str());
      if (o->perHostLo < 1 || o->perHostHi < o->perHostLo || o->perHostHi > 1024) return "--per-host takes L or LO-HI, 1 to 1024";
    } else if (a == "--collectives") {
      o->collectives = splitList(value);
      for (const std::string& c : o->collectives)
        if (!kKinds.count(c)) return "unknown collective '" + c + "' (allreduce, allgather, reducescatter, broadcast, reduce, barrier)";
    } else if (a == "--sizes") {
      o->sizes.clear();
      for (const std::string& t : splitList(value)) {
        auto s = parseSize(t);
        if (!s.ok()) return "--sizes: " + s.status().message();
        o->sizes.push_back(*s);
      }
    } else if (a == "--within" || a == "--across") {
      if (value != "shm" && value != "tcp" && value != "ib") return a + " takes shm, tcp or ib";
      (a == "--within" ? o->within : o->across) = value;
    } else if (a == "--max-messages") {
      auto s = parseSize(value);
      if (!s.ok() || *s == 0) return "--max-messages takes a count > 0";
      o->maxMessages = *s;
    } else {
      return "unknown option '" + a + "'";
    }
  }
  if (static_cast<long long>(o->hosts) * o->perHostHi > 1000000) return "at most 1,000,000 ranks";
  return "";
}

struct Row {
  std::string collective;
  std::size_t count = 0, bytes = 0;
  TunerChoice choice{};
  bool built = false;
  std::uint64_t messages = 0;  // in all plans (when not built: World::planOnly's estimate)
  std::string error;           // the plans could not be built (their buffers' address space)
  int path = 0;
  std::uint64_t mostRankMessages = 0, mostHostOut = 0;
};

std::string sizeText(std::size_t b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 4 && static_cast<std::size_t>(v) % 1024 == 0) v /= 1024, ++u;
  char out[32];
  std::snprintf(out, sizeof(out), "%g %s", v, unit[u]);
  return out;
}

std::string linkText(const std::string& name, const LinkClass& l) {
  char out[96];
  std::snprintf(out, sizeof(out), "%s (%g us, %g B/us)", name.c_str(), l.latencyUs, l.bytesPerUs);
  return out;
}

Row measure(sim::World& w, const std::string& collective, std::size_t size, std::uint64_t maxMessages) {
  const int n = w.nranks();
  Row row;
  row.collective = collective;
  CollArgs a;
  a.kind = kKinds.at(collective);
  a.dtype = DataType::kFloat32;
  a.op = ReduceOp::kSum;
  a.root = 0;
  const std::size_t perRank = a.kind == CollKind::kAllGather || a.kind == CollKind::kReduceScatter ? static_cast<std::size_t>(n) : 1;
  a.count = a.kind == CollKind::kBarrier ? 0 : std::max<std::size_t>(size / 4 / perRank, 1);
  row.count = a.count;
  row.bytes = callBytes(a, n);
  row.choice = w.choose(a.kind, row.bytes);
  w.resetCounts();
  auto total = w.planOnly(a, row.choice.algo, row.choice.channels, row.choice.chunk, maxMessages);
  row.messages = total.ok() ? *total : 0;
  if (!total.ok()) row.error = total.status().message();
  row.built = total.ok() && *total <= maxMessages;
  if (!row.built) return row;
  row.path = w.criticalPath();
  std::vector<std::uint64_t> rankMsgs(static_cast<std::size_t>(n), 0), hostOut(w.layout().hosts.size(), 0);
  for (const auto& [pair, l] : w.links()) {
    rankMsgs[static_cast<std::size_t>(pair.first)] += l.messages;
    const int from = w.layout().hostOf[static_cast<std::size_t>(pair.first)], to = w.layout().hostOf[static_cast<std::size_t>(pair.second)];
    if (from != to) hostOut[static_cast<std::size_t>(from)] += l.bytes;
  }
  row.mostRankMessages = *std::max_element(rankMsgs.begin(), rankMsgs.end());
  row.mostHostOut = *std::max_element(hostOut.begin(), hostOut.end());
  return row;
}

}  // namespace

int runTune(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::fputs(kTuneUsage, stdout);
      return 0;
    }
  const std::string bad = parse(argc, argv, &o);
  if (!bad.empty()) {
    std::fprintf(stderr, "braid tune: %s\n%s", bad.c_str(), kTuneUsage);
    return 2;
  }
  auto config = Config::fromEnvironment();
  if (!config.ok()) {
    std::fprintf(stderr, "braid tune: %s\n", config.status().toString().c_str());
    return 2;
  }
  sim::Topology t;
  for (int h = 0; h < o.hosts; ++h) t.hostSizes.push_back(o.perHostLo + h % (o.perHostHi - o.perHostLo + 1));
  t.interleave = o.interleave;
  sim::World w(t);
  const LinkClass within = sim::linkClassOf(o.within, true, *config), across = sim::linkClassOf(o.across, false, *config);
  w.setLinks(within, across, *config);
  const int n = w.nranks();

  std::vector<Row> rows;
  for (const std::string& c : o.collectives) {
    if (c == "barrier") {
      rows.push_back(measure(w, c, 0, o.maxMessages));
      continue;
    }
    for (std::size_t size : o.sizes) {
      Row r = measure(w, c, size, o.maxMessages);
      // (all-gather and reduce-scatter round a size up to one element a rank: one row for each)
      if (rows.empty() || rows.back().collective != c || rows.back().bytes != r.bytes) rows.push_back(r);
    }
  }

  if (o.json) {
    std::printf("{\"schema\": \"braid.tune/1\", \"ranks\": %d, \"hosts\": %d, \"topology\": %s, \"within\": %s, \"across\": %s, "
                "\"max_messages\": %llu, \"rows\": [",
                n, o.hosts, jsonString(t.describe()).c_str(), jsonString(linkText(o.within, within)).c_str(),
                jsonString(linkText(o.across, across)).c_str(), static_cast<unsigned long long>(o.maxMessages));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s\n  {\"collective\": \"%s\", \"count\": %zu, \"bytes\": %zu, \"algo\": \"%s\", \"channels\": %d, \"chunk\": %zu, "
                  "\"model_us\": %.3f, \"built\": %s, \"messages\": %llu",
                  i ? "," : "", r.collective.c_str(), r.count, r.bytes, algoName(r.choice.algo), r.choice.channels, r.choice.chunk,
                  r.choice.predictedUs, r.built ? "true" : "false", static_cast<unsigned long long>(r.messages));
      if (!r.error.empty()) std::printf(", \"error\": %s", jsonString(r.error).c_str());
      if (r.built)
        std::printf(", \"path\": %d, \"most_rank_messages\": %llu, \"most_host_out_bytes\": %llu", r.path,
                    static_cast<unsigned long long>(r.mostRankMessages), static_cast<unsigned long long>(r.mostHostOut));
      std::printf("}");
    }
    std::printf("\n]}\n");
    return 0;
  }
  std::printf("# braid tune: %s = %d ranks; within hosts %s, across %s; float32 sum, root 0\n", t.describe().c_str(), n,
              linkText(o.within, within).c_str(), linkText(o.across, across).c_str());
  std::printf("# model: the tuner's time for its choice. path, msgs, host out: counted on every rank's plan (braid tune --help)\n");
  std::printf("%-14s %10s %-8s %3s %8s %12s %7s %8s %14s %7s\n", "collective", "size", "algo", "ch", "chunk", "model(us)", "path",
              "msgs", "host out(B)", "/size");
  for (const Row& r : rows) {
    std::printf("%-14s %10s %-8s %3d %8zu %12.1f ", r.collective.c_str(), sizeText(r.bytes).c_str(), algoName(r.choice.algo),
                r.choice.channels, r.choice.chunk, r.choice.predictedUs);
    if (!r.built && !r.error.empty()) {
      std::printf("%7s %8s %14s %7s  (not built: %s)\n", "-", "-", "-", "-", r.error.c_str());
      continue;
    }
    if (!r.built) {
      std::printf("%7s %8s %14s %7s  (about %llu sends and receives in all, over --max-messages)\n", "-", "-", "-", "-",
                  static_cast<unsigned long long>(r.messages));
      continue;
    }
    std::printf("%7d %8llu %14llu %7.3f\n", r.path, static_cast<unsigned long long>(r.mostRankMessages),
                static_cast<unsigned long long>(r.mostHostOut), r.bytes ? static_cast<double>(r.mostHostOut) / static_cast<double>(r.bytes) : 0.0);
  }
  return 0;
}

}  // namespace braid::tools
