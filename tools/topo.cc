// `braid topo`: hwloc's view of this host, one fact per line (or one JSON object with --json):
// packages, NUMA nodes, L3 domains, cores, NICs and IB devices, GPUs, and where this process runs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "braid_build_config.h"
#include "base/config.h"
#include "tools/json.h"
#include "tools/tools.h"
#include "topology/topology.h"

namespace braid::tools {

namespace {

const char* const kTopoUsage =
    "usage: braid topo [--json]\n"
    "  this host as hwloc sees it (without hwloc: sysfs): packages, NUMA nodes with their memory, L3\n"
    "  domains, cores, NICs and IB devices with their NUMA node and PCI address, NVIDIA GPUs with theirs,\n"
    "  and the CPUs this process may run on (under a launcher each rank prints its own, with its rank).\n"
    "  --json      one JSON object on stdout instead of the text\n"
    "  -h, --help  this text\n";

std::string plural(std::size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string memoryText(std::uint64_t bytes) {
  char text[32];
  if (bytes >= (std::uint64_t{1} << 30))
    std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / static_cast<double>(1 << 30));
  else
    std::snprintf(text, sizeof(text), "%llu MiB", static_cast<unsigned long long>(bytes >> 20));
  return text;
}

std::string cacheText(std::uint64_t bytes) {
  if (bytes != 0 && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::string numaText(int node) { return node < 0 ? "NUMA node unknown" : "NUMA node " + std::to_string(node); }

std::string nodesText(const std::vector<int>& nodes) {
  if (nodes.empty()) return "NUMA node unknown";
  return (nodes.size() == 1 ? "NUMA node " : "NUMA nodes ") + topology::cpuListText(nodes);
}

// The launcher's RANK and LOCAL_RANK (torchrun, braid run), -1 when unset or not a number.
int launcherNumber(const char* name) {
  const char* v = environmentValue(name);
  if (!v) return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end != '\0' || n < 0 || n > (1 << 30) ? -1 : static_cast<int>(n);
}

std::string gpuSearchText(const topology::HostMap& m) {
  return BRAID_HAVE_CUDA ? m.gpuSearch : "this build has no CUDA; " + m.gpuSearch;
}

void printText(const topology::HostMap& m, int rank, int localRank) {
  std::printf("host %s: %s, %s, %s, %s (%s)\n", m.hostName.c_str(), plural(m.packages.size(), "package", "packages").c_str(),
              plural(m.numaNodes.size(), "NUMA node", "NUMA nodes").c_str(),
              plural(static_cast<std::size_t>(m.cores), "core", "cores").c_str(),
              plural(static_cast<std::size_t>(m.pus), "hardware thread", "hardware threads").c_str(), m.source.c_str());
  for (const auto& p : m.packages)
    std::printf("package %d: %s, CPUs %s\n", p.index, p.cpuModel.empty() ? "unknown CPU model" : p.cpuModel.c_str(),
                p.cpus.c_str());
  for (const auto& n : m.numaNodes)
    std::printf("NUMA node %d: %s, %s\n", n.osIndex, memoryText(n.memoryBytes).c_str(),
                n.cpus.empty() ? "no CPUs (memory only)" : ("CPUs " + n.cpus).c_str());
  for (const auto& c : m.l3) {
    const std::size_t sharing = topology::parseCpuList(c.cpus).size();
    const std::string doubt = " (doubtful: no CPU has that much L3 for " + plural(sharing, "CPU", "CPUs") +
                              (m.hypervisor ? "; a hypervisor's figure)" : ")");
    std::printf("L3 %s: CPUs %s%s\n", cacheText(c.bytes).c_str(), c.cpus.c_str(), c.plausible ? "" : doubt.c_str());
  }
  if (m.l3.empty()) std::printf("L3: none reported\n");
  for (const auto& d : m.nics) {
    const std::string pci = d.pciBusId.empty() ? "" : " (PCI " + d.pciBusId + ")";
    std::printf("%s %s: %s%s\n", d.kind == "ib" ? "IB" : "NIC", d.name.c_str(), numaText(d.numaNode).c_str(), pci.c_str());
  }
  if (m.nics.empty()) std::printf("NICs: none with a device behind them\n");
  for (const auto& g : m.gpus) {
    const std::string pci = g.pciBusId.empty() || g.pciBusId == g.name ? "" : " (PCI " + g.pciBusId + ")";
    std::printf("GPU %s %s: %s%s\n", g.name.c_str(), g.model.c_str(), numaText(g.numaNode).c_str(), pci.c_str());
  }
  if (m.gpus.empty()) std::printf("GPUs: none found (%s)\n", gpuSearchText(m).c_str());
  std::string who = "this process";
  if (rank >= 0 || localRank >= 0)
    who += " (rank " + (rank >= 0 ? std::to_string(rank) : std::string("unknown")) + ", local rank " +
           (localRank >= 0 ? std::to_string(localRank) : std::string("unknown")) + ")";
  std::printf("%s: CPUs %s on %s\n", who.c_str(), topology::cpuListText(m.binding.cpus).c_str(),
              nodesText(m.binding.numaNodes).c_str());
}

std::string orNull(int v) { return v < 0 ? "null" : std::to_string(v); }
std::string orNull(const std::string& s) { return s.empty() ? "null" : jsonString(s); }

template <typename T, typename F>
std::string jsonArray(const std::vector<T>& items, F one) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + one(items[i]);
  return out + "]";
}

void printJson(const topology::HostMap& m, int rank, int localRank) {
  auto device = [](const topology::HostMap::Device& d) {
    return "{\"name\": " + jsonString(d.name) + ", \"kind\": " + jsonString(d.kind) +
           (d.model.empty() ? "" : ", \"model\": " + jsonString(d.model)) + ", \"numa_node\": " + orNull(d.numaNode) +
           ", \"pci\": " + orNull(d.pciBusId) + "}";
  };
  std::string out = "{\n";
  out += "  \"host\": " + jsonString(m.hostName) + ",\n";
  out += "  \"source\": " + jsonString(m.source) + ",\n";
  out += "  \"packages\": " + jsonArray(m.packages, [](const topology::HostMap::Package& p) {
           return "{\"index\": " + std::to_string(p.index) + ", \"model\": " + jsonString(p.cpuModel) +
                  ", \"cpus\": " + jsonString(p.cpus) + "}";
         }) + ",\n";
  out += "  \"numa_nodes\": " + jsonArray(m.numaNodes, [](const topology::HostMap::NumaNode& n) {
           return "{\"os_index\": " + std::to_string(n.osIndex) + ", \"memory_bytes\": " + std::to_string(n.memoryBytes) +
                  ", \"cpus\": " + jsonString(n.cpus) + "}";
         }) + ",\n";
  out += "  \"l3\": " + jsonArray(m.l3, [](const topology::HostMap::Cache& c) {
           return "{\"bytes\": " + std::to_string(c.bytes) + ", \"cpus\": " + jsonString(c.cpus) +
                  ", \"plausible\": " + (c.plausible ? "true" : "false") + "}";
         }) + ",\n";
  out += "  \"cores\": " + std::to_string(m.cores) + ",\n";
  out += "  \"pus\": " + std::to_string(m.pus) + ",\n";
  out += "  \"hypervisor\": " + std::string(m.hypervisor ? "true" : "false") + ",\n";
  out += "  \"nics\": " + jsonArray(m.nics, device) + ",\n";
  out += "  \"gpus\": " + jsonArray(m.gpus, device) + ",\n";
  out += "  \"gpu_search\": " + jsonString(gpuSearchText(m)) + ",\n";
  out += "  \"binding\": {\"rank\": " + orNull(rank) + ", \"local_rank\": " + orNull(localRank) +
         ", \"cpus\": " + jsonString(topology::cpuListText(m.binding.cpus)) +
         ", \"numa_nodes\": " + jsonArray(m.binding.numaNodes, [](int n) { return std::to_string(n); }) + "}\n";
  out += "}\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace

int runTopo(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::fputs(kTopoUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "braid topo: unknown option '%s'\n%s", argv[i], kTopoUsage);
      return 2;
    }
  }
  const topology::HostMap m = topology::describeHost();
  const int rank = launcherNumber("RANK"), localRank = launcherNumber("LOCAL_RANK");
  if (json)
    printJson(m, rank, localRank);
  else
    printText(m, rank, localRank);
  return 0;
}

}  // namespace braid::tools
