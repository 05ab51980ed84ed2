// `braid doctor`'s outputs: the text report rank 0 prints, --json (everything), --svg (a heatmap of
// the pair bandwidth matrix).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "tools/doctor.h"
#include "tools/json.h"

namespace braid::tools::doctor {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string limitText(std::uint64_t v) { return v == kUnlimited ? "unlimited" : std::to_string(v); }

// The report prints the ranks' matrices (and a line per rank) up to this many ranks, else the
// hosts' up to this many hosts; lists this many links between hosts at most (the slowest); and
// details every host's local checks up to this many hosts. --json has everything.
constexpr int kRankMatrixUpTo = 16, kHostMatrixUpTo = 48;
constexpr std::size_t kLinksListedUpTo = 32, kHostsDetailedUpTo = 8;

// A square matrix of ranks (or hosts) with one cell per pair.
template <typename Cell>
void matrix(std::ostringstream& o, int n, int width, Cell cell) {
  o << "    " << std::string(5, ' ');
  for (int b = 0; b < n; ++b) {
    const std::string c = std::to_string(b);
    o << std::string(static_cast<std::size_t>(std::max<int>(0, width - static_cast<int>(c.size()))), ' ') << c;
  }
  o << '\n';
  for (int a = 0; a < n; ++a) {
    o << "    " << fmt("%4.0f ", a);
    for (int b = 0; b < n; ++b) {
      std::string c = a == b ? "." : cell(a, b);
      o << std::string(static_cast<std::size_t>(std::max<int>(0, width - static_cast<int>(c.size()))), ' ') << c;
    }
    o << '\n';
  }
}

}  // namespace

