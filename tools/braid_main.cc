// The `braid` command: run (launcher), perf (benchmark), info (build, host, configuration), topo
// (this host's hardware), doctor (diagnose the interconnect), status (a running job, live), tune (the tuner's choices and their
// plans for a world of any size), trace (flight recorder files).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/config.h"
#include "base/socket.h"
#include "comm/bootstrap/init.h"
#include "comm/bootstrap/store.h"
#include "tools/launcher.h"
#include "tools/tools.h"
#include "tools/trace.h"

namespace {
const char* kUsage =
    "usage: braid COMMAND [ARGS]\n"
    "  run   -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R] [--tag-output] -- PROGRAM ARGS\n"
    "        start N ranks of PROGRAM on this host, the way torchrun does\n"
    "  perf  COLLECTIVE [options]   nccl-tests' table for a collective (run it under `braid run`)\n"
    "  info                          build, host, transports, and every BRAID_* variable\n"
    "  topo [--json]                 this host's packages, NUMA nodes, caches, NICs, GPUs and where this rank is bound\n"
    "  doctor [options]              every rank takes part; rank 0 reports transports, local checks, slow links\n"
    "                                and what to change (run it under `braid run`, torchrun or mpirun)\n"
    "  status [--addr HOST:PORT]     what every rank of a running job is doing, and who holds the others up\n"
    "  tune [options]                what the tuner chooses for a world of H hosts, and what those plans send\n"
    "  trace DIR                     merge the ranks' flight recorder files (BRAID_TRACE_DIR) into a verdict\n";

// braid run's store on node 0: the library's StoreServer, admitting the ranks as their rank 0
// would (the job's secret and the address they resolve MASTER_ADDR to).
class LauncherStore final : public braid::tools::StoreHost {
 public:
  bool wanted() override {
    auto cfg = braid::Config::fromEnvironment();
    if (cfg.ok()) config_ = *cfg;
    return cfg.ok() && config_.storeHost != "rank0";
  }
  std::string start(const std::string& addr, int port, const std::string& secret) override {
    server_.reset();
    auto ip = braid::net::resolve(addr);
    if (!ip.ok()) return ip.status().message();
    auto bindIp = braid::net::bindAddressFor(*ip, config_.socketIfname, config_.socketBindAll);
    if (!bindIp.ok()) return bindIp.status().message();
    auto server = braid::StoreServer::start(*bindIp, port, braid::storeSecret(config_.secret.empty() ? secret : config_.secret, *ip, port));
    if (!server.ok()) return server.status().message();
    server_ = std::move(server.value());
    return "";
  }
  bool finished() override { return server_ && server_->finished(); }
  // (A store started again for a next communicator that no rank then created is left at once,
  // whatever observers asked it.)
  void waitUntilAllLeft(bool jobFailed) override {
    const double limit = jobFailed ? std::min(1.0, config_.timeoutSec) : config_.timeoutSec;
    if (server_ && server_->ranksJoined() > 0) server_->waitUntilAllLeft(braid::Deadline::after(limit));
  }
  void stop() override { server_.reset(); }

 private:
  braid::Config config_;
  std::unique_ptr<braid::StoreServer> server_;
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  if (!std::strcmp(cmd, "run")) {
    LauncherStore store;
    return braid::tools::runLauncher(argc - 1, argv + 1, &store);
  }
  if (!std::strcmp(cmd, "perf")) return braid::tools::runPerf(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "info")) return braid::tools::runInfo(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "topo")) return braid::tools::runTopo(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "doctor")) return braid::tools::runDoctor(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "status")) return braid::tools::runStatus(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "tune")) return braid::tools::runTune(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "trace")) return braid::tools::runTrace(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "--version")) {
    std::printf("braid 0.1.0\n");
    return 0;
  }
  std::fprintf(stderr, "braid: unknown command '%s'\n%s", cmd, kUsage);
  return 2;
}
