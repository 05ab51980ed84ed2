#include "topology/topology.h"

#include "braid_build_config.h"
#if BRAID_HAVE_HWLOC
#include <hwloc.h>
#endif
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <mutex>

namespace braid::topology {

std::vector<int> allowedCpus() {
  std::vector<int> out;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

namespace {
// Every CPU as a core of its own: without hwloc, or when it finds no cores.
std::vector<std::vector<int>> oneCorePerCpu(const std::vector<int>& cpus) {
  std::vector<std::vector<int>> out;
  for (int c : cpus) out.push_back({c});
  return out;
}
}  // namespace

std::string cpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> numaNodesOf(const std::vector<int>& cpus) {
  std::vector<int> out;
  for (int node = 0; node < 4096; ++node) {
    std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
    if (!f) {
      if (node > 0) break;  // nodes are numbered from 0 without gaps on every kernel that has them
      continue;
    }
    std::string text;
    std::getline(f, text);
    for (int c : parseCpuList(text))
      if (std::find(cpus.begin(), cpus.end(), c) != cpus.end()) {
        out.push_back(node);
        break;
      }
  }
  return out;
}

std::vector<int> parseCpuList(const std::string& text) {
  constexpr int kMaxCpus = 1 << 16;  // far above any kernel's NR_CPUS
  std::vector<bool> in(kMaxCpus);
  const char* p = text.data();
  const char* end = p + text.size();
  if (p == end) return {};
  int first = kMaxCpus, last = -1;
  while (p < end) {
    int lo = 0, hi = 0;
    auto r = std::from_chars(p, end, lo);
    if (r.ec != std::errc() || lo < 0 || lo >= kMaxCpus) return {};
    p = r.ptr;
    hi = lo;
    if (p < end && *p == '-') {
      r = std::from_chars(p + 1, end, hi);
      if (r.ec != std::errc() || hi < lo || hi >= kMaxCpus) return {};
      p = r.ptr;
    }
    for (int c = lo; c <= hi; ++c) in[static_cast<std::size_t>(c)] = true;
    first = std::min(first, lo);
    last = std::max(last, hi);
    if (p < end && *p++ != ',') return {};
    if (p == end && p[-1] == ',') return {};  // a trailing comma
  }
  std::vector<int> out;
  for (int c = first; c <= last; ++c)
    if (in[static_cast<std::size_t>(c)]) out.push_back(c);
  return out;
}

namespace {

std::string firstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string mibText(std::size_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

// One L3 figure: the smallest of the domains that cover this process's CPUs.
struct L3Reading {
  std::size_t bytes = 0;
  int sharedBy = 0;   // CPUs in that domain
  std::string cpus;   // which, as a CPU list
  int domains = 0;    // how many domains cover this process's CPUs
};

void consider(L3Reading& r, std::size_t bytes, const std::vector<int>& sharing) {
  ++r.domains;
  if (r.bytes != 0 && bytes >= r.bytes) return;
  r.bytes = bytes;
  r.sharedBy = static_cast<int>(sharing.size());
  r.cpus = cpuListText(sharing);
}

// The kernel's description of each CPU's caches: cache/index*/{level,size,shared_cpu_list}.
L3Reading sysfsL3(const std::vector<int>& cpus) {
  std::map<std::string, std::size_t> domains;  // shared_cpu_list -> bytes
  for (int c : cpus) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/index";
    for (int i = 0; i < 16; ++i) {
      const std::string index = dir + std::to_string(i) + "/";
      const std::string level = firstLine(index + "level");
      if (level.empty()) break;
      if (level != "3") continue;
      const std::size_t bytes = parseCacheSize(firstLine(index + "size"));
      const std::string shared = firstLine(index + "shared_cpu_list");
      if (bytes != 0 && !shared.empty()) domains[shared] = bytes;
    }
  }
  L3Reading r;
  for (const auto& [shared, bytes] : domains) consider(r, bytes, parseCpuList(shared));
  return r;
}

bool cpuSaysHypervisor() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" hypervisor ") != std::string::npos;
  return false;
}

// Fills the L3 fields of `out` from sysfs, else `hwloc` (a reading, maybe empty), else sysconf.
void chooseL3(Summary& out, const L3Reading& hwloc) {
  out.hypervisor = cpuSaysHypervisor();
  const std::vector<int> cpus = allowedCpus();
  const std::string covering = " cover this process's CPUs (" + cpuListText(cpus) + ")";
  L3Reading r = sysfsL3(cpus);
  if (r.bytes != 0) {
    out.l3Source = "sysfs: " + std::to_string(r.domains) + " L3 domain(s)" + covering + "; the smallest " + mibText(r.bytes) +
                   ", shared by CPUs " + r.cpus;
  } else if (hwloc.bytes != 0) {
    r = hwloc;
    out.l3Source = "hwloc (no sysfs cache description, so from CPUID): " + std::to_string(r.domains) + " L3 object(s)" +
                   covering + "; the smallest " + mibText(r.bytes) + ", shared by CPUs " + r.cpus;
  } else if (const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) {
    r.bytes = static_cast<std::size_t>(l3);
    out.l3Source = "sysconf: one figure for the whole machine, sharing unknown";
  } else {
    out.l3Source = "unknown: neither sysfs, hwloc nor sysconf reports an L3";
  }
  out.l3Bytes = r.bytes;
  out.l3SharedBy = r.sharedBy;
  out.l3Plausible = plausibleL3(r.bytes, r.sharedBy, out.hypervisor);
}

}  // namespace

