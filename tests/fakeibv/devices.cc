// fakeibv's devices and ports, from FAKEIBV_DEVICES:
//
//   FAKEIBV_DEVICES = DEVICE[;DEVICE...]         unset: one device "fib0" with one ACTIVE IB port;
//   DEVICE          = NAME[:PORT[:PORT...]]      set but empty: no device at all
//   PORT            = KEY=VALUE[,KEY=VALUE...]   (a NAME alone has one default port)
//     state=active|down|init   link=ib|eth   mtu=256|512|1024|2048|4096   lid=N   numa=N (the device's)
//     odp=none|explicit|implicit (the device's on-demand paging; default implicit, as ConnectX-5 on)
//
// LIDs not given are made from the hostname, so processes on one (test) host share a port and
// those on different hosts do not. An Ethernet (RoCE) port's GID table holds, like a real one,
// RoCE v1 and v2 entries for a link-local address and then for the host's first IPv4 address.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

#include "tests/fakeibv/objects.h"

namespace fakeibv {
namespace {

std::uint32_t hostHash(int salt) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::uint32_t h = 2166136261u;
  for (const char* p = host; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
  return (h ^ static_cast<std::uint32_t>(salt)) * 16777619u;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    std::size_t k = s.find(sep, start);
    out.push_back(s.substr(start, k == std::string::npos ? std::string::npos : k - start));
    if (k == std::string::npos) return out;
    start = k + 1;
  }
}

ibv_mtu mtuOf(int bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
  }
}

void fillGids(Port& p, std::uint32_t hash) {
  ibv_gid local{};
  local.raw[0] = 0xfe;
  local.raw[1] = 0x80;
  std::memcpy(local.raw + 8, &hash, 4);
  std::uint32_t h2 = hash * 2654435761u;
  std::memcpy(local.raw + 12, &h2, 4);
  if (p.linkLayer == IBV_LINK_LAYER_INFINIBAND) {
    p.gids.push_back({local, IBV_GID_TYPE_IB});
    return;
  }
  p.gids.push_back({local, IBV_GID_TYPE_ROCE_V1});
  p.gids.push_back({local, IBV_GID_TYPE_ROCE_V2});
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK)) continue;
    ibv_gid v4{};
    v4.raw[10] = v4.raw[11] = 0xff;
    std::memcpy(v4.raw + 12, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, 4);
    p.gids.push_back({v4, IBV_GID_TYPE_ROCE_V1});
    p.gids.push_back({v4, IBV_GID_TYPE_ROCE_V2});
    break;
  }
  ::freeifaddrs(list);
}

Port parsePort(const std::string& spec, Device& d, int portIndex) {
  Port p;
  for (const std::string& kv : split(spec, ',')) {
    std::size_t eq = kv.find('=');
    if (kv.empty() || eq == std::string::npos) continue;
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "state") p.state = v == "down" ? IBV_PORT_DOWN : v == "init" ? IBV_PORT_INIT : IBV_PORT_ACTIVE;
    else if (k == "link") p.linkLayer = v == "eth" ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    else if (k == "mtu") p.mtu = mtuOf(std::atoi(v.c_str()));
    else if (k == "lid") p.lid = static_cast<std::uint16_t>(std::atoi(v.c_str()));
    else if (k == "numa") d.numa = std::atoi(v.c_str());
    else if (k == "odp") d.odp = v == "none" ? 0 : v == "explicit" ? 1 : 2;
  }
  std::uint32_t h = hostHash(d.index * 16 + portIndex);
  if (p.lid == 0) p.lid = static_cast<std::uint16_t>(1 + h % 0xbffe);
  fillGids(p, h);
  return p;
}

// A sysfs-like folder per device, so that programs that read <ibdev_path>/device/numa_node (to
// place a rank near its device) find one.
void writeSysfs(Device& d) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string base = dir() + "/sys";
  ::mkdir(base.c_str(), 0700);
  base += "/" + std::string(host);
  ::mkdir(base.c_str(), 0700);
  base += "/" + std::string(d.dev.name);
  ::mkdir(base.c_str(), 0700);
  ::mkdir((base + "/device").c_str(), 0700);
  std::ofstream(base + "/device/numa_node") << d.numa << "\n";
  std::snprintf(d.dev.ibdev_path, sizeof(d.dev.ibdev_path), "%s", base.c_str());
  std::snprintf(d.dev.dev_path, sizeof(d.dev.dev_path), "%s", base.c_str());
}

std::vector<Device*> makeDevices() {
  std::vector<Device*> out;
  const char* env = setting("FAKEIBV_DEVICES");
  std::string spec = env ? env : "fib0";
  if (spec.empty()) return out;
  for (const std::string& ds : split(spec, ';')) {
    if (ds.empty()) continue;
    std::vector<std::string> parts = split(ds, ':');
    auto* d = new Device();
    d->index = static_cast<int>(out.size());
    std::snprintf(d->dev.name, sizeof(d->dev.name), "%s", parts[0].c_str());
    std::snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", d->index);
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    if (parts.size() == 1) parts.push_back("");
    for (std::size_t i = 1; i < parts.size(); ++i) d->ports.push_back(parsePort(parts[i], *d, static_cast<int>(i)));
    d->guid = (static_cast<std::uint64_t>(hostHash(d->index)) << 32) | hostHash(~d->index);
    writeSysfs(*d);
    out.push_back(d);
  }
  return out;
}

}  // namespace

// Looked up again when FAKEIBV_DEVICES changed, as libibverbs rescans sysfs on each
// ibv_get_device_list (a forked child with other settings sees its own devices). Devices of an
// earlier list stay allocated: contexts opened on them may still be in use.
const std::vector<Device*>& devices() {
  static std::mutex mu;
  static std::vector<Device*> all;
  static std::string seen = "\x01never";
  std::lock_guard<std::mutex> g(mu);
  const char* env = setting("FAKEIBV_DEVICES");
  const std::string now = env ? env : "\x01unset";
  if (now != seen) {
    all = makeDevices();
    seen = now;
  }
  return all;
}

const Port* portOf(const Context* c, int port) {
  if (port < 1 || port > static_cast<int>(c->device->ports.size())) return nullptr;
  return &c->device->ports[static_cast<std::size_t>(port - 1)];
}

}  // namespace fakeibv
