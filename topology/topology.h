// What Braid needs to know about the machine. This is the only place that includes hwloc.h.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

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

// The logical CPUs (as the kernel numbers them) this process may run on now: its affinity mask.
std::vector<int> allowedCpus();

// The physical cores this process may run on, each as the list of its allowed logical CPUs (one,
// or its hardware threads), in hwloc's order: the cores of one package and NUMA node next to each
// other. Without hwloc every allowed CPU counts as a core. Discovered on each call.
std::vector<std::vector<int>> allowedCores();

// Linux's CPU list text ("0-3,8,10-11"), as taskset -c and /sys write it, and back. parseCpuList
// returns an empty list for text it cannot read.
std::string cpuListText(const std::vector<int>& cpus);
std::vector<int> parseCpuList(const std::string& text);

}  // namespace braid::topology
