// What a transport needs to build its connections at communicator creation: who is who, the
// bootstrap store to exchange names through, and the deadline for the whole setup.
#pragma once
#include <string>
#include <vector>

#include "comm/config.h"
#include "comm/deadline.h"
#include "comm/store.h"
#include "transport/transport.h"

namespace braid {

struct SetupContext {
  int rank;
  int nranks;
  std::string nonce;   // unique per communicator: names shared-memory segments
  std::string secret;  // the job's secret: tcp connections prove they know it (comm/auth.h)
  const Config& config;
  const std::vector<PeerInfo>& peers;
  StoreClient& store;
  Deadline deadline;
};

}  // namespace braid