std::size_t parseCacheSize(const std::string& text) {
  std::size_t value = 0;
  const char* end = text.data() + text.size();
  const auto [unit, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || (unit != end && unit + 1 != end)) return 0;
  const int shift = unit == end ? 0 : *unit == 'K' ? 10 : *unit == 'M' ? 20 : *unit == 'G' ? 30 : -1;
  if (shift < 0 || value > (SIZE_MAX >> shift)) return 0;
  return value << shift;
}

bool plausibleL3(std::size_t bytes, int sharedBy, bool hypervisor) {
  if (bytes == 0) return false;
  if (sharedBy <= 0) return !hypervisor;  // a machine-wide figure says nothing of who shares it
  return bytes <= kMaxPlausibleL3PerCpu * static_cast<std::size_t>(sharedBy);
}

std::size_t tuningL3Bytes() {
  const Summary& s = summary();
  return s.l3Plausible ? s.l3Bytes : kAssumedL3Bytes;
}

#if !BRAID_HAVE_HWLOC
// Built without hwloc: the CPUs this process may run on count as cores and PUs alike (so
// oversubscription is detected a little later on SMT machines), and the model comes from /proc.
const Summary& summary() {
  static Summary* s = [] {
    auto* out = new Summary();
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) out->cores = out->pus = std::max(1, CPU_COUNT(&set));
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
        out->cpuModel = line.substr(line.find(':') + 2);
        break;
      }
    chooseL3(*out, {});
    return out;
  }();
  return *s;
}

std::vector<std::vector<int>> allowedCores() { return oneCorePerCpu(allowedCpus()); }
#else
const Summary& summary() {
  // Leaked on purpose: detached threads may still ask during process exit.
  static Summary* s = [] {
    auto* out = new Summary();
    L3Reading l3;
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) {
      chooseL3(*out, l3);
      return out;
    }
    if (hwloc_topology_load(topo) == 0) {
      out->cores = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
      out->pus = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
      out->numaNodes = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE));
      hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
      if (pkg) {
        const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel");
        if (model) out->cpuModel = model;
        out->cpuModel.erase(out->cpuModel.find_last_not_of(' ') + 1);  // some VMs pad it with spaces
      }
      // The L3 objects that cover any CPU this process may run on.
      const std::vector<int> allowed = allowedCpus();
      const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_L3CACHE);
      for (int i = 0; i < n; ++i) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L3CACHE, static_cast<unsigned>(i));
        if (!obj || !obj->attr || obj->attr->cache.size == 0) continue;
        std::vector<int> sharing;
        bool covers = false;
        for (int c = hwloc_bitmap_first(obj->cpuset); c >= 0; c = hwloc_bitmap_next(obj->cpuset, c)) {
          sharing.push_back(c);
          covers = covers || std::binary_search(allowed.begin(), allowed.end(), c);
        }
        if (covers) consider(l3, static_cast<std::size_t>(obj->attr->cache.size), sharing);
      }
    }
    hwloc_topology_destroy(topo);
    chooseL3(*out, l3);
    return out;
  }();
  return *s;
}

std::vector<std::vector<int>> allowedCores() {
  const std::vector<int> allowed = allowedCpus();
  std::vector<std::vector<int>> out;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return out;
  if (hwloc_topology_load(topo) == 0) {
    const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
      std::vector<int> cpus;
      for (int c : allowed)
        if (core && hwloc_bitmap_isset(core->cpuset, static_cast<unsigned>(c))) cpus.push_back(c);
      if (!cpus.empty()) out.push_back(std::move(cpus));
    }
  }
  hwloc_topology_destroy(topo);
  return out.empty() ? oneCorePerCpu(allowed) : out;  // no cores found: an unusual kernel or container
}
#endif

}  // namespace braid::topology
