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
  // The L3 cache of this process's CPUs (the smallest, when they span several L3 domains), as the
  // system reports it: the kernel's per-domain description (sysfs cache/index*/ with
  // shared_cpu_list), else hwloc's L3 objects that cover these CPUs, else sysconf's one figure for
  // the whole machine. 0 when unknown.
  std::size_t l3Bytes = 0;
  int l3SharedBy = 0;       // logical CPUs sharing that L3 domain; 0 when the source does not say
  std::string l3Source;     // where l3Bytes came from and what it covers, in words (braid info)
  // Whether tuning believes l3Bytes: a virtual machine passes on whatever its hypervisor's CPUID
  // says, which can be a whole socket's figure (or more) for each vCPU. No CPU made has more than
  // kMaxPlausibleL3PerCpu of L3 per logical CPU sharing it, so a figure above that is doubtful, as is
  // sysconf's machine-wide figure on a hypervisor (it says nothing of who shares it).
  bool l3Plausible = false;
  bool hypervisor = false;  // the CPU says it runs under one (cpuinfo's "hypervisor" flag)
};

// Above any CPU's L3 per logical CPU (the largest: 96 MiB for 8 cores, 16 threads, of a V-Cache die).
inline constexpr std::size_t kMaxPlausibleL3PerCpu = std::size_t{32} << 20;
// The L3 tuning assumes when the machine's figure is unknown or doubtful: the 32 MiB the cache-
// dependent switch points were measured with (docs/PERFORMANCE.md).
inline constexpr std::size_t kAssumedL3Bytes = std::size_t{32} << 20;

// The L3 figure tuning uses: summary().l3Bytes when known and plausible, else kAssumedL3Bytes.
std::size_t tuningL3Bytes();

// Whether an L3 of `bytes` shared by `sharedBy` logical CPUs (0: the source does not say) is one
// that tuning believes, on a host that is (`hypervisor`) or is not a virtual machine.
bool plausibleL3(std::size_t bytes, int sharedBy, bool hypervisor);

// A cache size as sysfs writes it ("32768K", "8M", "512"), in bytes; 0 for text it cannot read.
std::size_t parseCacheSize(const std::string& text);

// Discovered once per process (hwloc's discovery costs milliseconds) and cached.
const Summary& summary();

// The logical CPUs (as the kernel numbers them) this process may run on now: its affinity mask.
std::vector<int> allowedCpus();

// The physical cores this process may run on, each as the list of its allowed logical CPUs (one,
// or its hardware threads), in hwloc's order: the cores of one package and NUMA node next to each
// other. Without hwloc every allowed CPU counts as a core. Discovered on each call.
std::vector<std::vector<int>> allowedCores();

// The NUMA nodes the logical CPUs `cpus` belong to (from /sys/devices/system/node), ascending;
// empty when the system does not say.
std::vector<int> numaNodesOf(const std::vector<int>& cpus);

// Linux's CPU list text ("0-3,8,10-11"), as taskset -c and /sys write it, and back. parseCpuList
// returns an empty list for text it cannot read.
std::string cpuListText(const std::vector<int>& cpus);
std::vector<int> parseCpuList(const std::string& text);

}  // namespace braid::topology
