#include "comm/bootstrap/init.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "base/log.h"
#include "base/socket.h"
#include "comm/bootstrap/store.h"

namespace braid {
namespace {

constexpr char kIdMagic[8] = {'B', 'R', 'A', 'I', 'D', 'I', 'D', '1'};

struct IdLayout {
  char magic[8];
  char ip[40];
  std::int32_t port;
  char nonce[40];
  char reserved[36];
};
static_assert(sizeof(IdLayout) == BRAID_UNIQUE_ID_BYTES);

std::string randomHex(int bytes) {
  std::string raw(static_cast<std::size_t>(bytes), '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(raw.data(), bytes);
  std::string hex;
  char b[3];
  for (unsigned char c : raw) {
    std::snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  return hex;
}

Result<std::pair<std::string, int>> splitHostPort(const std::string& text) {
  std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return Status::InvalidArgument("'" + text + "' is not host:port");
  char* end = nullptr;
  long port = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535) return Status::InvalidArgument("'" + text + "' has no valid port");
  return std::pair{text.substr(0, colon), static_cast<int>(port)};
}

// Where a listener for other ranks should bind when nobody said: the configured interface, else
// the first non-loopback IPv4 address, else loopback.
Result<std::string> defaultListenIp(const Config& c) {
  if (!c.socketIfname.empty()) return net::addressForInterfaces(c.socketIfname);
  auto ip = net::addressForInterfaces("^lo");
  return ip.ok() ? *ip : std::string("127.0.0.1");
}

Result<InitParams> paramsWith(InitParams p, int nranks, int rank, const CommOptions& options) {
  if (nranks < 1) return Status::InvalidArgument("nranks must be at least 1 (got " + std::to_string(nranks) + ")");
  if (rank < 0 || rank >= nranks)
    return Status::InvalidArgument("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(nranks - 1));
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) return cfg.status();
  p.config = *cfg;
  Status s = applyOptions(options, &p.config);
  if (!s.ok()) return s;
  p.rank = rank;
  p.nranks = nranks;
  return p;
}

}  // namespace

namespace {
// Starts a detached store on ip:port (0: any free port) and writes its unique id.
Status startIdStore(const Config& cfg, const std::string& ip, int port, braidUniqueId* id) {
  std::string nonce = randomHex(16);
  auto server = StoreServer::start(cfg.socketBindAll ? "0.0.0.0" : ip, port, nonce);
  if (!server.ok()) return server.status();
  IdLayout layout{};
  std::memcpy(layout.magic, kIdMagic, sizeof(kIdMagic));
  std::snprintf(layout.ip, sizeof(layout.ip), "%s", ip.c_str());
  layout.port = (*server)->port();
  std::snprintf(layout.nonce, sizeof(layout.nonce), "%s", nonce.c_str());
  (*server)->detach();
  server->release();  // the detached thread keeps running; the object is intentionally leaked
  std::memcpy(id->internal, &layout, sizeof(layout));
  return Status::Ok();
}
}  // namespace

Status makeUniqueId(braidUniqueId* id) {
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) return cfg.status();
  log::configure(cfg->debug, cfg->debugSubsys);
  if (cfg->commId.empty()) return makeUniqueIdFor(*cfg, id);
  auto hp = splitHostPort(cfg->commId);
  if (!hp.ok()) return hp.status().withContext("BRAID_COMM_ID");
  auto resolved = net::resolve(hp->first);
  if (!resolved.ok()) return resolved.status();
  return startIdStore(*cfg, *resolved, hp->second, id);
}

Status makeUniqueIdFor(const Config& config, braidUniqueId* id) {
  auto chosen = defaultListenIp(config);
  if (!chosen.ok()) return chosen.status();
  return startIdStore(config, *chosen, 0, id);
}

Status applyOptions(const CommOptions& options, Config* config) {
  if (options.timeoutSec < 0 || options.timeoutSec != options.timeoutSec)
    return Status::InvalidArgument("CommOptions::timeoutSec must be seconds > 0, or 0 for BRAID_TIMEOUT (got " +
                                   std::to_string(options.timeoutSec) + ")");
  if (options.timeoutSec > 0 && !environmentValue("BRAID_TIMEOUT"))
    config->timeoutSec = std::min(options.timeoutSec, kNoTimeLimitSec);  // years: no limit
  return Status::Ok();
}

std::string uniqueIdToString(const braidUniqueId& id) {
  IdLayout l;
  std::memcpy(&l, id.internal, sizeof(l));
  if (std::memcmp(l.magic, kIdMagic, sizeof(kIdMagic)) != 0) return "";
  l.ip[sizeof(l.ip) - 1] = 0;
  l.nonce[sizeof(l.nonce) - 1] = 0;
  return std::string(l.ip) + ":" + std::to_string(l.port) + "/" + l.nonce;
}

Result<braidUniqueId> uniqueIdFromString(const std::string& text) {
  std::size_t slash = text.find('/');
  if (slash == std::string::npos) return Status::InvalidArgument("'" + text + "' is not a unique id (host:port/nonce)");
  auto hp = splitHostPort(text.substr(0, slash));
  if (!hp.ok()) return hp.status();
  std::string nonce = text.substr(slash + 1);
  IdLayout l{};
  if (hp->first.size() >= sizeof(l.ip) || nonce.empty() || nonce.size() >= sizeof(l.nonce))
    return Status::InvalidArgument("'" + text + "' is not a unique id (host or nonce too long)");
  // A host name or IPv4 address, and a hex nonce: nothing else may hide in the printed form.
  if (hp->first.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos ||
      nonce.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return Status::InvalidArgument("'" + text + "' is not a unique id (host:port/hexnonce)");
  std::memcpy(l.magic, kIdMagic, sizeof(kIdMagic));
  std::memcpy(l.ip, hp->first.data(), hp->first.size());
  l.port = hp->second;
  std::memcpy(l.nonce, nonce.data(), nonce.size());
  braidUniqueId id{};
  std::memcpy(id.internal, &l, sizeof(l));
  return id;
}

Result<InitParams> paramsFromUniqueId(const braidUniqueId& id, int nranks, int rank,
                                               const CommOptions& options) {
  IdLayout l;
  std::memcpy(&l, id.internal, sizeof(l));
  if (std::memcmp(l.magic, kIdMagic, sizeof(kIdMagic)) != 0)
    return Status::InvalidArgument("the unique id was not made by braidGetUniqueId (bad magic)");
  l.ip[sizeof(l.ip) - 1] = 0;
  l.nonce[sizeof(l.nonce) - 1] = 0;
  InitParams p;
  p.storeIp = l.ip;
  p.storePort = l.port;
  p.storeNonce = l.nonce;
  return paramsWith(std::move(p), nranks, rank, options);
}

std::string storeSecret(const std::string& braidSecret, const std::string& ip, int port) {
  return braidSecret.empty() ? "store:" + ip + ":" + std::to_string(port) : braidSecret;
}

Result<InitParams> paramsFromStore(const std::string& host, int port, bool isHost, int nranks, int rank,
                                            const CommOptions& options) {
  auto ip = net::resolve(host);
  if (!ip.ok()) return ip.status();
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) return cfg.status();
  InitParams p;
  p.storeIp = *ip;
  p.storePort = port;
  p.storeNonce = storeSecret(cfg->secret, *ip, port);
  if (cfg->secret.empty()) {
    // Without a secret anyone who can reach the port can join: say so, once per process.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "braid: WARN BRAID_SECRET is not set: the rendezvous at %s:%d accepts any process that can "
                           "reach it (braid run sets a secret; with torchrun, mpirun or srun export one to every rank)\n",
                   ip->c_str(), port);
  }
  p.hostStore = isHost;
  return paramsWith(std::move(p), nranks, rank, options);
}

