// The one place Braid reads its environment. Each row binds a variable name to a parser for one
// Config field, so adding a knob is one line here and one in docs/ENVIRONMENT.md.
#include "base/config.h"

#include "base/deadline.h"
#include "base/hostlist.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>  // environ

namespace braid {

const char* environmentValue(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

namespace {

Status parseBool(const std::string& s, bool* out) {
  if (s == "1" || s == "true" || s == "yes" || s == "on") { *out = true; return Status::Ok(); }
  if (s == "0" || s == "false" || s == "no" || s == "off") { *out = false; return Status::Ok(); }
  return Status::InvalidArgument("expected 0 or 1");
}

Result<long long> parseInt(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || *end) return Status::InvalidArgument("expected an integer");
  return v;
}

struct Row {
  const char* name;
  const char* defaultValue;
  const char* meaning;
  Status (*set)(Config&, const std::string&);
};

#define BRAID_ASSIGN_INT(field, lo, hi)                                              \
  [](Config& c, const std::string& s) -> Status {                                    \
    auto v = parseInt(s);                                                            \
    if (!v.ok()) return v.status();                                                  \
    if (*v < (lo) || *v > (hi)) return Status::InvalidArgument("out of range");      \
    c.field = static_cast<int>(*v);                                                  \
    return Status::Ok();                                                             \
  }

#define BRAID_ASSIGN_SIZE(field)                                                     \
  [](Config& c, const std::string& s) -> Status {                                    \
    auto v = parseSize(s);                                                           \
    if (!v.ok()) return v.status();                                                  \
    c.field = *v;                                                                    \
    return Status::Ok();                                                             \
  }

const Row kRows[] = {
    {"BRAID_DEBUG", "WARN", "log level: NONE, WARN, INFO or TRACE (INFO shows transport and algorithm choices)",
     [](Config& c, const std::string& s) -> Status {
       if (s != "WARN" && s != "INFO" && s != "TRACE" && s != "NONE")
         return Status::InvalidArgument("expected NONE, WARN, INFO or TRACE");
       c.debug = s;
       return Status::Ok();
     }},
    {"BRAID_DEBUG_SUBSYS", "ALL", "comma list of subsystems to log: INIT, COLL, NET, SHM, TUNE, BOOT, ALL",
     [](Config& c, const std::string& s) -> Status { c.debugSubsys = s; return Status::Ok(); }},
    {"BRAID_TIMEOUT", "300", "seconds any blocking step may wait before it fails with a timeout; inf (or 1e9 and more): no limit",
     [](Config& c, const std::string& s) -> Status {
       char* end = nullptr;
       double v = std::strtod(s.c_str(), &end);
       if (end == s.c_str() || *end || !(v > 0)) return Status::InvalidArgument("expected seconds > 0, or inf");
       c.timeoutSec = std::min(v, kNoTimeLimitSec);
       return Status::Ok();
     }},
    {"BRAID_ALGO", "auto", "force the algorithm: ring, tree, oneshot, hier (all-reduce, all-gather and reduce-scatter across several hosts) or bruck (all-gather and reduce-scatter in log2 n steps); auto: the tuner's cost model decides",
     [](Config& c, const std::string& s) -> Status {
       if (s != "auto" && s != "ring" && s != "tree" && s != "oneshot" && s != "hier" && s != "bruck")
         return Status::InvalidArgument("expected auto, ring, tree, oneshot, hier or bruck");
       c.algo = s;
       return Status::Ok();
     }},
    {"BRAID_CONNECT", "auto", "which pairs connect at set-up: used (the ranks of this host and the peers the algorithms the tuner may choose need; any other pair on its first send/recv, all-to-all, gather or scatter), all (every pair), auto (all up to 8 ranks, used beyond)",
     [](Config& c, const std::string& s) -> Status {
       if (s != "auto" && s != "all" && s != "used") return Status::InvalidArgument("expected auto, all or used");
       c.connect = s;
       return Status::Ok();
     }},
    {"BRAID_HOSTID", "", "the host identity ranks compare to find who shares a host (shm, host-aware rings, the hierarchical all-reduce); unset: host name and kernel boot id",
     [](Config& c, const std::string& s) -> Status {
       if (s.find_first_of(" \t\n") != std::string::npos) return Status::InvalidArgument("expected no white space");
       c.hostId = s;
       return Status::Ok();
     }},
    {"BRAID_SHM_DISABLE", "0", "1: never use shared memory, so ranks on one host talk over tcp",
     [](Config& c, const std::string& s) { return parseBool(s, &c.shmDisable); }},
    {"BRAID_IB_DISABLE", "0", "1: never use InfiniBand verbs",
     [](Config& c, const std::string& s) { return parseBool(s, &c.ibDisable); }},
    {"BRAID_IBVERBS_LIB", "libibverbs.so.1", "the verbs library the ib transport loads at run time (a name the dynamic loader finds, or a path)",
     [](Config& c, const std::string& s) -> Status { c.ibverbsLib = s; return Status::Ok(); }},
    {"BRAID_IB_HCA", "", "InfiniBand devices and ports to use, NCCL's syntax: mlx5_0:1,mlx5_1 (prefixes, :port optional), ^ before the list excludes, = before it matches names exactly; unset: every device with an ACTIVE port",
     [](Config& c, const std::string& s) -> Status { c.ibHca = s; return Status::Ok(); }},
    {"BRAID_IB_GID_INDEX", "-1", "GID table index for RoCE ports (-1: chosen per port, preferring RoCE v2 with an IPv4 address)",
     BRAID_ASSIGN_INT(ibGidIndex, -1, 255)},
    {"BRAID_IB_TIMEOUT", "16", "ib transport timeout exponent, 1 to 31: a try waits 4.096 us x 2^N for an acknowledgement (16: 268 ms; a dead peer is reported after BRAID_IB_RETRY_CNT+1 tries)",
     BRAID_ASSIGN_INT(ibTimeout, 1, 31)},
    {"BRAID_IB_RETRY_CNT", "7", "ib retries after a try gets no acknowledgement, 0 to 7",
     BRAID_ASSIGN_INT(ibRetryCnt, 0, 7)},
    {"BRAID_IB_ZCOPY_BYTES", "auto", "ib pieces of at least this many bytes go zero copy: written from the caller's memory, straight into the receiver's buffer when it advertised one (rendezvous); auto: pieces of more than half the inbox (BRAID_BUFFSIZE), which only send/recv hands the channel, so collectives stay staged; 0: off, every piece staged through the rings",
     [](Config& c, const std::string& s) -> Status {
       if (s == "auto") {
         c.ibZcopyBytes = Config::kZcopyAuto;
         return Status::Ok();
       }
       auto v = parseSize(s);
       if (!v.ok()) return v.status();
       c.ibZcopyBytes = *v;
       return Status::Ok();
     }},
    {"BRAID_IB_ODP", "1", "1: where the device offers on-demand paging for RC writes, zero-copy memory is registered through it (implicit ODP for sources, a cache by range for receive buffers) instead of per message; 0: never",
     [](Config& c, const std::string& s) { return parseBool(s, &c.ibOdp); }},
    {"BRAID_SOCKET_IFNAME", "", "interfaces for tcp: prefixes (eth,ib), ^ before the list excludes (^docker,lo), = before it matches exactly (=eth0)",
     [](Config& c, const std::string& s) -> Status { c.socketIfname = s; return Status::Ok(); }},
    {"BRAID_SOCKET_BIND_ALL", "0", "1: listeners (store, tcp) bind to every address (0.0.0.0), not only the chosen interface's",
     [](Config& c, const std::string& s) { return parseBool(s, &c.socketBindAll); }},
    {"BRAID_TCP_CONGESTION", "auto", "congestion control of the tcp connections between ranks: auto (reno where both ends are on one host, the system's default elsewhere), system (the system's default everywhere), or a name the kernel offers (reno, cubic, bbr, ...) for every connection",
     [](Config& c, const std::string& s) -> Status {
       // The kernel's names are short lowercase identifiers (TCP_CA_NAME_MAX is 16 with the NUL).
       if (s.size() > 15 || s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
         return Status::InvalidArgument("expected auto, system or a congestion control's name");
       c.tcpCongestion = s;
       return Status::Ok();
     }},
    {"BRAID_NSOCKS", "2", "channels per peer (tcp sockets, shm rings, ib queue pairs), 2 to 16; the double binary tree needs 2",
     BRAID_ASSIGN_INT(nsocks, 2, 16)},
    {"BRAID_BUFFSIZE", "1M", "staging buffer per channel and direction (shm ring, tcp receive buffer, ib inbox and outbox); power of two",
     [](Config& c, const std::string& s) -> Status {
       auto v = parseSize(s);
       if (!v.ok()) return v.status();
       if (*v < 4096 || (*v & (*v - 1))) return Status::InvalidArgument("expected a power of two >= 4K");
       c.buffSize = *v;
       return Status::Ok();
     }},
    {"BRAID_CHUNKSIZE", "0", "bytes a pipeline step moves at most (0: the tuner decides)",
     BRAID_ASSIGN_SIZE(chunkSize)},
    {"BRAID_COMM_ID", "", "host:port of the rendezvous listener that braidGetUniqueId opens (default: any port)",
     [](Config& c, const std::string& s) -> Status { c.commId = s; return Status::Ok(); }},
    {"BRAID_ZERO_COPY", "1", "1: all-reduce on braidMemAlloc buffers of one host reads peers' memory directly (256K and up)",
     [](Config& c, const std::string& s) { return parseBool(s, &c.zeroCopy); }},
    {"BRAID_CMA", "1", "1: large all-gather and broadcast between ranks of one host copy between the ranks' buffers with process_vm_readv/writev (one copy, not two) unless ranks outnumber the cores: broadcast 2 ranks from a quarter of the L3 tuning uses (braid info), more from 128K; all-gather 3+ ranks from 512K",
     [](Config& c, const std::string& s) { return parseBool(s, &c.cma); }},
    {"BRAID_SECRET", "", "the job's secret (16+ characters) for launcher-started jobs; braid run sets one; never sent on the wire",
     [](Config& c, const std::string& s) -> Status {
       if (s.size() < 16) return Status::InvalidArgument("expected at least 16 characters (128 bits as hex: 32)");
       c.secret = s;
       return Status::Ok();
     }},
    {"BRAID_STORE_HOST", "auto", "who hosts the rendezvous store of a launcher-started job: launcher (braid run's node-0 launcher, which sets it for its ranks; rank 0 then connects as the others do), rank0, or auto (braid run: launcher; else rank0)",
     [](Config& c, const std::string& s) -> Status {
       if (s != "auto" && s != "launcher" && s != "rank0") return Status::InvalidArgument("expected auto, launcher or rank0");
       c.storeHost = s;
       return Status::Ok();
     }},
    {"BRAID_TRACE_BUFFER", "1000", "collectives each rank's flight recorder keeps (0: off); written on failure to BRAID_TRACE_DIR",
     [](Config& c, const std::string& s) -> Status {
       auto v = parseInt(s);
       if (!v.ok()) return v.status();
       if (*v < 0 || *v > 1000000) return Status::InvalidArgument("expected 0 to 1000000");
       c.traceBuffer = static_cast<std::size_t>(*v);
       return Status::Ok();
     }},
    {"BRAID_TRACE_DIR", "", "directory where each rank writes braid-trace-rank<N>.json on timeout, error or abort (read: braid trace DIR)",
     [](Config& c, const std::string& s) -> Status { c.traceDir = s; return Status::Ok(); }},
    {"BRAID_METRICS_PORT", "0", "each rank serves its metrics as Prometheus text (GET /metrics) on this port plus its index among its host's ranks (0: off)",
     [](Config& c, const std::string& s) -> Status {
       auto v = parseInt(s);
       if (!v.ok()) return v.status();
       if (*v < 0 || *v > 65535) return Status::InvalidArgument("expected a port, 1 to 65535 (0: off)");
       c.metricsPort = static_cast<int>(*v);
       return Status::Ok();
     }},
    {"BRAID_METRICS_ADDR", "127.0.0.1", "the address BRAID_METRICS_PORT listens on (0.0.0.0: every interface)",
     [](Config& c, const std::string& s) -> Status { c.metricsAddr = s; return Status::Ok(); }},
    {"BRAID_INSPECT_DIR", "", "directory where each rank appends one JSON line per call (braid-inspect-rank<N>.jsonl: the call, path or algorithm, transports, bytes per peer, time)",
     [](Config& c, const std::string& s) -> Status { c.inspectDir = s; return Status::Ok(); }},
    {"BRAID_CUDA_WAIT", "auto", "how a call on device buffers holds the caller's stream: value (cuStreamWaitValue32), hostfn (a blocking host function), auto (value if the driver has it)",
     [](Config& c, const std::string& s) -> Status {
       if (s != "auto" && s != "value" && s != "hostfn") return Status::InvalidArgument("expected auto, value or hostfn");
       c.cudaWait = s;
       return Status::Ok();
     }},
    {"BRAID_CUDA_IPC", "1", "1: collectives on device buffers (not send/recv), all ranks on one host: kernels and copies read the other ranks' buffers through CUDA IPC (0: staged through pinned host memory)",
     [](Config& c, const std::string& s) { return parseBool(s, &c.cudaIpc); }},
    {"BRAID_SPIN_US", "-1", "microseconds to spin before yielding and then blocking (-1: auto: 50, or 0 when oversubscribed)",
     BRAID_ASSIGN_INT(spinUs, -1, 1000000)},
};
#undef BRAID_ASSIGN_INT

// BRAID_* variables that are not settings: braid run marks its ranks with BRAID_LAUNCHER=1.
const char* const kOtherVariables[] = {"BRAID_LAUNCHER"};

}  // namespace

Result<std::size_t> parseSize(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  std::size_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': mult = 1ull << 10; digits.pop_back(); break;
    case 'M': case 'm': mult = 1ull << 20; digits.pop_back(); break;
    case 'G': case 'g': mult = 1ull << 30; digits.pop_back(); break;
    default: break;
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return Status::InvalidArgument("'" + text + "' is not a size (digits with an optional K, M or G)");
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno || v > ~std::size_t{0} / mult) return Status::InvalidArgument("size '" + text + "' is too large");
  return static_cast<std::size_t>(v * mult);
}

Result<Config> Config::fromEnvironment() {
  Config c;
  for (const Row& row : kRows) {
    const char* v = environmentValue(row.name);
    if (!v) continue;
    Status s = row.set(c, v);
    if (!s.ok()) {
      const bool secret = std::string(row.name) == "BRAID_SECRET";  // never print it, not even when wrong
      return Status::InvalidArgument(std::string(row.name) + (secret ? " (" + std::to_string(std::strlen(v)) + " characters)" : "='" + std::string(v) + "'") +
                                     ": " + s.message() + " (" + row.meaning + ")");
    }
  }
  warnUnknownVariables();
  return c;
}

namespace {
// Edits (insert, delete, substitute, swap two neighbours) between a and b.
std::size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}
}  // namespace

