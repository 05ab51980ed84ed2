#include "topology/topology.h"

#include "braid_build_config.h"
#if BRAID_HAVE_HWLOC
#include <hwloc.h>
#else
#include <unistd.h>

#include <fstream>
#endif
#include <sched.h>

#include <algorithm>
#include <charconv>
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
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    out->l3Bytes = l3 > 0 ? static_cast<std::size_t>(l3) : 0;
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
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return out;
    if (hwloc_topology_load(topo) == 0) {
      out->cores = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
      out->pus = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
      out->numaNodes = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE));
      hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
      if (pkg) {
        const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel");
        if (model) out->cpuModel = model;
      }
      hwloc_obj_t l3 = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L3CACHE, 0);
      if (l3 && l3->attr) out->l3Bytes = static_cast<std::size_t>(l3->attr->cache.size);
    }
    hwloc_topology_destroy(topo);
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
