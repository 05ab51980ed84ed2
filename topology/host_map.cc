// describeHost(): the whole host for `braid topo`, from hwloc (with its I/O scan), else from sysfs
// and /proc. Apart from topology.cc, the only file that includes hwloc.h.
#include "braid_build_config.h"
#include "topology/topology.h"
#if BRAID_HAVE_HWLOC
#include <hwloc.h>
#endif
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace braid::topology {

namespace {

std::string hostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::string trimmed(std::string s) {
  s.erase(s.find_last_not_of(" \t") + 1);  // some VMs pad the CPU model with spaces
  s.erase(0, std::min(s.size(), s.find_first_not_of(" \t")));
  return s;
}

HostMap::Binding thisProcess() {
  HostMap::Binding b;
  b.cpus = allowedCpus();
  b.numaNodes = numaNodesOf(b.cpus);
  return b;
}

void markL3(HostMap& m) {
  for (HostMap::Cache& c : m.l3)
    c.plausible = plausibleL3(c.bytes, static_cast<int>(parseCpuList(c.cpus).size()), m.hypervisor);
}

void sortDevices(std::vector<HostMap::Device>& devices) {
  std::stable_sort(devices.begin(), devices.end(), [](const HostMap::Device& a, const HostMap::Device& b) {
    return a.kind != b.kind ? a.kind > b.kind : a.name < b.name;  // "net" before "ib", then by name
  });
}

const char* const kGpuPciRule = "NVIDIA display and 3D controllers, vendor 0x10de, PCI class 0x0300 or 0x0302";

std::string firstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int number(const std::string& text, int otherwise) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 0);
  return end == text.c_str() || v < INT_MIN || v > INT_MAX ? otherwise : static_cast<int>(v);
}

bool isPciBusId(const std::string& s) {  // dddd:bb:dd.f in hex
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (std::size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11})
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// The deepest PCI device on the sysfs path of a class device's `device` link, as {bus id, its dir}.
std::pair<std::string, std::string> pciDirOf(const std::string& deviceLink) {
  char real[PATH_MAX];
  if (!realpath(deviceLink.c_str(), real)) return {};
  const std::string path = real;
  std::pair<std::string, std::string> out;
  for (std::size_t start = 1; start < path.size();) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    if (const std::string part = path.substr(start, end - start); isPciBusId(part)) out = {part, path.substr(0, end)};
    start = end + 1;
  }
  return out;
}

// A device from its sysfs `device` link: its PCI bus id and that device's numa_node (-1 means the
// kernel does not say; on a host of one NUMA node every device is on it, as hwloc also reports).
HostMap::Device sysfsDevice(const std::string& name, const char* kind, const std::string& deviceLink,
                            const HostMap& m) {
  HostMap::Device d;
  d.name = name;
  d.kind = kind;
  const auto [bus, dir] = pciDirOf(deviceLink);
  d.pciBusId = bus;
  d.numaNode = number(firstLine((dir.empty() ? deviceLink : dir) + "/numa_node"), -1);
  if (d.numaNode < 0 && m.numaNodes.size() == 1) d.numaNode = m.numaNodes[0].osIndex;
  return d;
}

