// `braid doctor`'s local checks: what a rank can find out about its own host before it joins the
// communicator (/dev/shm, limits, interfaces and their routes, ib ports, BRAID_* settings), and the
// text form in which the facts travel to rank 0.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "braid_build_config.h"
#include "base/capability.h"
#include "base/socket.h"
#include "tools/doctor.h"
#include "topology/topology.h"
#include "transport/registry.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_transport.h"
#if BRAID_HAVE_IBVERBS
#include "transport/ib/ib_port.h"
#include "transport/ib/ib_transport.h"
#endif

namespace braid::tools::doctor {
namespace {

std::uint64_t limitOf(int resource) {
  rlimit r{};
  if (::getrlimit(resource, &r) != 0) return 0;
  return r.rlim_cur == RLIM_INFINITY ? kUnlimited : static_cast<std::uint64_t>(r.rlim_cur);
}

int readInt(const std::string& path, int fallback) {
  std::ifstream f(path);
  int v = fallback;
  if (f >> v) return v;
  return fallback;
}

// Whether the subnet of `addr`/`prefix` routes through the interface that has it: the kernel's
// answer for another address of that subnet (a UDP connect sends nothing).
std::string routeOf(in_addr_t addrHost, int prefix) {
  if (prefix <= 0 || prefix >= 31) return "";
  const in_addr_t mask = ~in_addr_t{0} << (32 - prefix);
  in_addr_t other = (addrHost & mask) | ((addrHost + 1) & ~mask);
  if ((other & ~mask) == 0 || (other & ~mask) == ~mask) other = (addrHost & mask) | 1;
  if (other == addrHost) other = (addrHost & mask) | 2;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9);
  sa.sin_addr.s_addr = htonl(other);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  const int err = errno;
  ::close(fd);
  if (rc == 0) return "";
  if (err == EINVAL) return "blackhole";
  if (err == EACCES || err == EPERM) return "prohibited";
  if (err == ENETUNREACH || err == EHOSTUNREACH) return "unreachable";
  return std::strerror(err);
}

std::vector<Iface> interfaces() {
  std::vector<Iface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    Iface f;
    f.name = i->ifa_name;
    const in_addr a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a, text, sizeof(text));
    f.addr = text;
    if (i->ifa_netmask)
      f.prefix = __builtin_popcount(reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
    f.up = (i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING);
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", i->ifa_name);
    if (fd >= 0 && ::ioctl(fd, SIOCGIFMTU, &req) == 0) f.mtu = req.ifr_mtu;
    if (!(i->ifa_flags & IFF_LOOPBACK) && f.up) f.route = routeOf(ntohl(a.s_addr), f.prefix);
    out.push_back(f);
  }
  if (fd >= 0) ::close(fd);
  ::freeifaddrs(list);
  return out;
}

std::string digest(const std::string& s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "(digest %08zx)", std::hash<std::string>{}(s) & 0xffffffffu);
  return buf;
}

}  // namespace

