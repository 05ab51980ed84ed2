// Every BRAID_* variable is one field of Config, listed once in the table in config.cc with its
// default and a one-line meaning. Read once at communicator creation and passed down; the environment is read
// nowhere else in Braid. `braid info` prints the table; docs/ENVIRONMENT.md documents it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "braid/status.hpp"

namespace braid {

struct Config {
  std::string debug = "WARN";        // BRAID_DEBUG
  std::string debugSubsys = "ALL";   // BRAID_DEBUG_SUBSYS
  double timeoutSec = 300;           // BRAID_TIMEOUT
  std::string algo = "auto";         // BRAID_ALGO
  std::string connect = "auto";      // BRAID_CONNECT
  std::string storeHost = "auto";    // BRAID_STORE_HOST
  bool shmDisable = false;           // BRAID_SHM_DISABLE
  bool ibDisable = false;            // BRAID_IB_DISABLE
  std::string ibverbsLib = "libibverbs.so.1";  // BRAID_IBVERBS_LIB
  std::string ibHca;                 // BRAID_IB_HCA ("": every device)
  int ibGidIndex = -1;               // BRAID_IB_GID_INDEX (-1: chosen per port)
  int ibTimeout = 16;                // BRAID_IB_TIMEOUT (4.096 us x 2^N per try)
  int ibRetryCnt = 7;                // BRAID_IB_RETRY_CNT
  // BRAID_IB_ZCOPY_BYTES (0: no zero-copy pieces; kZcopyAuto: more than half the channel's inbox)
  static constexpr std::size_t kZcopyAuto = ~std::size_t{0};
  std::size_t ibZcopyBytes = kZcopyAuto;
  bool ibOdp = true;                 // BRAID_IB_ODP
  std::string socketIfname;          // BRAID_SOCKET_IFNAME
  bool socketBindAll = false;        // BRAID_SOCKET_BIND_ALL
  std::string tcpCongestion = "auto";  // BRAID_TCP_CONGESTION
  int nsocks = 2;                    // BRAID_NSOCKS
  std::size_t buffSize = 1 << 20;    // BRAID_BUFFSIZE
  std::size_t chunkSize = 0;         // BRAID_CHUNKSIZE (0: tuner decides)
  std::string commId;                // BRAID_COMM_ID
  int spinUs = -1;                   // BRAID_SPIN_US (-1: auto)
  bool zeroCopy = true;              // BRAID_ZERO_COPY
  bool cma = true;                   // BRAID_CMA
  std::string secret;                // BRAID_SECRET
  std::size_t traceBuffer = 1000;    // BRAID_TRACE_BUFFER (0: no flight recorder)
  std::string traceDir;              // BRAID_TRACE_DIR ("": the recorder is never written)
  int metricsPort = 0;               // BRAID_METRICS_PORT (0: off; a rank serves on it + its index on its host)
  std::string metricsAddr = "127.0.0.1";  // BRAID_METRICS_ADDR
  std::string inspectDir;            // BRAID_INSPECT_DIR ("": no per-call records)
  std::string cudaWait = "auto";     // BRAID_CUDA_WAIT
  bool cudaIpc = true;               // BRAID_CUDA_IPC
  std::string hostId;                // BRAID_HOSTID ("": host name and kernel boot id)

  // Reads every BRAID_* variable; an unparsable value is an invalid-argument error naming it.
  static Result<Config> fromEnvironment();
};

// One row of the table, for `braid info` and the docs.
struct ConfigRow {
  const char* name;
  const char* defaultValue;
  const char* meaning;
  std::string current;  // value in effect ("" when unset)
};
std::vector<ConfigRow> describeConfig();
// BRAID_* variables in the environment that are no setting, each with the nearest known name
// when one is close ("BRAID_TIMEUOT (did you mean BRAID_TIMEOUT?)").
std::vector<std::string> unknownVariables();
// Prints them once per process on stderr (Config::fromEnvironment calls it).
void warnUnknownVariables();

// The launcher's variables (torchrun's names first, then Open MPI's, then Slurm's).
struct LaunchEnv {
  int rank = -1;
  int worldSize = -1;
  int localRank = -1;
  int localWorldSize = -1;
  std::string masterAddr;
  std::string masterAddrFrom;  // "MASTER_ADDR", "the first host of SLURM_STEP_NODELIST", ... ("": not set)
  int masterPort = -1;
  std::string masterPortFrom;  // "" (MASTER_PORT itself or the default), or where the port came from
  std::string source;  // "torchrun", "Open MPI", "Slurm" or "" when none is set
  // The launcher says the ranks span several hosts (Open MPI: a local size below the world size;
  // Slurm: more than one node in the step or job).
  bool severalHosts = false;
};
// Under Slurm without MASTER_PORT: kSlurmPortBase + SLURM_JOB_ID % kSlurmPortSpan.
inline constexpr int kSlurmPortBase = 20000;
inline constexpr int kSlurmPortSpan = 10000;
Result<LaunchEnv> readLaunchEnv();

// One environment variable, or null when it is unset or empty. The only reader of the environment:
// Braid's BRAID_* variables go through the table above; the test programs read their own
// variables (STRESS_SEED, the NAME=VALUE a spawned child gets) here too.
const char* environmentValue(const char* name);

// "4M" -> 4194304; accepts K, M, G (powers of 1024) and plain numbers.
Result<std::size_t> parseSize(const std::string& text);

}  // namespace braid
