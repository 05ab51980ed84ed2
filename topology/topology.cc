#include "topology/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <mutex>

namespace braid::topology {

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
    }
    hwloc_topology_destroy(topo);
    return out;
  }();
  return *s;
}

}  // namespace braid::topology