RankFacts collectLocal(const Config& config, const std::string& storeIp, int nranks, int localRanks) {
  RankFacts f;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  f.host = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, f.bootId);
  f.pid = static_cast<int>(::getpid());
  const std::vector<int> cpus = topology::allowedCpus();
  f.cpus = topology::cpuListText(cpus);
  f.numa = topology::cpuListText(topology::numaNodesOf(cpus));

  // What jobs killed during set-up left behind goes first, so the free space below is the real one.
  const ShmSegment::Leftovers gone = ShmSegment::removeLeftovers();
  f.shmLeftovers = gone.removed;
  f.shmLeftoverBytes = gone.removedBytes;
  f.shmLeftoverPids = gone.removedPids;
  struct statvfs vfs{};
  if (::statvfs("/dev/shm", &vfs) == 0) {
    f.shmSize = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    f.shmFree = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  f.localRanks = localRanks;
  f.shmNeed = ShmTransport::hostBytes(config, nranks, localRanks);
  f.ptraceScope = readInt("/proc/sys/kernel/yama/ptrace_scope", -1);

  f.memlock = limitOf(RLIMIT_MEMLOCK);
#if BRAID_HAVE_IBVERBS
  f.memlockNeed = IbTransport::lockedBytes(config);
#endif
  f.ipcLock = hasCapability(kCapIpcLock);
  f.nofile = limitOf(RLIMIT_NOFILE);
  // tcp's sockets to every peer, the store's, and room for the program's own files.
  f.nofileNeed = static_cast<std::uint64_t>(nranks) * static_cast<std::uint64_t>(config.nsocks + 1) + 64;

  f.ifaces = interfaces();
  f.ifSpec = config.socketIfname;
  std::string tcpAddr;
  if (!config.socketIfname.empty()) {
    auto a = net::addressForInterfaces(config.socketIfname);
    if (!a.ok()) {
      f.ifSpecProblem = a.status().message();
    } else {
      tcpAddr = *a;
      for (const Iface& i : f.ifaces)
        if (i.addr == tcpAddr && !i.route.empty())
          f.ifSpecProblem = "BRAID_SOCKET_IFNAME='" + config.socketIfname + "' picks " + i.name + " (" + i.addr +
                            "), whose subnet routes to a " + i.route + " here: peers cannot connect through it";
    }
  }
  if (tcpAddr.empty() || !f.ifSpecProblem.empty()) {
    auto a = net::localAddressToward(storeIp);
    tcpAddr = a.ok() ? *a : "";
  }
  f.tcpAddr = tcpAddr;
  for (const Iface& i : f.ifaces)
    if (i.addr == tcpAddr) {
      f.tcpIface = i.name;
      f.tcpMtu = i.mtu;
    }
  if (!f.tcpIface.empty()) f.nicNuma = readInt("/sys/class/net/" + f.tcpIface + "/device/numa_node", -1);

  // Each transport's own verdict on this host, as the communicator's selection sees it.
  for (auto& t : makeTransports(config)) {
    const Availability a = t->probe();
    if (t->name() == "shm") f.shmProbe = a.usable ? "" : a.reason;
    if (t->name() == "ib") f.ibProbe = a.usable ? "" : a.reason;
  }
  f.ibDisabled = config.ibDisable;
#if BRAID_HAVE_IBVERBS
  if (!config.ibDisable) {
    auto v = Verbs::load(config.ibverbsLib);
    if (v.ok()) {
      PortSearch ports = findPorts(**v, config);
      for (const IbPort& p : ports.seen) {
        IbPortFact pf;
        pf.name = p.name();
        pf.state = stateName(p.attr.state);
        pf.link = p.ethernet() ? "eth" : "ib";
        pf.mtu = 128 << p.attr.active_mtu;
        pf.numa = p.numa;
        for (const IbPort& a : ports.ports)
          if (a.name() == p.name()) pf.gidIndex = a.gidIndex;
        f.ibPorts.push_back(pf);
      }
    }
  }
#else
  f.ibProbe = "not built (the libibverbs-dev headers were missing when this build was configured)";
#endif
  for (const ConfigRow& row : describeConfig())
    if (!row.current.empty())
      f.settings.emplace_back(row.name, std::string(row.name) == "BRAID_SECRET" ? digest(row.current) : row.current);
  return f;
}

// The text form: one "key<TAB>field<TAB>field..." line per fact; lists repeat their key. Values
// never hold tabs or newlines (they are replaced by spaces).
std::string RankFacts::serialize() const {
  std::ostringstream o;
  auto clean = [](std::string s) {
    for (char& c : s)
      if (c == '\t' || c == '\n') c = ' ';
    return s;
  };
  auto line = [&](const char* key, std::initializer_list<std::string> fields) {
    o << key;
    for (const std::string& v : fields) o << '\t' << clean(v);
    o << '\n';
  };
  auto n = [](auto v) { return std::to_string(v); };
  line("rank", {n(rank), host, bootId, n(pid), n(cmaAddr), cpus, numa});
  line("shm", {n(shmSize), n(shmFree), n(shmNeed), n(localRanks), n(shmOffByDoctor ? 1 : 0), shmProbe, n(shmLeftovers),
               n(shmLeftoverBytes), shmLeftoverPids});
  line("cma", {n(ptraceScope), cmaRefused, unreachable});
  line("limits", {n(memlock), n(memlockNeed), n(ipcLock ? 1 : 0), n(nofile), n(nofileNeed)});
  line("net", {ifSpec, ifSpecProblem, tcpIface, tcpAddr, n(tcpMtu), n(nicNuma)});
  for (const Iface& i : ifaces) line("iface", {i.name, i.addr, n(i.prefix), n(i.mtu), n(i.up ? 1 : 0), i.route});
  line("ib", {n(ibDisabled ? 1 : 0), ibProbe});
  for (const IbPortFact& p : ibPorts) line("ibport", {p.name, p.state, p.link, n(p.mtu), n(p.gidIndex), n(p.numa)});
  for (const auto& [k, v] : settings) line("setting", {k, v});
  for (std::size_t p = 0; p < transportTo.size(); ++p) line("peer", {transportTo[p], p < skippedTo.size() ? skippedTo[p] : ""});
  // The peers not connected at creation, as ranges ("3-9,12"): a few a rank, not one line a peer.
  std::string later;
  for (std::size_t p = 0; p < connectedTo.size(); ++p) {
    if (connectedTo[p]) continue;
    std::size_t q = p;
    while (q + 1 < connectedTo.size() && !connectedTo[q + 1]) ++q;
    if (!later.empty()) later += ',';
    later += n(static_cast<long long>(p));
    if (q > p) {
      later += '-';
      later += n(static_cast<long long>(q));
    }
    p = q;
  }
  line("connected", {n(static_cast<long long>(connectedTo.size())), later});
  return o.str();
}

