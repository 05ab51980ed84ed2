// The three ways to find the other ranks: a unique id passed out of band, the launcher's
// environment (torchrun / braid run / Open MPI / Slurm), or an explicit store address.
#pragma once
#include <memory>
#include <string>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "braid/status.hpp"

namespace braid {

class Comm;

Status makeUniqueId(braidUniqueId* id);
std::string uniqueIdToString(const braidUniqueId& id);
Result<braidUniqueId> uniqueIdFromString(const std::string& text);

// `options` (braid.hpp's CommOptions) adjust the environment's Config for this communicator only.
Result<std::shared_ptr<Comm>> initFromUniqueId(const braidUniqueId& id, int nranks, int rank,
                                               const CommOptions& options = {});
Result<std::shared_ptr<Comm>> initFromEnv(const CommOptions& options = {});
Result<std::shared_ptr<Comm>> initFromStore(const std::string& host, int port, bool isHost, int nranks, int rank,
                                            const CommOptions& options = {});

}  // namespace braid