std::vector<std::string> unknownVariables() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("BRAID_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    bool known = false;
    std::string nearest;
    std::size_t best = ~std::size_t{0};
    for (const Row& row : kRows) {
      if (name == row.name) { known = true; break; }
      const std::size_t d = editDistance(name, row.name);
      if (d < best) { best = d; nearest = row.name; }
    }
    for (const char* other : kOtherVariables) known = known || name == other;
    if (!known) out.push_back(name + (best <= 3 ? " (did you mean " + nearest + "?)" : ""));
  }
  return out;
}

void warnUnknownVariables() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  for (const std::string& v : unknownVariables())
    std::fprintf(stderr, "braid: WARN %s is not a Braid setting and is ignored (docs/ENVIRONMENT.md lists them)\n",
                 v.c_str());
}

std::vector<ConfigRow> describeConfig() {
  std::vector<ConfigRow> out;
  for (const Row& row : kRows) {
    const char* v = environmentValue(row.name);
    std::string shown = v ? v : "";
    if (!shown.empty() && std::string(row.name) == "BRAID_SECRET") shown = "(set)";  // never print it
    out.push_back({row.name, row.defaultValue, row.meaning, shown});
  }
  return out;
}

Result<LaunchEnv> readLaunchEnv() {
  LaunchEnv le;
  struct Names { const char* rank; const char* size; const char* local; const char* localSize; const char* source; };
  const Names kFamilies[] = {
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm"},
  };
  auto readInt = [](const char* name, int* out) -> Status {
    const char* v = environmentValue(name);
    if (!v) return Status::Ok();
    auto n = parseInt(v);
    if (!n.ok() || *n < 0 || *n > 1 << 30) return Status::InvalidArgument(std::string(name) + "='" + v + "' is not a valid number");
    *out = static_cast<int>(*n);
    return Status::Ok();
  };
  for (const Names& f : kFamilies) {
    if (!environmentValue(f.rank)) continue;
    le.source = f.source;
    for (auto [name, field] : {std::pair{f.rank, &le.rank}, {f.size, &le.worldSize}, {f.local, &le.localRank}}) {
      Status s = readInt(name, field);
      if (!s.ok()) return s;
    }
    // Only informative, and Slurm may write it as "2(x3)": an unparsable value is ignored.
    (void)readInt(f.localSize, &le.localWorldSize);
    break;
  }
  // Whether the launcher says the ranks span several hosts (then 127.0.0.1 cannot be the rendezvous).
  int nodes = -1;
  if (le.source == "Open MPI") {
    le.severalHosts = le.localWorldSize > 0 && le.worldSize > 0 && le.localWorldSize < le.worldSize;
  } else if (le.source == "Slurm") {
    for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"})
      if (nodes < 0) (void)readInt(name, &nodes);
    le.severalHosts = nodes > 1;
  }
  if (const char* a = environmentValue("MASTER_ADDR")) {
    le.masterAddr = a;
    le.masterAddrFrom = "MASTER_ADDR";
  } else if (le.source == "Slurm") {
    // srun sets no MASTER_ADDR: rank 0 runs on the first host of the step's (else the job's) list.
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      const char* list = environmentValue(name);
      if (!list) continue;
      auto hosts = expandHostlist(list, 1);
      if (!hosts.ok()) return hosts.status().withContext(name);
      le.masterAddr = (*hosts)[0];
      le.masterAddrFrom = std::string("the first host of ") + name;
      break;
    }
  }
  Status s = readInt("MASTER_PORT", &le.masterPort);
  if (!s.ok()) return s;
  // Under torchrun the elastic agent's own store holds MASTER_PORT (its workers reach it as
  // clients, TORCHELASTIC_USE_AGENT_STORE=True): Braid's rank 0 hosts its store on the next port.
  const char* agentStore = environmentValue("TORCHELASTIC_USE_AGENT_STORE");
  if (le.source == "torchrun" && agentStore && std::string(agentStore) == "True" && le.masterPort > 0) {
    if (le.masterPort >= 65535)
      return Status::InvalidArgument("MASTER_PORT=65535 under torchrun: Braid's store takes MASTER_PORT + 1 (torchrun's "
                                     "agent holds MASTER_PORT); pick a lower --master_port");
    le.masterPort += 1;
    le.masterPortFrom = "MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT)";
  }
  if (le.masterPort < 0 && le.source == "Slurm") {
    // One port per job, so that two jobs sharing a first host do not meet at the same one.
    if (const char* job = environmentValue("SLURM_JOB_ID")) {
      auto id = parseInt(job);
      if (id.ok() && *id >= 0) {
        le.masterPort = static_cast<int>(kSlurmPortBase + *id % kSlurmPortSpan);
        le.masterPortFrom = "SLURM_JOB_ID";
      }
    }
  }
  if (le.masterPort == 0 || le.masterPort > 65535)
    return Status::InvalidArgument("MASTER_PORT='" + std::to_string(le.masterPort) + "' is not a port (1 to 65535)");
  return le;
}

}  // namespace braid