std::string textReport(const Data& d, const std::vector<Finding>& findings) {
  std::ostringstream o;
  const HostLayout h = layOut(d.ranks);
  const int n = static_cast<int>(d.ranks.size());
  o << "braid doctor: " << n << " ranks on " << h.names.size() << " host(s), " << d.startedAt << ", " << d.version << "\n";
  for (std::size_t k = 0; k < h.names.size(); ++k) o << "  " << h.names[k] << ": " << rankText(h.ranks[k]) << "\n";

  // A pair left for first use (BRAID_CONNECT) shows its transport with a star: it connects when a
  // call first needs it (the measurement below did).
  auto later = [&](int a, int b) {
    const auto& c = d.ranks[a].connectedTo;
    return static_cast<std::size_t>(b) < c.size() && !c[b];
  };
  if (n <= kRankMatrixUpTo) {
    o << "\n1. Transports (row: rank, column: peer; *: connected on first use, not when the communicator was made)\n";
    matrix(o, n, 6, [&](int a, int b) { return d.choice(a, b).transport + (later(a, b) ? "*" : ""); });
  } else {
    std::map<std::string, std::pair<long, long>> counts;  // transport -> (pairs, of them connected at creation)
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        auto& c = counts[d.choice(a, b).transport];
        ++c.first;
        c.second += !later(a, b);
      }
    o << "\n1. Transports, pairs of ranks (--json has each pair):";
    for (auto& [t, c] : counts)
      o << " " << t << " " << c.first << " (" << c.second << " connected when the communicator was made, the rest on first use)";
    o << "\n";
  }
  // Pairs by the reason the transports before theirs were skipped. Past kRankMatrixUpTo ranks,
  // reasons that differ only in numbers (ranks, hosts like braid-h3) count as one, shown with N and
  // the first pair's text.
  auto general = [&](const std::string& reason) {
    if (n <= kRankMatrixUpTo) return reason;
    std::string g;
    for (std::size_t i = 0; i < reason.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(reason[i]))) {
        g += reason[i];
        continue;
      }
      g += 'N';
      while (i + 1 < reason.size() && std::isdigit(static_cast<unsigned char>(reason[i + 1]))) ++i;
    }
    return g;
  };
  std::map<std::string, std::pair<std::vector<std::string>, std::string>> why;  // reason -> (pairs, first pair's text)
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (const PairChoice c = d.choice(a, b); !c.skipped.empty()) {
        auto& [pairs, first] = why[c.transport + " because " + general(c.skipped)];
        if (pairs.empty()) first = c.skipped;
        pairs.push_back(std::to_string(a) + "–" + std::to_string(b));
      }
  if (!why.empty()) o << "  why not the others:\n";
  for (auto& [reason, seen] : why) {
    const auto& [pairs, first] = seen;
    std::string list;
    for (std::size_t i = 0; i < pairs.size() && i < 8; ++i) list += (i ? " " : "") + pairs[i];
    if (pairs.size() > 8) list += " and " + std::to_string(pairs.size() - 8) + " more";
    o << "    " << list << ": " << reason << (n <= kRankMatrixUpTo ? "" : " (the first: " + first + ")") << "\n";
  }

  // Every host's checks up to kHostsDetailedUpTo hosts; beyond, the first host's and those of the
  // hosts a finding names (--json has every host's).
  const bool everyHost = h.names.size() <= kHostsDetailedUpTo;
  auto named = [&](const std::string& host) {
    for (const Finding& f : findings)
      for (std::size_t at = f.subject.find(host); at != std::string::npos; at = f.subject.find(host, at + 1)) {
        const std::size_t end = at + host.size();
        if (end == f.subject.size() || !std::isalnum(static_cast<unsigned char>(f.subject[end]))) return true;
      }
    return false;
  };
  o << "\n2. Local checks" << (everyHost ? "" : " (the first host and each host a finding is about; --json has every host)") << "\n";
  for (std::size_t k = 0; k < h.names.size(); ++k) {
    if (!everyHost && k > 0 && !named(h.names[k])) continue;
    const RankFacts& f = d.ranks[h.ranks[k][0]];
    o << "  host " << h.names[k] << " (" << rankText(h.ranks[k]) << "):\n";
    o << "    /dev/shm " << bytesText(f.shmFree) << " free of " << bytesText(f.shmSize);
    if (f.shmNeed) o << " (this job's rings take " << bytesText(f.shmNeed) << ")";
    o << "; cross-memory attach " << (f.cmaRefused.empty() ? "works" : "refused");
    if (f.ptraceScope >= 0) o << " (ptrace_scope " << f.ptraceScope << ")";
    o << "\n    tcp on " << (f.tcpIface.empty() ? "?" : f.tcpIface) << " " << f.tcpAddr << " (MTU " << f.tcpMtu << ")";
    if (!f.ifSpec.empty()) o << ", BRAID_SOCKET_IFNAME='" << f.ifSpec << "'" << (f.ifSpecProblem.empty() ? "" : " (unusable)");
    o << "; interfaces:";
    for (const Iface& i : f.ifaces)
      o << " " << i.name << " " << i.addr << "/" << i.prefix << " mtu " << i.mtu << (i.up ? "" : " down")
        << (i.route.empty() ? "" : " (" + i.route + " route)");
    o << "\n    ib " << (f.ibProbe.empty() ? "usable" : "unusable: " + f.ibProbe);
    for (const IbPortFact& p : f.ibPorts)
      o << "; " << p.name << " " << p.state << " " << p.link << " MTU " << p.mtu
        << (p.gidIndex >= 0 ? " GID index " + std::to_string(p.gidIndex) : "") << " NUMA " << p.numa;
    o << "\n    limits: memlock " << bytesText(f.memlock) << (f.ipcLock ? " (CAP_IPC_LOCK: not binding)" : "")
      << ", open files " << limitText(f.nofile) << "\n";
    for (int r : h.ranks[k]) {
      if (n > kRankMatrixUpTo) break;
      const RankFacts& rf = d.ranks[r];
      o << "    rank " << r << ": CPUs " << rf.cpus << ", NUMA node " << (rf.numa.empty() ? "?" : rf.numa) << ", pid " << rf.pid << "\n";
    }
  }
  {
    std::map<std::string, int> same;
    for (const RankFacts& f : d.ranks)
      for (const auto& [k, v] : f.settings) same[k + "=" + v]++;
    std::string common;
    for (auto& [kv, count] : same)
      if (count == n) common += (common.empty() ? "" : " ") + kv;
    o << "  BRAID_* set on every rank alike: " << (common.empty() ? "none" : common) << "\n";
  }

  o << "\n3. Measurement: " << bytesText(d.bytes) << " both ways at once per pair, best of " << d.iters
    << " after a warm-up; latency: half the median of 20 round trips of 8 B; " << d.rounds
    << " round(s) of disjoint pairs"
    << (d.byHost ? ": one rank pair per two hosts (their first ranks), then each host's first two ranks" : "")
    << (d.oneAtATime ? "; one pair a round, as every host runs on one kernel (its cores are shared)" : "") << "\n";
  if (!d.pairs.empty()) {
    const std::vector<HostLink> links = hostLinks(d, h);
    const int hosts = static_cast<int>(h.names.size());
    if (n <= kRankMatrixUpTo) {
      auto cell = [&](int a, int b, const char* f, double PairFigure::*field) {
        return d.pairs[a][b].measured ? fmt(f, d.pairs[a][b].*field) : std::string("-");
      };
      o << "  bandwidth per direction, GB/s\n";
      matrix(o, n, 7, [&](int a, int b) { return cell(a, b, "%.2f", &PairFigure::gbps); });
      o << "  latency, us\n";
      matrix(o, n, 7, [&](int a, int b) { return cell(a, b, "%.1f", &PairFigure::latUs); });
    } else if (hosts > 1 && hosts <= kHostMatrixUpTo) {
      // The hosts' matrix instead of the ranks' (--json has every pair).
      std::map<std::pair<int, int>, const HostLink*> at;
      for (const HostLink& l : links) at[{l.a, l.b}] = at[{l.b, l.a}] = &l;
      auto cell = [&](int a, int b, const char* f, double HostLink::*field) {
        auto it = at.find({a, b});
        return it == at.end() ? std::string("-") : fmt(f, it->second->*field);
      };
      o << "  bandwidth per direction between hosts (host indexes as in 1.), GB/s\n";
      matrix(o, hosts, 7, [&](int a, int b) { return cell(a, b, "%.2f", &HostLink::raw); });
      o << "  latency between hosts, us\n";
      matrix(o, hosts, 7, [&](int a, int b) { return cell(a, b, "%.1f", &HostLink::latUs); });
    }
    std::vector<const HostLink*> listed;
    for (const HostLink& l : links) listed.push_back(&l);
    if (listed.size() > kLinksListedUpTo) {  // the slowest, by their own figure
      std::sort(listed.begin(), listed.end(), [](const HostLink* x, const HostLink* y) { return x->raw < y->raw; });
      listed.resize(kLinksListedUpTo);
    }
    if (!links.empty())
      o << "  links between hosts (medians of their rank pairs: each pair's figure, and times the pairs that shared "
           "the link in its round)"
        << (listed.size() < links.size() ? "; the " + std::to_string(listed.size()) + " slowest of " + std::to_string(links.size())
                                         : std::string())
        << ":\n";
    for (const HostLink* lp : listed) {
      const HostLink& l = *lp;
      o << "    " << h.names[l.a] << "–" << h.names[l.b] << " " << l.transport << ": " << fmt("%.3f", l.raw) << " GB/s ("
        << fmt("%.3f", l.gbps) << " shared), " << fmt("%.1f", l.latUs) << " us (" << l.pairs << " rank pair"
        << (l.pairs == 1 ? "" : "s") << ")"
        << (l.confirmed > 0 ? "; measured again alone: " + fmt("%.3f", l.confirmed) + " GB/s (best " +
                                    fmt("%.3f", l.confirmedBest) + ")"
                              : std::string())
        << (l.oneKernel ? "; both hosts on one kernel: slow below " + fmt("%.0f%%", 100 * slowRatioOf(l, d.slowRatio)) +
                              " of the fastest"
                        : std::string())
        << "\n";
    }
    std::size_t farthest = 0;  // beyond kHostsDetailedUpTo hosts, only the clock farthest from rank 0's
    for (std::size_t k = 1; k < h.names.size(); ++k) {
      const PairFigure& f = d.pairs[0][h.ranks[k][0]];
      if (!f.measured) continue;
      if (h.names.size() <= kHostsDetailedUpTo)
        o << "    clock of " << h.names[k] << ": " << fmt("%+.6f", f.clockOffsetUs / 1e6) << " s against " << h.names[0] << "\n";
      else if (!farthest || std::abs(f.clockOffsetUs) > std::abs(d.pairs[0][h.ranks[farthest][0]].clockOffsetUs))
        farthest = k;
    }
    if (farthest)
      o << "    clocks: the farthest from " << h.names[0] << "'s, " << h.names[farthest] << "'s, is "
        << fmt("%+.6f", d.pairs[0][h.ranks[farthest][0]].clockOffsetUs / 1e6) << " s off\n";
  }
  for (const RingFigure& r : d.rings) {
    std::string order;
    for (int x : r.order) {
      if (!order.empty()) order += ' ';
      order += std::to_string(x);
    }
    o << "  ring all-reduce of " << bytesText(d.bytes) << " along " << order << ": busbw " << fmt("%.3f", r.busbw)
      << " GB/s (its slowest hop " << fmt("%.3f", r.slowestHop) << " GB/s), " << (r.wrong ? "WRONG results" : "exact") << "\n";
  }

  o << "\n4. Findings\n";
  if (findings.empty()) o << "  none\n";
  for (std::size_t i = 0; i < findings.size(); ++i)
    o << "  [" << i + 1 << "] " << findings[i].subject << ": " << findings[i].text << "\n      fix: " << findings[i].fix << "\n";
  o << "\nverdict: " << (findings.empty() ? "healthy" : std::to_string(findings.size()) + " finding(s)") << "\n";
  return o.str();
}

