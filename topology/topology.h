// What Braid needs to know about the machine. This is the only place that includes hwloc.h.
#pragma once
#include <cstddef>
#include <string>

namespace braid::topology {

struct Summary {
  int cores = 1;        // physical cores this process may run on
  int pus = 1;          // hardware threads (logical CPUs) this process may run on
  int numaNodes = 1;
  std::string cpuModel; // as hwloc reports it, may be empty
  std::size_t l3Bytes = 0;  // the first last-level (L3) cache's size; 0 when unknown
};

// Discovered once per process (hwloc's discovery costs milliseconds) and cached.
const Summary& summary();

}  // namespace braid::topology