// The host from sysfs and /proc: without hwloc, or when it fails. `source` says which.
HostMap sysfsHost(const std::string& source) {
  HostMap m;
  m.hostName = hostName();
  m.hypervisor = summary().hypervisor;
  m.binding = thisProcess();
  m.source = source;
  std::vector<int> online = parseCpuList(firstLine("/sys/devices/system/cpu/online"));
  if (online.empty()) online = allowedCpus();
  m.pus = static_cast<int>(online.size());
  // Packages and cores from each CPU's topology/, models from /proc/cpuinfo.
  std::map<int, std::string> models;  // physical id -> model name
  {
    std::ifstream f("/proc/cpuinfo");
    std::string model;
    for (std::string line; std::getline(f, line);) {
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string key = trimmed(line.substr(0, colon)), value = trimmed(line.substr(colon + 1));
      if (key == "model name") model = value;
      if (key == "physical id") models.emplace(number(value, 0), model);
    }
    if (models.empty() && !model.empty()) models[0] = model;
  }
  std::map<int, std::vector<int>> packages;
  std::set<std::string> cores;
  for (int c : online) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    packages[number(firstLine(dir + "physical_package_id"), 0)].push_back(c);
    std::string siblings = firstLine(dir + "core_cpus_list");
    if (siblings.empty()) siblings = firstLine(dir + "thread_siblings_list");
    cores.insert(siblings.empty() ? std::to_string(c) : siblings);
  }
  m.cores = std::max<int>(1, static_cast<int>(cores.size()));
  for (const auto& [id, cpus] : packages) {
    const auto model = models.count(id) ? models[id] : models.empty() ? "" : models.begin()->second;
    m.packages.push_back({id, model, cpuListText(cpus)});
  }
  for (const std::string& name : listDir("/sys/devices/system/node")) {
    if (name.rfind("node", 0) != 0 || number(name.substr(4), -1) < 0) continue;
    HostMap::NumaNode n;
    n.osIndex = number(name.substr(4), 0);
    n.cpus = firstLine("/sys/devices/system/node/" + name + "/cpulist");
    std::ifstream f("/sys/devices/system/node/" + name + "/meminfo");  // "Node 0 MemTotal:  9660152 kB"
    for (std::string line; std::getline(f, line);)
      if (const std::size_t at = line.find("MemTotal:"); at != std::string::npos)
        n.memoryBytes = std::strtoull(line.c_str() + at + 9, nullptr, 10) << 10;
    m.numaNodes.push_back(n);
  }
  std::sort(m.numaNodes.begin(), m.numaNodes.end(), [](auto& a, auto& b) { return a.osIndex < b.osIndex; });
  if (m.numaNodes.empty()) {  // a kernel without NUMA support: one node, all of the memory
    HostMap::NumaNode n;
    n.cpus = cpuListText(online);
    std::ifstream f("/proc/meminfo");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("MemTotal:", 0) == 0) n.memoryBytes = std::strtoull(line.c_str() + 9, nullptr, 10) << 10;
    m.numaNodes.push_back(n);
  }
  // L3 domains: the kernel's cache description, one entry per distinct shared_cpu_list.
  std::map<std::string, std::uint64_t> l3;
  for (int c : online)
    for (int i = 0; i < 16; ++i) {
      const std::string index = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/index" + std::to_string(i) + "/";
      const std::string level = firstLine(index + "level");
      if (level.empty()) break;
      const std::string shared = firstLine(index + "shared_cpu_list");
      if (level == "3" && !shared.empty()) l3[shared] = parseCacheSize(firstLine(index + "size"));
    }
  for (const auto& [cpus, bytes] : l3) m.l3.push_back({bytes, cpus, true});
  std::sort(m.l3.begin(), m.l3.end(), [](auto& a, auto& b) { return parseCpuList(a.cpus) < parseCpuList(b.cpus); });
  markL3(m);
  // Network interfaces with a device behind them, and RDMA devices.
  for (const std::string& name : listDir("/sys/class/net"))
    if (access(("/sys/class/net/" + name + "/device").c_str(), F_OK) == 0)
      m.nics.push_back(sysfsDevice(name, "net", "/sys/class/net/" + name + "/device", m));
  for (const std::string& name : listDir("/sys/class/infiniband"))
    m.nics.push_back(sysfsDevice(name, "ib", "/sys/class/infiniband/" + name + "/device", m));
  sortDevices(m.nics);
  for (const std::string& bus : listDir("/sys/bus/pci/devices")) {
    const std::string dir = "/sys/bus/pci/devices/" + bus;
    const int cls = number(firstLine(dir + "/class"), 0) >> 8;
    if (number(firstLine(dir + "/vendor"), 0) != 0x10de || (cls != 0x0300 && cls != 0x0302)) continue;
    HostMap::Device d = sysfsDevice(bus, "gpu", dir, m);
    char model[32];
    std::snprintf(model, sizeof(model), "NVIDIA 10de:%04x", number(firstLine(dir + "/device"), 0));
    d.model = model;
    m.gpus.push_back(d);
  }
  m.gpuSearch = std::string("/sys/bus/pci/devices for ") + kGpuPciRule;
  return m;
}

}  // namespace

