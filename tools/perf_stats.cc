#include "tools/perf_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "tools/json.h"

namespace braid::tools {

const char* timeOfName(TimeOf t) {
  switch (t) {
    case TimeOf::kRank0: return "rank 0's mean";
    case TimeOf::kAverage: return "the average of the ranks' means";
    case TimeOf::kMinimum: return "the fastest rank's mean";
    case TimeOf::kMaximum: return "the slowest rank's mean";
  }
  return "?";
}

double combineRanks(TimeOf t, const std::vector<double>& perRank) {
  if (perRank.empty()) return 0;
  switch (t) {
    case TimeOf::kRank0: return perRank[0];
    case TimeOf::kMinimum: return *std::min_element(perRank.begin(), perRank.end());
    case TimeOf::kMaximum: return *std::max_element(perRank.begin(), perRank.end());
    case TimeOf::kAverage: break;
  }
  double sum = 0;
  for (double v : perRank) sum += v;
  return sum / static_cast<double>(perRank.size());
}

double percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank: the ceil(p * N)-th smallest (1-based), at least the first.
  const double want = std::ceil(p * static_cast<double>(sorted.size()) - 1e-9);
  const std::size_t k = static_cast<std::size_t>(std::clamp(want, 1.0, static_cast<double>(sorted.size())));
  return sorted[k - 1];
}

