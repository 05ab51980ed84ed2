// `braid info`: what this build and this host offer, and every BRAID_* variable with its value.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid_build_config.h"
#include "comm/algorithms/cma.h"
#include "base/config.h"
#include "comm/engine.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"
#include "tools/perf_report.h"
#include "tools/tools.h"
#include "topology/topology.h"
#include "transport/registry.h"

namespace braid::tools {

std::string describeAlgoSetting() {
  auto c = Config::fromEnvironment();
  if (!c.ok() || c->algo == "auto") return "auto (latency/bandwidth cost model; BRAID_ALGO=ring|tree forces one)";
  return c->algo + " (forced by BRAID_ALGO)";
}

int runInfo(int, char**) {
  const topology::Summary& t = topology::summary();
  std::printf("braid %d.%d.%d\n", BRAID_MAJOR, BRAID_MINOR, BRAID_PATCH);
  std::printf("build: cuda %s, ibverbs headers %s, hwloc %s\n",
              BRAID_HAVE_CUDA ? "yes (device buffers staged through pinned memory; kernels for sm " BRAID_GPU_ARCHS ")" : "no",
              BRAID_HAVE_IBVERBS ? "found" : "no", BRAID_HAVE_HWLOC ? "yes" : "no (cores from the affinity mask)");
  std::printf("host: %d cores, %d hardware threads, %d NUMA nodes, %s%s\n", t.cores, t.pus, t.numaNodes,
              t.cpuModel.empty() ? "unknown CPU" : t.cpuModel.c_str(), t.hypervisor ? " (under a hypervisor)" : "");
  std::printf("L3: %zu MiB, from %s\n", t.l3Bytes >> 20, t.l3Source.c_str());
  const std::string tuned = "streaming copies from " + std::to_string(largeCopyBytes() >> 10) +
                            " KiB, the 2-rank broadcast through cross-memory attach from " +
                            std::to_string(cmaMinBytes(CollKind::kBroadcast, 2, topology::tuningL3Bytes()) >> 10) + " KiB";
  if (t.l3Plausible)
    std::printf("    tuning uses it: %s\n", tuned.c_str());
  else
    std::printf("    tuning assumes %zu MiB instead (%s): %s\n", topology::kAssumedL3Bytes >> 20,
                t.l3Bytes == 0 ? "unknown"
                : t.l3SharedBy > 0 ? "doubtful: more than any CPU has per CPU sharing it"
                                   : "doubtful: a whole-machine figure under a hypervisor",
                tuned.c_str());
  const std::vector<int> cpus = topology::allowedCpus();
  std::printf("this process may run on: CPUs %s, %zu cores (braid run pins its ranks one per core, round-robin "
              "when they outnumber them; --bind-to none leaves them free)\n",
              topology::cpuListText(cpus).c_str(), topology::allowedCores().size());
  std::printf("reduce kernels: %s\n", kernels::isaName());
  std::printf("copies: %s\n", kernels::plainCopyName());
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) {
    std::printf("configuration error: %s\n", cfg.status().message().c_str());
    return 1;
  }
  auto verdict = [](const Availability& a) { return a.usable ? std::string("usable") : "unusable (" + a.reason + ")"; };
  std::string line;
  for (auto& t : makeTransports(*cfg)) line += (line.empty() ? "" : ", ") + std::string(t->name()) + " " + verdict(t->probe());
#if !BRAID_HAVE_IBVERBS
  line += ", ib unusable (not built: the libibverbs-dev headers were missing when this build was configured)";
#endif
  std::printf("transports, in the order each pair tries them: %s\n", line.c_str());
  // Under a launcher (braid run, torchrun, mpirun, srun): join the job, and rank 0 prints each
  // rank's peers by transport, those connected at creation and those left for first use.
  auto launch = readLaunchEnv();
  if (launch.ok() && launch->worldSize > 1) {
    braidComm_t comm = nullptr;
    if (braidCommInitFromEnv(&comm) != braidSuccess) {
      std::printf("joining the job (%s) failed: %s\n", launch->source.c_str(), braidGetLastError(nullptr));
      return 1;
    }
    int rank = 0, n = 0;
    braidCommUserRank(comm, &rank);
    braidCommCount(comm, &n);
    const std::vector<std::string> lines = transportLines(comm, rank, n);
    if (rank == 0) {
      std::printf("connections of the job's %d ranks at creation (BRAID_CONNECT=%s; the rest on first use):\n", n,
                  cfg->connect.c_str());
      for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
    }
    if (braidCommDestroy(comm) != braidSuccess) return 1;
  }
  std::printf("\n%-20s %-8s %-12s %s\n", "variable", "default", "value", "meaning");
  for (const ConfigRow& row : describeConfig())
    std::printf("%-20s %-8s %-12s %s\n", row.name, row.defaultValue, row.current.empty() ? "-" : row.current.c_str(),
                row.meaning);
  return 0;
}

}  // namespace braid::tools
