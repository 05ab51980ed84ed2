// What Braid needs to know about the machine. This is the only place that includes hwloc.h.
#pragma once
#include <cstddef>
#include <cstdint>
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

// The whole host as hwloc sees it (`braid topo`), else as sysfs and /proc describe it. CPU lists
// are Linux's list text ("0-3,8"); a NUMA node of -1 means the system does not say.
struct HostMap {
  struct Package {
    int index = 0;         // hwloc's logical index (without hwloc: the kernel's physical_package_id)
    std::string cpuModel;  // may be empty
    std::string cpus;
  };
  struct NumaNode {
    int osIndex = 0;       // as the kernel numbers it (numactl, /sys/devices/system/node/nodeN)
    std::uint64_t memoryBytes = 0;
    std::string cpus;      // empty for a node with memory only
  };
  struct Cache {
    std::uint64_t bytes = 0;
    std::string cpus;
    bool plausible = true;  // plausibleL3(): a hypervisor's CPUID can claim far more than any CPU has
  };
  struct Device {
    std::string name;      // eth0, mlx5_0, cuda0 (or, for a GPU seen only on the PCI bus, its PCI id)
    std::string kind;      // "net", "ib" or "gpu"
    std::string model;     // GPUs: the model when hwloc or the PCI database says it, else "NVIDIA 10de:DEVICE"
    int numaNode = -1;
    std::string pciBusId;  // "0000:3b:00.0"; empty when the device is not on PCI or that is unknown
  };
  struct Binding {
    std::vector<int> cpus;       // allowedCpus()
    std::vector<int> numaNodes;  // numaNodesOf(cpus)
  };
  std::string hostName;
  std::string source;      // "hwloc 2.9.0", or that hwloc was not available and sysfs was read
  std::string gpuSearch;   // how GPUs were looked for, in words (says why an empty list is empty)
  std::vector<Package> packages;
  std::vector<NumaNode> numaNodes;
  std::vector<Cache> l3;
  int cores = 0;
  int pus = 0;             // hardware threads
  bool hypervisor = false;
  std::vector<Device> nics;  // network interfaces ("net") and InfiniBand/RDMA devices ("ib")
  std::vector<Device> gpus;
  Binding binding;         // this process's
};

// Discovers the host on each call (tens of milliseconds with hwloc's I/O scan; not for hot paths).
// Network interfaces are those of the network namespace sysfs was mounted in, which is not always
// this process's; interfaces with no device behind them (lo, bridges, veth) are left out.
HostMap describeHost();

// Linux's CPU list text ("0-3,8,10-11"), as taskset -c and /sys write it, and back. parseCpuList
// returns an empty list for text it cannot read.
std::string cpuListText(const std::vector<int>& cpus);
std::vector<int> parseCpuList(const std::string& text);

}  // namespace braid::topology
