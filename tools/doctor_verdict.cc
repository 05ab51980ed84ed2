// `braid doctor`'s findings: the local checks compared across ranks, the transport choices, and
// the verdict on the measured links. Pure functions of the gathered data (tests/unit/test_doctor.cc).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "tools/doctor.h"
#include "tools/json.h"
#include "topology/topology.h"

namespace braid::tools::doctor {
namespace {

std::string joinNames(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

std::string gb(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 10 ? "%.1f GB/s" : v >= 0.1 ? "%.2f GB/s" : "%.4f GB/s", v);
  return buf;
}

// The hosts (by index) that `ranks` are on, as names; "rank 3 (braid-h2)" where a host has more
// ranks than those.
std::string whereText(const HostLayout& h, const std::vector<int>& ranks) {
  std::map<int, std::vector<int>> byHost;
  for (int r : ranks) byHost[h.hostOf[r]].push_back(r);
  std::vector<std::string> whole, parts;
  for (auto& [host, rs] : byHost) {
    if (rs.size() == h.ranks[host].size()) whole.push_back(h.names[host]);
    else parts.push_back(rankText(rs) + " on " + h.names[host]);
  }
  if (!whole.empty()) parts.insert(parts.begin(), (whole.size() == 1 ? "host " : "hosts ") + joinNames(whole));
  return joinNames(parts);
}

// The fix that goes with an ib probe's reason.
std::string ibFix(const std::string& reason) {
  if (reason.find("memlock") != std::string::npos)
    return "ulimit -l unlimited before starting the ranks (docker run --ulimit memlock=-1; systemd LimitMEMLOCK=infinity; "
           "/etc/security/limits.conf: * - memlock unlimited)";
  if (reason.find("ACTIVE") != std::string::npos)
    return "bring the port up: ibstat or ibv_devinfo shows its state; check the cable, the switch port and that a subnet "
           "manager runs (opensm); or pick another port with BRAID_IB_HCA";
  if (reason.find("BRAID_IB_HCA") != std::string::npos) return "correct BRAID_IB_HCA (ibv_devices lists the devices)";
  if (reason.find("no InfiniBand device") != std::string::npos)
    return "load the RDMA driver and pass /dev/infiniband into the container (docker run --device=/dev/infiniband), "
           "or set BRAID_IB_DISABLE=1 where a host has none";
  return "see the reason; BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT logs ib's set-up";
}

bool disabledByUser(const std::string& reason) { return reason.rfind("disabled by", 0) == 0; }

std::string subnetOf(const Iface& i) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (std::sscanf(i.addr.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d) != 4 || i.prefix <= 0 || i.prefix > 32) return i.addr;
  std::uint32_t v = (a << 24) | (b << 16) | (c << 8) | d;
  v &= i.prefix == 32 ? ~0u : ~(~0u >> i.prefix);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u/%d", v >> 24, (v >> 16) & 255, (v >> 8) & 255, v & 255, i.prefix);
  return buf;
}

void localFindings(const Data& d, const HostLayout& h, std::vector<Finding>& out) {
  const auto& R = d.ranks;
  const int n = static_cast<int>(R.size());
  // BRAID_SOCKET_IFNAME that cannot work here.
  {
    std::map<std::string, std::vector<int>> bySpec;
    for (const RankFacts& f : R)
      if (!f.ifSpecProblem.empty()) bySpec[f.ifSpec].push_back(f.rank);
    for (auto& [spec, ranks] : bySpec) {
      const RankFacts& f = R[ranks[0]];
      out.push_back({"BRAID_SOCKET_IFNAME on " + whereText(h, ranks),
                     f.ifSpecProblem + "; a Braid job with it fails at start-up there (the doctor ran without it, on " +
                         (f.tcpIface.empty() ? std::string("the default interface") : f.tcpIface + " " + f.tcpAddr) + ")",
                     f.tcpIface.empty() ? "unset BRAID_SOCKET_IFNAME"
                                        : "BRAID_SOCKET_IFNAME=" + f.tcpIface + " (the interface toward the rendezvous host), or unset it"});
    }
  }
  // Interfaces whose subnet routes nowhere (found on each host once).
  {
    std::map<std::pair<std::string, std::string>, std::vector<int>> bad;  // (iface, route) -> ranks
    for (const RankFacts& f : R)
      for (const Iface& i : f.ifaces)
        if (!i.route.empty() && f.ifSpecProblem.find(" picks " + i.name + " ") == std::string::npos)
          bad[{i.name, i.route}].push_back(f.rank);
    for (auto& [key, ranks] : bad) {
      const RankFacts& f = R[ranks[0]];
      const Iface* i = nullptr;
      for (const Iface& x : f.ifaces)
        if (x.name == key.first) i = &x;
      out.push_back({"interface " + key.first + " on " + whereText(h, ranks),
                     key.first + " (" + i->addr + "/" + std::to_string(i->prefix) + ") is up but its subnet " + subnetOf(*i) +
                         " routes to a " + key.second + ": connections through it fail (tcp uses " +
                         (f.tcpIface.empty() ? std::string("another interface") : f.tcpIface) + ")",
                     "keep Braid off it (BRAID_SOCKET_IFNAME=^" + key.first +
                         (f.tcpIface.empty() ? std::string() : ", or =" + f.tcpIface) + "), or fix the route (ip route show " +
                         subnetOf(*i) + ")"});
    }
  }
  // The MTU of the interface tcp uses, host by host.
  {
    std::map<int, std::vector<int>> hostsByMtu;
    for (std::size_t k = 0; k < h.names.size(); ++k) {
      const RankFacts& f = R[h.ranks[k][0]];
      if (f.tcpMtu > 0 && f.tcpIface != "lo") hostsByMtu[f.tcpMtu].push_back(static_cast<int>(k));
    }
    if (hostsByMtu.size() > 1) {
      auto common = std::max_element(hostsByMtu.begin(), hostsByMtu.end(),
                                     [](auto& a, auto& b) { return a.second.size() < b.second.size(); });
      std::vector<std::string> usual;
      for (int k : common->second) usual.push_back(h.names[k]);
      for (auto& [mtu, hs] : hostsByMtu) {
        if (mtu == common->first) continue;
        for (int k : hs) {
          const RankFacts& f = R[h.ranks[k][0]];
          out.push_back({"MTU on host " + h.names[k],
                         f.tcpIface + " on " + h.names[k] + " has MTU " + std::to_string(mtu) + ", on " + joinNames(usual) +
                             " it is " + std::to_string(common->first) +
                             ": frames larger than the smaller MTU are dropped or fragmented between them",
                         "ip link set dev " + f.tcpIface + " mtu " + std::to_string(common->first) + " on " + h.names[k] +
                             " (every host and switch port of a job needs the same MTU)"});
        }
      }
    }
  }
  // /dev/shm, cross-memory attach, and shm's own verdict, host by host.
  for (std::size_t k = 0; k < h.names.size(); ++k) {
    const RankFacts& f = R[h.ranks[k][0]];
    int left = 0;
    std::uint64_t leftBytes = 0;
    std::string pids;
    for (int r : h.ranks[k]) {
      left += R[r].shmLeftovers;
      leftBytes += R[r].shmLeftoverBytes;
      if (!R[r].shmLeftoverPids.empty()) pids += (pids.empty() ? "" : ", ") + R[r].shmLeftoverPids;
    }
    if (left)
      out.push_back({"/dev/shm on host " + h.names[k],
                     std::to_string(left) + " shared-memory segments (" + bytesText(leftBytes) + ") that processes " +
                         pids + " left when they died during set-up took room there; the doctor removed them",
                     "nothing more for these (the next Braid job on a host removes such leftovers too); if they come "
                     "back, look for jobs killed while they set up (the OOM killer, SIGKILL, a launcher's SIGTERM)"});
    if (h.ranks[k].size() < 2) continue;
    if (f.shmOffByDoctor)
      out.push_back({"/dev/shm on host " + h.names[k],
                     "/dev/shm has " + bytesText(f.shmFree) + " free of " + bytesText(f.shmSize) + ", below the " +
                         bytesText(f.shmNeed) + " that its " + std::to_string(h.ranks[k].size()) +
                         " ranks' shared-memory rings take: a Braid job fails at start-up there (the doctor ran its "
                         "ranks with shm off, over tcp)",
                     "enlarge /dev/shm (docker run --shm-size=" + std::to_string(std::max<std::uint64_t>(f.shmNeed * 2, 64u << 20) >> 20) + "m" +
                         "; mount -o remount,size=1G /dev/shm), or lower BRAID_BUFFSIZE, or BRAID_SHM_DISABLE=1 (tcp between "
                         "local ranks)"});
    else if (!f.shmProbe.empty() && !disabledByUser(f.shmProbe))
      out.push_back({"shm on host " + h.names[k], "shared memory is unusable: " + f.shmProbe,
                     "mount a writable tmpfs on /dev/shm (docker run --shm-size=1g)"});
    std::vector<int> refused;
    for (int r : h.ranks[k])
      if (!R[r].cmaRefused.empty()) refused.push_back(r);
    if (!refused.empty())
      out.push_back({"cross-memory attach on host " + h.names[k],
                     R[refused[0]].cmaRefused +
                         (f.ptraceScope >= 0 ? " (kernel.yama.ptrace_scope=" + std::to_string(f.ptraceScope) + ")" : "") +
                         ": large all-gathers and broadcasts within the host take the slower rings",
                     "sysctl -w kernel.yama.ptrace_scope=0, or docker run --cap-add SYS_PTRACE; BRAID_CMA=0 silences it"});
  }
  // ib: unusable where it is usable elsewhere, or where a host has ports; ports that disagree.
  {
    std::vector<int> usable;
    std::map<std::pair<int, std::string>, std::vector<int>> unusable;  // (host, reason) -> ranks
    for (const RankFacts& f : R) {
      if (f.ibProbe.empty()) usable.push_back(f.rank);
      else if (!disabledByUser(f.ibProbe) && f.ibProbe.rfind("not built", 0) != 0) unusable[{h.hostOf[f.rank], f.ibProbe}].push_back(f.rank);
    }
    for (auto& [key, ranks] : unusable) {
      const bool hasPorts = !R[ranks[0]].ibPorts.empty();
      if (usable.empty() && !hasPorts) continue;  // no ib anywhere: nothing to miss
      out.push_back({"ib on " + whereText(h, ranks),
                     "ib is unusable there: " + key.second +
                         (usable.empty() ? std::string() : "; it works on " + whereText(h, usable) + ", and the pairs between them use tcp"),
                     ibFix(key.second)});
    }
    std::map<int, std::vector<int>> hostsByMtu;
    std::map<int, std::vector<int>> hostsByGid;
    for (std::size_t k = 0; k < h.names.size(); ++k) {
      const RankFacts& f = R[h.ranks[k][0]];
      if (!f.ibProbe.empty()) continue;
      for (const IbPortFact& p : f.ibPorts)
        if (p.state == "ACTIVE") {
          hostsByMtu[p.mtu].push_back(static_cast<int>(k));
          if (p.link == "eth") hostsByGid[p.gidIndex].push_back(static_cast<int>(k));
          break;
        }
    }
    auto disagree = [&](const std::map<int, std::vector<int>>& by, const char* what, const std::string& fixFmt) {
      if (by.size() < 2) return;
      auto common = std::max_element(by.begin(), by.end(), [](auto& a, auto& b) { return a.second.size() < b.second.size(); });
      for (auto& [v, hs] : by)
        if (v != common->first)
          for (int k : hs)
            out.push_back({std::string("ib ") + what + " on host " + h.names[k],
                           std::string("the ib port used on ") + h.names[k] + " has " + what + " " + std::to_string(v) +
                               ", the others " + std::to_string(common->first),
                           fixFmt + std::to_string(common->first) + " on " + h.names[k]});
    };
    disagree(hostsByMtu, "MTU", "set the port's MTU (the subnet manager's or the switch's) to ");
    disagree(hostsByGid, "GID index", "BRAID_IB_GID_INDEX=");
  }
  // Routes to the other hosts' tcp addresses.
  for (const RankFacts& f : R)
    if (!f.unreachable.empty())
      out.push_back({"routes from rank " + std::to_string(f.rank) + " on " + f.host,
                     "no route from rank " + std::to_string(f.rank) + " to " + f.unreachable +
                         ": tcp between them cannot connect",
                     "check the routes (ip route get ADDRESS on " + f.host + "), and that BRAID_SOCKET_IFNAME picks an "
                     "interface every host reaches"});
  // Limits.
  {
    std::vector<int> low;
    std::uint64_t need = 0;
    for (const RankFacts& f : R)
      if (f.nofile != kUnlimited && f.nofile < f.nofileNeed) low.push_back(f.rank), need = std::max(need, f.nofileNeed);
    if (!low.empty())
      out.push_back({"open files on " + whereText(h, low),
                     "the open-file limit (ulimit -n) is " + std::to_string(R[low[0]].nofile) + ", below the " +
                         std::to_string(need) + " a job of " + std::to_string(n) + " ranks may hold",
                     "ulimit -n " + std::to_string(std::max<std::uint64_t>(need * 2, 65536))});
  }
  // NUMA: a rank away from the NIC it uses.
  for (const RankFacts& f : R) {
    int nic = f.nicNuma;
    std::string nicName = f.tcpIface;
    if (f.ibProbe.empty())
      for (const IbPortFact& p : f.ibPorts)
        if (p.state == "ACTIVE") {
          nic = p.numa, nicName = p.name;
          break;
        }
    if (nic < 0 || f.numa.empty() || f.numa.find(',') != std::string::npos || f.numa.find('-') != std::string::npos) continue;
    if (std::to_string(nic) != f.numa)
      out.push_back({"rank " + std::to_string(f.rank) + " on " + f.host,
                     "rank " + std::to_string(f.rank) + " runs on NUMA node " + f.numa + " (CPUs " + f.cpus + "), its NIC " +
                         nicName + " is on node " + std::to_string(nic) + ": every message crosses the socket link",
                     "bind the ranks near their NIC (numactl --cpunodebind=" + std::to_string(nic) + ", or BRAID_IB_HCA / "
                     "BRAID_SOCKET_IFNAME naming the NIC of each rank's node)"});
  }
  // BRAID_* settings that differ between ranks.
  {
    std::set<std::string> names;
    for (const RankFacts& f : R)
      for (const auto& kv : f.settings) names.insert(kv.first);
    for (const std::string& name : names) {
      std::map<std::string, std::vector<int>> byValue;
      for (const RankFacts& f : R) {
        std::string v = "(unset)";
        for (const auto& kv : f.settings)
          if (kv.first == name) v = kv.second;
        byValue[v].push_back(f.rank);
      }
      if (byValue.size() < 2) continue;
      auto common = std::max_element(byValue.begin(), byValue.end(), [](auto& a, auto& b) { return a.second.size() < b.second.size(); });
      std::string text;
      for (auto& [v, ranks] : byValue)
        if (v != common->first) text += (text.empty() ? "" : "; ") + rankText(ranks) + " " + (v == "(unset)" ? "leave it unset" : "set " + v);
      out.push_back({name + " on " + [&] {
                       std::vector<int> odd;
                       for (auto& [v, ranks] : byValue)
                         if (v != common->first) odd.insert(odd.end(), ranks.begin(), ranks.end());
                       std::sort(odd.begin(), odd.end());
                       return whereText(h, odd);
                     }(),
                     name + " differs between ranks: " + text + ", the other " + std::to_string(common->second.size()) +
                         (common->first == "(unset)" ? " leave it unset" : " set " + common->first),
                     "give every rank the same " + name + " (a launcher passes on the environment of the host it starts on)"});
    }
  }
}

void transportFindings(const Data& d, const HostLayout& h, bool ibExplained, std::vector<Finding>& out) {
  const int n = static_cast<int>(d.ranks.size());
  std::map<std::string, std::vector<std::pair<int, int>>> across, within;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      (h.hostOf[a] == h.hostOf[b] ? within : across)[d.choice(a, b).transport].emplace_back(a, b);
    }
  auto report = [&](const std::map<std::string, std::vector<std::pair<int, int>>>& by, const char* kind) {
    if (by.size() < 2) return;
    std::string counts, why;
    for (auto& [t, pairs] : by) {
      counts += (counts.empty() ? "" : ", ") + t + " " + std::to_string(pairs.size());
      if (why.empty() && t == "tcp") {
        auto [a, b] = pairs[0];
        why = "rank " + std::to_string(a) + "–rank " + std::to_string(b) + ": " + d.choice(a, b).skipped;
      }
    }
    out.push_back({std::string("transports ") + kind,
                   std::string("pairs ") + kind + " do not all use one transport (" + counts + ")" + (why.empty() ? "" : "; " + why),
                   "make every host offer the same transports (the reasons above say what is missing)"});
  };
  bool shmOff = false;
  // Shared memory off by the doctor, or unusable on a host (a finding of its own): pairs within
  // hosts differ for that reason, already named.
  for (const RankFacts& f : d.ranks) shmOff |= f.shmOffByDoctor || (!f.shmProbe.empty() && !disabledByUser(f.shmProbe));
  if (!ibExplained) report(across, "between hosts");
  if (!shmOff) report(within, "within hosts");
}

}  // namespace

