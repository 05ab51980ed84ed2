// What Braid needs to know about the machine. This is the only place that includes hwloc.h.
#pragma once
#include <string>

namespace braid::topology {

struct Summary {
  int cores = 1;        // physical cores this process may run on
  int pus = 1;          // hardware threads (logical CPUs) this process may run on
  int numaNodes = 1;
  std::string cpuModel; // as hwloc reports it, may be empty
};

// Discovered once per process (hwloc's discovery costs milliseconds) and cached.
const Summary& summary();

}  // namespace braid::topology
