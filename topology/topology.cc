#include "topology/topology.h"

#include "braid_build_config.h"
#if BRAID_HAVE_HWLOC
#include <hwloc.h>
#else
#include <sched.h>
#include <unistd.h>

#include <fstream>
#endif

#include <algorithm>
#include <mutex>

namespace braid::topology {

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
#endif

}  // namespace braid::topology