std::string jsonReport(const Data& d, const std::vector<Finding>& findings) {
  std::ostringstream o;
  const HostLayout h = layOut(d.ranks);
  const int n = static_cast<int>(d.ranks.size());
  auto q = [](const std::string& s) { return jsonString(s); };
  auto num = [](double v) { return std::isfinite(v) ? fmt("%.6g", v) : std::string("null"); };
  o << "{\"schema\": \"braid.doctor/1\", \"tool\": \"braid doctor\", \"version\": " << q(d.version) << ", \"started_at\": " << q(d.startedAt)
    << ", \"nranks\": " << n << ", \"bytes\": " << d.bytes << ", \"iters\": " << d.iters << ", \"slow_ratio\": " << num(d.slowRatio)
    << ",\n \"verdict\": " << q(findings.empty() ? "healthy" : "findings") << ",\n \"hosts\": [";
  for (std::size_t k = 0; k < h.names.size(); ++k) {
    o << (k ? ", " : "") << "{\"name\": " << q(h.names[k]) << ", \"ranks\": [";
    for (std::size_t i = 0; i < h.ranks[k].size(); ++i) o << (i ? ", " : "") << h.ranks[k][i];
    o << "]}";
  }
  o << "],\n \"findings\": [";
  for (std::size_t i = 0; i < findings.size(); ++i)
    o << (i ? ",\n   " : "") << "{\"subject\": " << q(findings[i].subject) << ", \"text\": " << q(findings[i].text)
      << ", \"fix\": " << q(findings[i].fix) << "}";
  o << "],\n \"ranks\": [";
  for (int r = 0; r < n; ++r) {
    const RankFacts& f = d.ranks[r];
    o << (r ? ",\n   " : "") << "{\"rank\": " << f.rank << ", \"host\": " << q(f.host) << ", \"pid\": " << f.pid
      << ", \"cpus\": " << q(f.cpus) << ", \"numa\": " << q(f.numa) << ", \"shm\": {\"size\": " << f.shmSize
      << ", \"free\": " << f.shmFree << ", \"need\": " << f.shmNeed << ", \"local_ranks\": " << f.localRanks
      << ", \"off_by_doctor\": " << (f.shmOffByDoctor ? "true" : "false") << ", \"probe\": " << q(f.shmProbe) << "}"
      << ", \"cma_refused\": " << q(f.cmaRefused) << ", \"ptrace_scope\": " << f.ptraceScope
      << ", \"memlock\": " << (f.memlock == kUnlimited ? std::string("null") : std::to_string(f.memlock))
      << ", \"memlock_need\": " << f.memlockNeed << ", \"cap_ipc_lock\": " << (f.ipcLock ? "true" : "false")
      << ", \"nofile\": " << (f.nofile == kUnlimited ? std::string("null") : std::to_string(f.nofile))
      << ", \"socket_ifname\": " << q(f.ifSpec) << ", \"socket_ifname_problem\": " << q(f.ifSpecProblem)
      << ", \"tcp\": {\"iface\": " << q(f.tcpIface) << ", \"addr\": " << q(f.tcpAddr) << ", \"mtu\": " << f.tcpMtu
      << ", \"numa\": " << f.nicNuma << "}, \"interfaces\": [";
    for (std::size_t i = 0; i < f.ifaces.size(); ++i) {
      const Iface& x = f.ifaces[i];
      o << (i ? ", " : "") << "{\"name\": " << q(x.name) << ", \"addr\": " << q(x.addr) << ", \"prefix\": " << x.prefix
        << ", \"mtu\": " << x.mtu << ", \"up\": " << (x.up ? "true" : "false") << ", \"route\": " << q(x.route) << "}";
    }
    o << "], \"ib\": {\"probe\": " << q(f.ibProbe) << ", \"ports\": [";
    for (std::size_t i = 0; i < f.ibPorts.size(); ++i) {
      const IbPortFact& p = f.ibPorts[i];
      o << (i ? ", " : "") << "{\"name\": " << q(p.name) << ", \"state\": " << q(p.state) << ", \"link\": " << q(p.link)
        << ", \"mtu\": " << p.mtu << ", \"gid_index\": " << p.gidIndex << ", \"numa\": " << p.numa << "}";
    }
    o << "]}, \"settings\": {";
    for (std::size_t i = 0; i < f.settings.size(); ++i) o << (i ? ", " : "") << q(f.settings[i].first) << ": " << q(f.settings[i].second);
    o << "}, \"transports\": [";
    for (int p = 0; p < n; ++p) {
      const PairChoice c = d.choice(r, p);
      const auto k = static_cast<std::size_t>(p);
      o << (p ? ", " : "") << "{\"peer\": " << p << ", \"transport\": " << q(c.transport) << ", \"skipped\": " << q(c.skipped)
        << ", \"connected_at_creation\": " << (k < f.connectedTo.size() && !f.connectedTo[k] ? "false" : "true") << "}";
    }
    o << "]}";
  }
  o << "],\n \"pairs\": [";
  bool first = true;
  std::vector<std::pair<int, int>> measured;
  d.pairs.forEachMeasured([&](int a, int b, const PairFigure&) { measured.push_back({a, b}); });
  std::sort(measured.begin(), measured.end());
  for (auto [a, b] : measured) {
    const PairFigure& p = d.pairs[a][b];
    o << (first ? "" : ",\n   ") << "{\"a\": " << a << ", \"b\": " << b << ", \"transport\": " << q(d.choice(a, b).transport)
      << ", \"gbps\": " << num(p.gbps) << ", \"lat_us\": " << num(p.latUs) << ", \"share\": " << p.share
      << ", \"clock_offset_us\": " << num(p.clockOffsetUs) << "}";
    first = false;
  }
  o << "],\n \"host_links\": [";
  const std::vector<HostLink> links = hostLinks(d, h);
  for (std::size_t i = 0; i < links.size(); ++i)
    o << (i ? ", " : "") << "{\"a\": " << q(h.names[links[i].a]) << ", \"b\": " << q(h.names[links[i].b]) << ", \"transport\": "
      << q(links[i].transport) << ", \"gbps\": " << num(links[i].raw) << ", \"shared_gbps\": " << num(links[i].gbps) << ", \"confirmed_gbps\": " << num(links[i].confirmed) << ", \"confirmed_best_gbps\": " << num(links[i].confirmedBest) << ", \"lat_us\": " << num(links[i].latUs)
      << ", \"pairs\": " << links[i].pairs << ", \"one_kernel\": " << (links[i].oneKernel ? "true" : "false") << "}";
  o << "],\n \"rings\": [";
  for (std::size_t i = 0; i < d.rings.size(); ++i) {
    o << (i ? ", " : "") << "{\"order\": [";
    for (std::size_t j = 0; j < d.rings[i].order.size(); ++j) o << (j ? ", " : "") << d.rings[i].order[j];
    o << "], \"busbw_gbps\": " << num(d.rings[i].busbw) << ", \"slowest_hop_gbps\": " << num(d.rings[i].slowestHop)
      << ", \"wrong\": " << d.rings[i].wrong << "}";
  }
  o << "]}\n";
  return o.str();
}

