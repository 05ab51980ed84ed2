// The three ways to find the other ranks: a unique id passed out of band, the launcher's
// environment (torchrun / braid run / Open MPI / Slurm), or an explicit store address. Each turns
// into InitParams, from which the communicator is made (comm/communicator.h initFrom*): the
// bootstrap knows nothing of the communicator.
#pragma once
#include <memory>
#include <string>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "braid/status.hpp"
#include "base/config.h"

namespace braid {

struct InitParams {
  int rank = -1;
  int nranks = -1;
  std::string storeIp;
  int storePort = -1;
  std::string storeNonce;  // admits this communicator's ranks to the store
  bool hostStore = false;  // this rank runs the store (env mode, rank 0)
  Config config;
};

Status makeUniqueId(braidUniqueId* id);
// A unique id whose store listens on an ephemeral port of `config`'s interface (BRAID_COMM_ID,
// meant for one job's rank 0, is not used): the new communicators of braidCommSplit.
Status makeUniqueIdFor(const Config& config, braidUniqueId* id);
// CommOptions over a Config (BRAID_TIMEOUT, when set, still wins over timeoutSec).
Status applyOptions(const CommOptions& options, Config* config);
std::string uniqueIdToString(const braidUniqueId& id);
Result<braidUniqueId> uniqueIdFromString(const std::string& text);

// `options` (braid.hpp's CommOptions) adjust the environment's Config for this communicator only.
Result<InitParams> paramsFromUniqueId(const braidUniqueId& id, int nranks, int rank, const CommOptions& options = {});
Result<InitParams> paramsFromEnv(const CommOptions& options = {});
// The secret that admits ranks (and braid status) to the store at ip:port in environment and
// store mode: BRAID_SECRET, or, where none is set, one made of the address (anyone who can reach
// the port may then join).
std::string storeSecret(const std::string& braidSecret, const std::string& ip, int port);
Result<InitParams> paramsFromStore(const std::string& host, int port, bool isHost, int nranks, int rank,
                                   const CommOptions& options = {});

}  // namespace braid
