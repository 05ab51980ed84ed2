// Runs a test body in N real processes that form one communicator (shm or tcp between them), the
// way users run Braid. Rank 0 creates a unique id and hands it to the others through pipes.
#pragma once
#include <sys/types.h>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.h"

namespace braid::test {

struct RankOutcome {
  int exitStatus = -1;  // exit code, or 128 + signal
  bool timedOut = false;
};

using Env = std::vector<std::pair<std::string, std::string>>;

// Forks `n` processes; each sets `env` (values through forRank), joins the communicator, runs body(rank, comm) and exits with
// its return value (the communicator is destroyed first unless the body returns < 0, which means
// "already destroyed or aborted": exit with -value, or 0 for kAlreadyDestroyed). Bounded by
// timeoutSec (then everything is killed).
constexpr int kAlreadyDestroyed = -(1 << 30);  // a body's success, the communicator destroyed by it
std::vector<RankOutcome> runRanks(int n, const std::function<int(int, braidComm_t)>& body, const Env& env = {},
                                  double timeoutSec = 120);

// The GoogleTest verdict on runRanks/forkRanks: every rank exited with 0 and none timed out (a
// failure names the rank).
void expectEveryRankSucceeded(const std::vector<RankOutcome>& outcome);

// Like runRanks, but the body gets no communicator (it creates its own).
std::vector<RankOutcome> forkRanks(int n, const std::function<int(int)>& body, double timeoutSec = 60);

// The transport under test as environment: {"shm"} -> nothing, {"tcp"} -> BRAID_SHM_DISABLE=1 and
// BRAID_IB_DISABLE=1;
// pretend hosts on this machine (BRAID_HOSTID, shm within each and tcp across): "hosts/K" puts
// ranks 0..K-1 on the first host, K..2K-1 on the second, ...; "hosts%K" deals them round robin.
// "ib": ib between ranks of this host (shm off) over the verbs emulation, every pair checked to use it.
Env transportEnv(const std::string& transport);

// The verbs emulation's library (tests/fakeibv), for BRAID_IBVERBS_LIB.
std::string fakeIbverbsLib();

// Sets this process's memlock limit to `bytes` and drops CAP_IPC_LOCK from its effective set, so
// that the limit binds memory registration as for an unprivileged user. runRanks does it before
// the communicator when the Env has TEST_MEMLOCK_BYTES.
bool lowerMemlock(std::uint64_t bytes);

// An Env value for one rank: each "{rank}", "{rank/K}" and "{rank%K}" replaced by its figure, and
// "{rank@3,4,5}" by the index of the host holding it among hosts of those sizes, ranks in order
// (runRanks applies it, so one Env can give every rank its own value).
std::string forRank(std::string value, int rank);

// Starts this test binary again with `variable` (NAME=VALUE) added to the environment, through
// posix_spawn: for a child process of a test whose process has threads (a fork could inherit a lock
// that another thread held). The child recognises the variable before main. -1 if spawning failed.
pid_t spawnSelf(const std::string& variable);

// Prints "rank R: message" to stderr (children report what went wrong this way).
void report(int rank, const std::string& message);

}  // namespace braid::test