std::string svgHeatmap(const Data& d) {
  const int n = static_cast<int>(d.pairs.size());
  const int cell = n <= 16 ? 48 : 24, margin = 60;
  const int size = margin + n * cell + 20;
  double best = 0;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) best = std::max(best, d.pairs[a][b].gbps);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << size << "\" height=\"" << size + 30
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<text x=\"" << margin << "\" y=\"16\">braid doctor: bandwidth per direction (GB/s), "
    << "colour: share of the fastest pair (" << fmt("%.2f", best) << " GB/s)</text>\n";
  for (int a = 0; a < n; ++a) {
    o << "<text x=\"" << margin - 8 << "\" y=\"" << margin + a * cell + cell / 2 + 4 << "\" text-anchor=\"end\">" << a << "</text>\n";
    o << "<text x=\"" << margin + a * cell + cell / 2 << "\" y=\"" << margin - 8 << "\" text-anchor=\"middle\">" << a << "</text>\n";
    for (int b = 0; b < n; ++b) {
      const int x = margin + b * cell, y = margin + a * cell;
      std::string fill = "#dddddd";
      if (a != b && best > 0 && d.pairs[a][b].measured) {
        const double t = std::clamp(d.pairs[a][b].gbps / best, 0.0, 1.0);  // red (slow) to green (fast)
        fill = "rgb(" + std::to_string(static_cast<int>(220 * (1 - t) + 30)) + "," + std::to_string(static_cast<int>(60 + 150 * t)) + ",70)";
      }
      o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell - 1 << "\" height=\"" << cell - 1 << "\" fill=\"" << fill << "\"/>";
      if (a != b && cell >= 40 && d.pairs[a][b].measured)
        o << "<text x=\"" << x + cell / 2 << "\" y=\"" << y + cell / 2 + 4 << "\" text-anchor=\"middle\" fill=\"white\">"
          << fmt("%.2f", d.pairs[a][b].gbps) << "</text>";
      o << "\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace braid::tools::doctor