IterStats iterStats(const std::vector<double>& times, std::size_t skip) {
  IterStats s;
  if (skip >= times.size()) return s;
  std::vector<double> v(times.begin() + static_cast<std::ptrdiff_t>(skip), times.end());
  std::sort(v.begin(), v.end());
  s.samples = v.size();
  s.min = v.front();
  s.max = v.back();
  s.p50 = percentile(v, 0.50);
  s.p99 = percentile(v, 0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  const double sd = std::sqrt(sq / static_cast<double>(v.size()));
  s.cv = s.mean > 0 ? sd / s.mean : 0;
  return s;
}

Straggler findStraggler(const std::vector<std::vector<double>>& perSize) {
  Straggler st;
  std::map<int, int> wins;
  std::map<int, std::vector<double>> ratios;
  for (const std::vector<double>& ranks : perSize) {
    if (ranks.empty()) continue;
    ++st.sizes;
    const int slow = static_cast<int>(std::max_element(ranks.begin(), ranks.end()) - ranks.begin());
    std::vector<double> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    const double median = percentile(sorted, 0.5);
    ++wins[slow];
    ratios[slow].push_back(median > 0 ? ranks[static_cast<std::size_t>(slow)] / median : 1.0);
  }
  for (const auto& [rank, k] : wins)  // ascending ranks: the lower one wins a tie
    if (k > st.slowestIn) st.rank = rank, st.slowestIn = k;
  if (st.rank >= 0) {
    std::vector<double>& r = ratios[st.rank];
    std::sort(r.begin(), r.end());
    st.ratio = percentile(r, 0.5);
  }
  return st;
}

double busbwFloor(const std::string& coll, int n, int hosts, int perHost, double copyGBps, double reduceGBps,
                  double linkGBps) {
  (void)reduceGBps;  // (measured and reported; the floor counts memory traffic, see the header)
  if (coll == "barrier" || n < 2) return 0;
  const double N = n;
  // Bytes each rank must read and write per byte of busbw, at 2 x copy (a copy reads and writes).
  double traffic = 2;                                                  // all-gather, all-to-all
  if (coll == "reducescatter") traffic = (1 + 1 / N) / ((N - 1) / N);  // read its slice of n inputs, write it
  else if (coll == "allreduce") traffic = (3 - 1 / N) / (2 * (N - 1) / N);  // reduce-scatter, then all-gather
  else if (coll == "reduce") traffic = (N + 1) / N;                    // n inputs read, one output, over n ranks
  else if (coll == "broadcast") traffic = 2 * (N - 1) / N;             // n-1 ranks copy the array
  else if (coll == "sendrecv") traffic = 2 * (n / 2) / N;              // the n/2 receivers copy it
  const double mem = 2 * copyGBps / traffic;
  if (hosts < 2 || linkGBps <= 0) return mem;
  const double H = hosts, k = std::max(1, perHost);
  // busbw's bytes per rank over the bytes that must cross into (or out of) the busiest host.
  double share = 1;  // broadcast, reduce, sendrecv: the whole array
  if (coll == "allreduce" || coll == "allgather" || coll == "reducescatter") share = (N - 1) / N / ((H - 1) / H);
  else if (coll == "alltoall") share = (N - 1) / N / (k * (N - k) / N);
  return std::min(mem, linkGBps * share);
}

int Split::colorOf(int rank) const {
  switch (op) {
    case kAnd: return static_cast<int>(rank & value);
    case kOr: return static_cast<int>(rank | value);
    case kMod: return static_cast<int>(rank % value);
    case kDiv: return static_cast<int>(rank / value);
    case kNone: break;
  }
  return 0;
}

std::string Split::text() const {
  const char* names[] = {"", "AND", "OR", "MOD", "DIV"};
  char b[48];
  std::snprintf(b, sizeof(b), "%s %ld", names[op], value);
  return op == kNone ? "" : b;
}

bool parseSplit(const std::string& text, Split* out, std::string* error) {
  *out = Split();
  std::istringstream in(text);
  std::string op, value, rest;
  if (!(in >> op)) return true;  // empty: no split
  if (!(in >> value) || (in >> rest)) {
    *error = "--split takes OP VALUE, e.g. \"MOD 2\" (OP: AND, OR, MOD, DIV)";
    return false;
  }
  for (char& c : op) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (op == "AND" || op == "&") out->op = Split::kAnd;
  else if (op == "OR" || op == "|") out->op = Split::kOr;
  else if (op == "MOD" || op == "%") out->op = Split::kMod;
  else if (op == "DIV" || op == "/") out->op = Split::kDiv;
  else {
    *error = "--split: unknown operation '" + op + "' (AND, OR, MOD, DIV)";
    return false;
  }
  char* end = nullptr;
  out->value = std::strtol(value.c_str(), &end, 0);  // 0x1 and 7 alike
  if (!end || *end || value.empty() || out->value < 0 || out->value > (1L << 30) ||
      ((out->op == Split::kMod || out->op == Split::kDiv) && out->value == 0)) {
    *error = "--split: '" + value + "' is not a usable value for " + op + (out->value == 0 ? " (not 0)" : "");
    return false;
  }
  return true;
}

bool loadCompareRun(const std::string& path, CompareRun* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  auto doc = parseJson(buf.str());
  if (!doc.ok() || doc->type != Json::kObject) {
    *error = path + " is not JSON" + (doc.ok() ? "" : ": " + doc.status().message());
    return false;
  }
  const std::string schema = strOf(doc->get("schema"));
  const Json* rows = doc->get("rows");
  // (files from before the schema member say only "tool")
  const bool perf = schema.rfind("braid.perf/", 0) == 0 || (schema.empty() && strOf(doc->get("tool")) == "braid perf");
  if (!perf || !rows || rows->type != Json::kArray) {
    *error = path + " was not written by braid perf --json (no braid.perf schema and rows)";
    return false;
  }
  out->rows.clear();
  for (const Json& r : rows->items) {
    const Json* cell = r.get("out_of_place");
    if (!cell || !r.get("size") || !cell->get("busbw_gbps")) {
      *error = path + ": a row lacks size or out_of_place.busbw_gbps";
      return false;
    }
    CompareRow row;
    row.size = static_cast<std::size_t>(uintOf(r.get("size")));
    row.type = strOf(r.get("type"));
    row.op = strOf(r.get("redop"));
    row.root = static_cast<int>(intOf(r.get("root"), -1));
    row.busbw = {doubleOf(cell->get("busbw_gbps"))};
    row.timeUs = {doubleOf(cell->get("time_us"))};
    out->rows.push_back(row);
  }
  out->collective = strOf(doc->get("collective"));
  out->nranks = static_cast<int>(intOf(doc->get("nranks")));
  if (const Json* st = doc->get("settings")) {
    out->transport = strOf(st->get("transport"));
    out->mem = strOf(st->get("mem"));
  }
  out->label = path + " (" + out->collective + ", " + std::to_string(out->nranks) + " ranks, " + strOf(doc->get("host")) +
               ", " + strOf(doc->get("commit")) + ")";
  return true;
}

std::string compareTable(const std::vector<CompareRun>& runs) {
  using Key = std::tuple<std::string, std::string, int, std::size_t>;  // type, op, root, size
  std::map<Key, std::vector<const CompareRow*>> rows;
  for (std::size_t k = 0; k < runs.size(); ++k)
    for (const CompareRow& r : runs[k].rows) {
      auto& slot = rows[Key{r.type, r.op, r.root, r.size}];
      slot.resize(runs.size(), nullptr);
      if (!slot[k]) slot[k] = &r;  // the first row of a size in a run (sweeps over -d all keep types apart)
    }
  std::string out;
  char line[256];
  for (std::size_t k = 0; k < runs.size(); ++k) out += "# [" + std::to_string(k + 1) + "] " + runs[k].label + "\n";
  out += "#\n";
  std::snprintf(line, sizeof(line), "# %10s %8s %6s %5s", "size (B)", "type", "redop", "root");
  out += line;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    char us[32];
    std::snprintf(us, sizeof(us), "[%zu] us", k + 1);
    std::snprintf(line, sizeof(line), k ? " %9s %9s %7s" : " %9s %9s", us, "busbw", "x[1]");
    out += line;
  }
  out += "\n";
  std::vector<double> logSum(runs.size(), 0);
  std::vector<int> ratios(runs.size(), 0);
  for (const auto& [key, slot] : rows) {
    std::snprintf(line, sizeof(line), "  %10zu %8s %6s %5d", std::get<3>(key), std::get<0>(key).c_str(),
                  std::get<1>(key).c_str(), std::get<2>(key));
    out += line;
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const CompareRow* r = slot[k];
      if (r) std::snprintf(line, sizeof(line), " %9.2f %9.3f", r->timeUs[0], r->busbw[0]);
      else std::snprintf(line, sizeof(line), " %9s %9s", "-", "-");
      out += line;
      if (!k) continue;
      const CompareRow* base = slot[0];
      if (r && base && base->busbw[0] > 0 && r->busbw[0] > 0) {
        const double ratio = r->busbw[0] / base->busbw[0];
        std::snprintf(line, sizeof(line), " %7.3f", ratio);
        logSum[k] += std::log(ratio);
        ++ratios[k];
      } else {
        std::snprintf(line, sizeof(line), " %7s", "-");
      }
      out += line;
    }
    out += "\n";
  }
  for (std::size_t k = 1; k < runs.size(); ++k) {
    if (!ratios[k]) continue;
    std::snprintf(line, sizeof(line), "# [%zu] over [1]: busbw x%.3f (geometric mean over %d sizes with busbw in both)\n",
                  k + 1, std::exp(logSum[k] / ratios[k]), ratios[k]);
    out += line;
  }
  return out;
}

}  // namespace braid::tools
