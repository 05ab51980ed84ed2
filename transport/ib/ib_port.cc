#include "transport/ib/ib_port.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "topology/topology.h"

namespace braid {

const char* stateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    default: return "not ACTIVE";
  }
}

namespace {

int deviceNuma(ibv_device* d) {
  std::ifstream f(std::string(d->ibdev_path) + "/device/numa_node");
  int n = -1;
  if (f >> n) return n;
  return -1;
}

bool zeroGid(const ibv_gid& g) {
  static const ibv_gid zero{};
  return std::memcmp(&g, &zero, sizeof(g)) == 0;
}

bool ipv4Mapped(const ibv_gid& g) {
  static const std::uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}

}  // namespace

HcaFilter HcaFilter::parse(const std::string& text) {
  HcaFilter f;
  std::string s = text;
  if (!s.empty() && s[0] == '^') f.exclude = true, s.erase(0, 1);
  if (!s.empty() && s[0] == '=') f.exact = true, s.erase(0, 1);
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      std::size_t colon = item.find(':');
      int port = colon == std::string::npos ? -1 : std::atoi(item.c_str() + colon + 1);
      f.items.emplace_back(item.substr(0, colon), port);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return f;
}

bool HcaFilter::matches(const std::string& device, int port) const {
  if (items.empty()) return true;
  bool any = false;
  for (const auto& [name, p] : items) {
    bool nameOk = exact ? device == name : device.compare(0, name.size(), name) == 0;
    if (nameOk && (p < 0 || p == port)) any = true;
  }
  return exclude ? !any : any;
}

int chooseGidIndex(const Verbs& v, ibv_context* ctx, const IbPort& port, int wanted, ibv_gid* gid, int* type) {
  const int n = port.attr.gid_tbl_len;
  auto typeOf = [&](int i) {
    ibv_gid_entry e{};
    if (v.queryGidEx && v.queryGidEx(ctx, static_cast<std::uint32_t>(port.port), static_cast<std::uint32_t>(i), &e, 0,
                                     sizeof(e)) == 0)
      return static_cast<int>(e.gid_type);
    return static_cast<int>(port.ethernet() ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB);
  };
  auto take = [&](int i) {
    if (v.queryGid(ctx, static_cast<std::uint8_t>(port.port), i, gid) != 0 || zeroGid(*gid)) return false;
    *type = typeOf(i);
    return true;
  };
  if (wanted >= 0) return wanted < n && take(wanted) ? wanted : -1;
  if (!port.ethernet()) return take(0) ? 0 : -1;
  int best = -1, bestScore = -1;
  for (int i = 0; i < n; ++i) {
    ibv_gid g{};
    if (v.queryGid(ctx, static_cast<std::uint8_t>(port.port), i, &g) != 0 || zeroGid(g)) continue;
    int t = typeOf(i);
    int score = (t == IBV_GID_TYPE_ROCE_V2 ? 2 : 0) + (ipv4Mapped(g) ? 1 : 0);
    if (score > bestScore) best = i, bestScore = score;
  }
  return best >= 0 && take(best) ? best : -1;
}

PortSearch findPorts(const Verbs& v, const Config& config) {
  PortSearch out;
  int n = 0;
  errno = 0;
  ibv_device** list = v.getDeviceList(&n);
  if (!list) {
    out.whyNone = std::string("no InfiniBand device: ibv_get_device_list failed (") + std::strerror(errno) +
                  "): no RDMA driver is loaded, or /dev/infiniband is not visible here (containers need it passed in)";
    return out;
  }
  if (n == 0) {
    v.freeDeviceList(list);
    out.whyNone = "no InfiniBand device found (no RDMA driver, or /dev/infiniband is not visible in this container)";
    return out;
  }
  const HcaFilter filter = HcaFilter::parse(config.ibHca);
  std::vector<std::string> rejected;
  for (int i = 0; i < n; ++i) {
    const std::string dev = v.getDeviceName(list[i]);
    ibv_context* ctx = v.openDevice(list[i]);
    if (!ctx) {
      rejected.push_back(dev + " (cannot open: " + std::strerror(errno) + ")");
      continue;
    }
    ibv_device_attr da{};
    if (v.queryDevice(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        IbPort port;
        port.device = dev;
        port.port = p;
        if (v.queryPort(ctx, static_cast<std::uint8_t>(p), &port.attr) != 0) continue;
        port.numa = deviceNuma(list[i]);
        out.seen.push_back(port);
        if (!filter.matches(dev, p)) {
          rejected.push_back(port.name() + " (not in BRAID_IB_HCA=" + config.ibHca + ")");
          continue;
        }
        if (port.attr.state != IBV_PORT_ACTIVE) {
          rejected.push_back(port.name() + " (" + stateName(port.attr.state) + ")");
          continue;
        }
        port.gidIndex = chooseGidIndex(v, ctx, port, config.ibGidIndex, &port.gid, &port.gidType);
        if (port.gidIndex < 0) {
          rejected.push_back(port.name() + (config.ibGidIndex >= 0 ? " (no GID at BRAID_IB_GID_INDEX=" +
                                                                         std::to_string(config.ibGidIndex) + ")"
                                                                   : " (no usable GID)"));
          continue;
        }
        if (!port.ethernet() && port.attr.lid == 0) {
          rejected.push_back(port.name() + " (no LID: is a subnet manager running?)");
          continue;
        }
        out.ports.push_back(port);
      }
    }
    v.closeDevice(ctx);
  }
  v.freeDeviceList(list);
  if (out.ports.empty()) {
    std::string all;
    for (const std::string& r : rejected) all += (all.empty() ? "" : ", ") + r;
    out.whyNone = "no ACTIVE port to use: " + (all.empty() ? std::string("the devices have no ports") : all);
    return out;
  }
  // Nearest first: ports whose device sits on a NUMA node of this process's CPUs.
  const std::vector<int> mine = topology::numaNodesOf(topology::allowedCpus());
  std::stable_sort(out.ports.begin(), out.ports.end(), [&](const IbPort& a, const IbPort& b) {
    auto near = [&](const IbPort& p) { return std::find(mine.begin(), mine.end(), p.numa) != mine.end(); };
    return near(a) && !near(b);
  });
  return out;
}

}  // namespace braid