std::string rankText(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + topology::cpuListText(ranks);  // (Linux's list text)
}

std::string bytesText(std::uint64_t b) {
  char buf[32];
  if (b == kUnlimited) return "unlimited";
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  else if (b >= (1u << 20)) std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(b) / (1u << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof(buf), "%.0f KiB", static_cast<double>(b) / 1024);
  else std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

HostLayout layOut(const std::vector<RankFacts>& ranks) {
  HostLayout h;
  h.hostOf.assign(ranks.size(), 0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string key = ranks[r].host;
    auto it = std::find(h.names.begin(), h.names.end(), key);
    if (it == h.names.end()) {
      h.names.push_back(key);
      h.ranks.emplace_back();
      it = h.names.end() - 1;
    }
    const int k = static_cast<int>(it - h.names.begin());
    h.hostOf[r] = k;
    h.ranks[k].push_back(static_cast<int>(r));
  }
  return h;
}

std::vector<HostLink> hostLinks(const Data& d, const HostLayout& h) {
  struct Figure {
    double shared, own, latUs;
  };
  std::map<std::pair<int, int>, std::vector<Figure>> figures;
  std::map<std::pair<int, int>, std::string> transport;
  d.pairs.forEachMeasured([&](int a, int b, const PairFigure& p) {
    const int ha = h.hostOf[a], hb = h.hostOf[b];
    if (ha == hb) return;
    const auto key = std::make_pair(std::min(ha, hb), std::max(ha, hb));
    figures[key].push_back({p.gbps * p.share, p.gbps, p.latUs});
    transport[key] = d.choice(a, b).transport;
  });
  std::vector<HostLink> out;
  for (auto& [key, v] : figures) {
    HostLink l;
    l.a = key.first, l.b = key.second;
    l.pairs = static_cast<int>(v.size());
    auto median = [&](double Figure::*field) {
      std::vector<double> x;
      for (const Figure& f : v) x.push_back(f.*field);
      std::sort(x.begin(), x.end());
      return x[x.size() / 2];
    };
    l.gbps = median(&Figure::shared);
    l.raw = median(&Figure::own);
    l.latUs = median(&Figure::latUs);
    l.transport = transport[key];
    const std::string& bootA = d.ranks[h.ranks[l.a][0]].bootId;
    l.oneKernel = d.halveOnOneKernel && !bootA.empty() && bootA == d.ranks[h.ranks[l.b][0]].bootId;
    if (auto c = d.confirmed.find(key); c != d.confirmed.end()) l.confirmed = c->second.median, l.confirmedBest = c->second.best;
    out.push_back(l);
  }
  return out;
}

double slowRatioOf(const HostLink& link, double ratio) { return link.oneKernel ? ratio / 2 : ratio; }

std::vector<Finding> judgeLinks(const std::vector<std::string>& hosts, const std::vector<HostLink>& links, double ratio,
                                const Baseline& baseline) {
  std::vector<Finding> out;
  std::map<std::string, std::vector<HostLink>> byTransport;
  for (const HostLink& l : links) byTransport[l.transport].push_back(l);
  for (auto& [t, ls] : byTransport) {
    const auto b = baseline.best.find(t);
    const double base = b == baseline.best.end() ? 0 : b->second;
    if (ls.size() < 2 && base <= 0) continue;  // nothing to compare it with
    const HostLink best = *std::max_element(ls.begin(), ls.end(), [](auto& x, auto& y) { return x.raw < y.raw; });
    // The first pass's reference, and the one the links measured again are held to: the fastest
    // link (or the baseline's), or among many links the median one (linkReference).
    const double median = linkReference(ls, base);
    const double first = median > 0 ? median : std::max(best.raw, base);
    double ref = median > 0 ? median : std::max(best.confirmed > 0 ? best.confirmed : best.raw, base);
    // Among many links, the fastest was measured again alternately with the suspects: if the
    // machine as a whole ran slower then (every host of a small machine busy), the suspects are held
    // to what the fastest managed at the same time, not to the first pass's median.
    if (median > 0 && best.confirmed > 0) ref = std::min(ref, std::max(best.confirmed, best.confirmedBest));
    std::vector<HostLink> slow;
    for (HostLink l : ls) {
      if (!(l.gbps < slowRatioOf(l, ratio) * first)) continue;
      // Measured again, alone and alternately with the fastest: those figures decide.
      if (l.confirmed > 0) {
        const double kindest = std::max(l.confirmed, l.confirmedBest);
        if (!(kindest < slowRatioOf(l, ratio) * ref)) continue;
        l.gbps = kindest;
      }
      slow.push_back(l);
    }
    if (slow.empty()) continue;
    auto name = [&](const HostLink& l) { return hosts[l.a] + "–" + hosts[l.b]; };
    auto pct = [&](const HostLink& l) {
      char buf[16];
      // (a figure measured again against what the fastest did then, a first one against the first pass's)
      std::snprintf(buf, sizeof(buf), "%.0f%%", 100 * l.gbps / (l.confirmed > 0 || median <= 0 ? ref : median));
      return std::string(buf);
    };
    const std::string against =
        median > 0 ? "the median of the " + std::to_string(ls.size()) + " " + t + " links between hosts is " + gb(median) +
                         (ref < median ? "; measured again alternately with them, the fastest ran at " + gb(ref) : "")
        : base >= ref ? "the fastest " + t + " link between hosts in the baseline, " + baseline.from + ", ran at " + gb(base)
                      : "the fastest " + t + " link between hosts, " + name(best) + ", runs at " + gb(ref) +
                            (best.confirmed > 0 ? " (both measured again, one rank pair at a time)" : "");
    // One host whose every link is slow, and no other slow link. Among many links (the median
    // reference) a host three quarters of whose links are slow is named the same way, and any other
    // slow link is judged on its own below.
    int guilty = -1;
    for (int x = 0; x < static_cast<int>(hosts.size()) && guilty < 0; ++x) {
      int touching = 0, slowTouching = 0;
      for (const HostLink& l : ls) touching += l.a == x || l.b == x;
      for (const HostLink& l : slow) slowTouching += l.a == x || l.b == x;
      if (touching >= 2 && slowTouching == touching && slowTouching == static_cast<int>(slow.size())) guilty = x;
      if (median > 0 && touching >= 4 && 4 * slowTouching >= 3 * touching) guilty = x;
    }
    if (guilty >= 0) {
      std::string figures;
      std::vector<HostLink> others;
      int shown = 0, mine = 0;
      for (const HostLink& l : slow) {
        if (l.a != guilty && l.b != guilty) {
          others.push_back(l);
          continue;
        }
        ++mine;
        if (shown++ < 8) figures += (figures.empty() ? "" : ", ") + name(l) + " " + gb(l.gbps) + " (" + pct(l) + ")";
      }
      if (shown > 8) figures += " and " + std::to_string(shown - 8) + " more";
      int touching = 0;
      for (const HostLink& l : ls) touching += l.a == guilty || l.b == guilty;
      out.push_back({"host " + hosts[guilty],
                     (mine == touching ? "every link of " + hosts[guilty] + " is slow: "
                                       : std::to_string(mine) + " of the " + std::to_string(touching) + " links of " +
                                             hosts[guilty] + " are slow: ") +
                         figures + "; " + against,
                     "look at " + hosts[guilty] + "'s network: its NIC's speed and errors (ethtool, ip -s link), a shaper "
                     "(tc qdisc show), its switch port, its CPU load"});
      slow = others;
      if (slow.empty()) continue;
    }
    std::set<int> touched;
    for (const HostLink& l : slow) touched.insert(l.a), touched.insert(l.b);
    if (slow.size() >= 2 && touched.size() == hosts.size() && slow.size() * 2 > ls.size()) {
      std::string figures;
      for (const HostLink& l : slow) figures += (figures.empty() ? "" : ", ") + name(l) + " " + gb(l.gbps) + " (" + pct(l) + ")";
      out.push_back({"system-wide", std::to_string(slow.size()) + " of " + std::to_string(ls.size()) + " " + t +
                                        " links between hosts are slow, on every host: " + figures + "; " + against,
                     "look at what they share: the switch, the fabric's configuration, a common shaper or MTU"});
      continue;
    }
    for (const HostLink& l : slow)
      out.push_back({"link " + name(l),
                     "the link " + name(l) + " runs at " + gb(l.gbps) + " (" + pct(l) + "); " + against,
                     "look at the path between " + hosts[l.a] + " and " + hosts[l.b] + ": cables and switch ports on it, a "
                     "shaper or policy for that peer (tc qdisc show; tc filter show), a route through a slower interface "
                     "(ip route get)"});
  }
  return out;
}

double linkReference(const std::vector<HostLink>& links, double baseline) {
  if (links.size() < kMedianFromLinks || baseline > 0) return 0;
  std::vector<double> raw;
  for (const HostLink& l : links) raw.push_back(l.raw);
  std::nth_element(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(raw.size() / 2), raw.end());
  return raw[raw.size() / 2];
}

std::size_t confirmAtMost(std::size_t links) {
  return std::max(kConfirmAtMost, static_cast<std::size_t>(std::ceil(2 * std::sqrt(static_cast<double>(links)))));
}

std::vector<std::pair<int, int>> linksToConfirm(const std::vector<HostLink>& links, double ratio, const Baseline& baseline) {
  std::map<std::string, std::vector<HostLink>> byTransport;
  for (const HostLink& l : links) byTransport[l.transport].push_back(l);
  std::vector<std::pair<int, int>> out;
  for (auto& [t, ls] : byTransport) {
    const HostLink best = *std::max_element(ls.begin(), ls.end(), [](auto& x, auto& y) { return x.raw < y.raw; });
    const auto b = baseline.best.find(t);
    const double base = b == baseline.best.end() ? 0.0 : b->second, median = linkReference(ls, base);
    const double first = median > 0 ? median : std::max(best.raw, base);
    // The slowest suspects only, at most confirmAtMost of a transport (each is measured alone, in
    // turn, while every rank waits): the others keep their first figure.
    std::vector<HostLink> suspects;
    for (const HostLink& l : ls)
      if (l.gbps < slowRatioOf(l, ratio) * first) suspects.push_back(l);
    // A host that most suspects touch is judged as a host; the others are measured again first
    // (slowest first), then two of that host's.
    std::map<int, int> touches;
    for (const HostLink& l : suspects) ++touches[l.a], ++touches[l.b];
    int dominant = -1;
    for (auto [x, k] : touches)
      if (suspects.size() >= 4 && 2 * static_cast<std::size_t>(k) >= suspects.size()) dominant = x;
    auto onDominant = [&](const HostLink& l) { return l.a == dominant || l.b == dominant; };
    std::sort(suspects.begin(), suspects.end(), [&](const HostLink& x, const HostLink& y) {
      return onDominant(x) != onDominant(y) ? !onDominant(x) : x.gbps < y.gbps;
    });
    std::vector<HostLink> chosen;
    std::size_t ofHost = 0;
    for (const HostLink& l : suspects) {
      if (!onDominant(l) && chosen.size() < confirmAtMost(ls.size())) chosen.push_back(l);
      if (onDominant(l) && ofHost < 2) chosen.push_back(l), ++ofHost;
    }
    suspects = chosen;
    for (const HostLink& l : suspects) out.emplace_back(l.a, l.b);
    if (!suspects.empty()) out.emplace_back(best.a, best.b);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<Baseline> readBaseline(const std::string& json, const std::string& from) {
  auto doc = parseJson(json);
  if (!doc.ok()) return Status::InvalidArgument("--baseline " + from + ": " + doc.status().message());
  if (strOf(doc->get("tool")) != "braid doctor")
    return Status::InvalidArgument("--baseline " + from + " is not braid doctor's --json output");
  Baseline b;
  b.from = from + " of " + strOf(doc->get("started_at"));
  if (const Json* links = doc->get("host_links"))
    for (const Json& l : links->items) {
      const double confirmed = doubleOf(l.get("confirmed_gbps"));
      const double v = confirmed > 0 ? confirmed : doubleOf(l.get("gbps"));
      double& best = b.best[strOf(l.get("transport"))];
      best = std::max(best, v);
    }
  if (b.best.empty())
    return Status::InvalidArgument("--baseline " + from + " has no links between hosts (a run on one host?)");
  return b;
}

std::vector<Finding> analyse(const Data& d) {
  std::vector<Finding> out;
  const HostLayout h = layOut(d.ranks);
  localFindings(d, h, out);
  bool ibExplained = false;
  for (const Finding& f : out) ibExplained |= f.subject.rfind("ib on ", 0) == 0;
  transportFindings(d, h, ibExplained, out);
  // Clocks: each host against rank 0's.
  for (std::size_t k = 1; k < h.names.size(); ++k) {
    const int r = h.ranks[k][0];
    if (d.pairs.empty() || !d.pairs[0][r].measured) continue;
    const double off = d.pairs[0][r].clockOffsetUs;
    if (std::fabs(off) > 100e3) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "the clock of %s is %.3f s %s that of %s", h.names[k].c_str(), std::fabs(off) / 1e6,
                    off > 0 ? "ahead of" : "behind", h.names[0].c_str());
      out.push_back({"clock on host " + h.names[k], std::string(buf) + ": logs and traces of the hosts do not line up",
                     "synchronise the clocks (chrony or systemd-timesyncd, against the same servers)"});
    }
  }
  for (const RingFigure& r : d.rings)
    if (r.wrong)
      out.push_back({"all-reduce results", std::to_string(r.wrong) + " elements of the ring all-reduce differ from the exact sum",
                     "a bug or corrupted memory: rerun with BRAID_DEBUG=INFO and report it with the JSON output"});
  const std::vector<Finding> links = judgeLinks(h.names, hostLinks(d, h), d.slowRatio, {d.baseline, d.baselineFrom});
  out.insert(out.end(), links.begin(), links.end());
  return out;
}

std::vector<std::pair<int, int>> roundPairs(int n, int r) {
  const int m = n + (n & 1);
  std::vector<std::pair<int, int>> out;
  auto add = [&](int a, int b) {
    if (a < n && b < n) out.emplace_back(std::min(a, b), std::max(a, b));
  };
  add(r, m - 1);
  for (int k = 1; k < m / 2; ++k) add((r + k) % (m - 1), (r - k + m - 1) % (m - 1));
  return out;
}

std::vector<std::vector<std::pair<int, int>>> measurementRounds(const HostLayout& h, int n, bool oneAtATime) {
  if (oneAtATime) {
    std::vector<std::vector<std::pair<int, int>>> single;
    for (const auto& round : measurementRounds(h, n, false))
      for (auto pair : round) single.push_back({pair});
    return single;
  }
  std::vector<std::vector<std::pair<int, int>>> rounds;
  const int hosts = static_cast<int>(h.names.size());
  if (!measuresByHost(h, n)) {
    for (int r = 0; r < roundsFor(n); ++r) rounds.push_back(roundPairs(n, r));
    return rounds;
  }
  for (int r = 0; r < roundsFor(hosts); ++r) {
    std::vector<std::pair<int, int>> round;
    for (auto [a, b] : roundPairs(hosts, r)) {
      const int x = h.ranks[static_cast<std::size_t>(a)][0], y = h.ranks[static_cast<std::size_t>(b)][0];
      round.emplace_back(std::min(x, y), std::max(x, y));
    }
    rounds.push_back(round);
  }
  std::vector<std::pair<int, int>> within;
  for (const auto& ranks : h.ranks)
    if (ranks.size() > 1) within.emplace_back(ranks[0], ranks[1]);
  if (!within.empty()) rounds.push_back(within);
  return rounds;
}

}  // namespace braid::tools::doctor