Result<InitParams> paramsFromEnv(const CommOptions& options) {
  auto le = readLaunchEnv();
  if (!le.ok()) return le.status();
  if (le->rank < 0 || le->worldSize < 0)
    return Status::InvalidUsage("RANK and WORLD_SIZE are not set: start the program with `braid run -n N`, torchrun, "
                                "mpirun or srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself");
  if (le->worldSize < 1)
    return Status::InvalidArgument("the job's size (" + le->source + ": " + std::to_string(le->worldSize) +
                                   ") must be at least 1 rank");
  if (le->rank >= le->worldSize)
    return Status::InvalidArgument("rank " + std::to_string(le->rank) + " (" + le->source + ") is outside 0.." +
                                   std::to_string(le->worldSize - 1) + ": the job has " + std::to_string(le->worldSize) +
                                   " ranks");
  if (le->masterAddr.empty() && le->severalHosts) {
    const std::string how = le->source == "Open MPI"
                                ? "mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500 ..."
                                : "export MASTER_ADDR=<rank 0's host> MASTER_PORT=29500 before srun";
    return Status::InvalidUsage(le->source + " started rank " + std::to_string(le->rank) + " of " +
                                std::to_string(le->worldSize) + " on several hosts, but MASTER_ADDR is not set, so " +
                                "the ranks cannot find rank 0's rendezvous store (127.0.0.1 is each host's own): " +
                                "export it to every rank, e.g. " + how);
  }
  std::string addr = le->masterAddr.empty() ? "127.0.0.1" : le->masterAddr;
  int port = le->masterPort > 0 ? le->masterPort : 29500;
  // braid run's node-0 launcher hosts the store itself (BRAID_STORE_HOST=launcher, which it sets),
  // on the port after MASTER_PORT (which stays the program's: torch's env:// store takes it), as
  // under torchrun's agent store: rank 0 then holds one store connection, not one for every rank.
  auto cfg = Config::fromEnvironment();
  if (!cfg.ok()) return cfg.status();
  const bool launcherStore = cfg->storeHost == "launcher";
  if (launcherStore && ++port > 65535)
    return Status::InvalidArgument("MASTER_PORT=65535 with BRAID_STORE_HOST=launcher: the launcher's store takes MASTER_PORT + 1");
  return paramsFromStore(addr, port, le->rank == 0 && !launcherStore, le->worldSize, le->rank, options);
}

}  // namespace braid