#if BRAID_HAVE_HWLOC
namespace {

std::string bitmapText(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  for (int c = hwloc_bitmap_first(set); c >= 0; c = hwloc_bitmap_next(set, c)) cpus.push_back(c);
  return cpuListText(cpus);
}

// The NUMA node an I/O object is attached to: the nodeset of its first non-I/O ancestor, when that
// is one node (hwloc attaches devices of unknown locality to the machine, whose nodeset is all).
int numaNodeOf(hwloc_topology_t topo, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

std::string busId(hwloc_obj_t pci) {
  char text[32];
  std::snprintf(text, sizeof(text), "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return text;
}

// The PCI device an OS device sits on (its parent, mostly), or null.
hwloc_obj_t pciOf(hwloc_obj_t obj) {
  for (; obj; obj = obj->parent)
    if (obj->type == HWLOC_OBJ_PCI_DEVICE) return obj;
  return nullptr;
}

template <typename OsdevType>
bool osdevIs(hwloc_obj_t obj, OsdevType type) {
#if HWLOC_API_VERSION >= 0x00030000
  return (obj->attr->osdev.types & type) != 0;  // hwloc 3: a device may have several types
#else
  return obj->attr->osdev.type == type;
#endif
}

bool subtypeIs(hwloc_obj_t obj, const char* subtype) { return obj->subtype && std::string(obj->subtype) == subtype; }

std::string info(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? trimmed(v) : std::string();
}

HostMap::Device ioDevice(hwloc_topology_t topo, hwloc_obj_t obj, const char* kind) {
  HostMap::Device d;
  d.name = obj->name ? obj->name : "";
  d.kind = kind;
  d.numaNode = numaNodeOf(topo, obj);
  if (hwloc_obj_t pci = pciOf(obj)) d.pciBusId = busId(pci);
  return d;
}

void describeGpus(hwloc_topology_t topo, HostMap& m) {
  std::set<std::string> seen;
  int cudaDevices = 0;
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci; pci = hwloc_get_next_pcidev(topo, pci)) {
    const unsigned cls = pci->attr->pcidev.class_id;
    if (pci->attr->pcidev.vendor_id != 0x10de || (cls != 0x0300 && cls != 0x0302)) continue;
    HostMap::Device d = ioDevice(topo, pci, "gpu");
    d.name = d.pciBusId;
    d.model = info(pci, "PCIDevice");
    for (hwloc_obj_t child = pci->io_first_child; child; child = child->next_sibling) {
      if (child->type != HWLOC_OBJ_OS_DEVICE || !(subtypeIs(child, "CUDA") || subtypeIs(child, "NVML"))) continue;
      if (d.name == d.pciBusId || subtypeIs(child, "CUDA")) d.name = child->name ? child->name : d.name;
      if (!info(child, "GPUModel").empty()) d.model = info(child, "GPUModel");
      cudaDevices += subtypeIs(child, "CUDA");
    }
    if (d.model.empty()) {
      char id[32];
      std::snprintf(id, sizeof(id), "NVIDIA 10de:%04x", pci->attr->pcidev.device_id);
      d.model = id;
    }
    seen.insert(d.pciBusId);
    m.gpus.push_back(d);
  }
  // CUDA devices hwloc could not place on the PCI bus.
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    if (!subtypeIs(os, "CUDA")) continue;
    HostMap::Device d = ioDevice(topo, os, "gpu");
    if (!d.pciBusId.empty() && seen.count(d.pciBusId)) continue;
    d.model = info(os, "GPUModel");
    ++cudaDevices;
    m.gpus.push_back(d);
  }
  m.gpuSearch = cudaDevices > 0 ? "hwloc's CUDA devices and PCI scan"
                                : std::string("hwloc's PCI scan for ") + kGpuPciRule +
                                      "; this hwloc reports no CUDA devices: no CUDA plugin, or no driver loaded";
}

}  // namespace

HostMap describeHost() {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return sysfsHost("hwloc failed to start: sysfs and /proc");
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return sysfsHost("hwloc failed to load the topology: sysfs and /proc");
  }
  HostMap m;
  m.hostName = hostName();
  m.hypervisor = summary().hypervisor;
  m.binding = thisProcess();
  const std::string version = info(hwloc_get_root_obj(topo), "hwlocVersion");
  m.source = "hwloc " + (version.empty() ? std::to_string(HWLOC_API_VERSION >> 16) + "." +
                                               std::to_string((HWLOC_API_VERSION >> 8) & 0xff)
                                         : version);
  // The same counts as summary() (braid info), from the same hwloc defaults.
  m.cores = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  m.pus = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, o));)
    m.packages.push_back({static_cast<int>(o->logical_index), info(o, "CPUModel"), bitmapText(o->cpuset)});
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, o));)
    m.numaNodes.push_back({static_cast<int>(o->os_index), o->attr->numanode.local_memory, bitmapText(o->cpuset)});
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_L3CACHE, o));)
    m.l3.push_back({o->attr->cache.size, bitmapText(o->cpuset), true});
  markL3(m);
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    if (osdevIs(os, HWLOC_OBJ_OSDEV_OPENFABRICS))
      m.nics.push_back(ioDevice(topo, os, "ib"));
    else if (osdevIs(os, HWLOC_OBJ_OSDEV_NETWORK))
      m.nics.push_back(ioDevice(topo, os, "net"));
  }
  sortDevices(m.nics);
  describeGpus(topo, m);
  hwloc_topology_destroy(topo);
  return m;
}

#else
HostMap describeHost() { return sysfsHost("no hwloc in this build: sysfs and /proc"); }
#endif

}  // namespace braid::topology