RankFacts RankFacts::parse(const std::string& text) {
  RankFacts f;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) {
    std::vector<std::string> v;
    std::size_t at = 0;
    for (std::size_t tab; (tab = l.find('\t', at)) != std::string::npos; at = tab + 1) v.push_back(l.substr(at, tab - at));
    v.push_back(l.substr(at));
    auto s = [&](std::size_t i) { return i < v.size() ? v[i] : std::string(); };
    auto i64 = [&](std::size_t i) { return static_cast<long long>(std::strtoll(s(i).c_str(), nullptr, 10)); };
    auto u64 = [&](std::size_t i) { return static_cast<std::uint64_t>(std::strtoull(s(i).c_str(), nullptr, 10)); };
    auto in32 = [&](std::size_t i) { return static_cast<int>(i64(i)); };
    const std::string& key = v[0];
    if (key == "rank") {
      f.rank = in32(1), f.host = s(2), f.bootId = s(3), f.pid = in32(4), f.cmaAddr = u64(5), f.cpus = s(6), f.numa = s(7);
    } else if (key == "shm") {
      f.shmSize = u64(1), f.shmFree = u64(2), f.shmNeed = u64(3), f.localRanks = in32(4), f.shmOffByDoctor = in32(5) != 0;
      f.shmProbe = s(6), f.shmLeftovers = in32(7), f.shmLeftoverBytes = u64(8), f.shmLeftoverPids = s(9);
    } else if (key == "cma") {
      f.ptraceScope = in32(1), f.cmaRefused = s(2), f.unreachable = s(3);
    } else if (key == "limits") {
      f.memlock = u64(1), f.memlockNeed = u64(2), f.ipcLock = in32(3) != 0, f.nofile = u64(4), f.nofileNeed = u64(5);
    } else if (key == "net") {
      f.ifSpec = s(1), f.ifSpecProblem = s(2), f.tcpIface = s(3), f.tcpAddr = s(4), f.tcpMtu = in32(5), f.nicNuma = in32(6);
    } else if (key == "iface") {
      f.ifaces.push_back({s(1), s(2), in32(3), in32(4), in32(5) != 0, s(6)});
    } else if (key == "ib") {
      f.ibDisabled = in32(1) != 0, f.ibProbe = s(2);
    } else if (key == "ibport") {
      f.ibPorts.push_back({s(1), s(2), s(3), in32(4), in32(5), in32(6)});
    } else if (key == "setting") {
      f.settings.emplace_back(s(1), s(2));
    } else if (key == "peer") {
      f.transportTo.push_back(s(1));
      f.skippedTo.push_back(s(2));
    } else if (key == "connected") {
      f.connectedTo.assign(static_cast<std::size_t>(std::max(0LL, std::min(i64(1), 1LL << 24))), true);
      std::istringstream ranges(s(2));
      for (std::string r; std::getline(ranges, r, ',');) {
        const long long lo = std::strtoll(r.c_str(), nullptr, 10);
        const std::size_t dash = r.find('-');
        const long long hi = dash == std::string::npos ? lo : std::strtoll(r.c_str() + dash + 1, nullptr, 10);
        for (long long p = std::max(0LL, lo); p <= hi && p < static_cast<long long>(f.connectedTo.size()); ++p)
          f.connectedTo[static_cast<std::size_t>(p)] = false;
      }
    }
  }
  return f;
}

}  // namespace braid::tools::doctor
