// What a transport needs to build its connections at communicator creation: who is who, a way to
// exchange names with the other ranks, and the deadline for the whole setup. Transports see the
// bootstrap only through Exchange (base/exchange.h): the communicator passes its rendezvous
// store as one, so nothing in transport/ includes the bootstrap.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/deadline.h"
#include "base/exchange.h"
#include "transport/transport.h"

namespace braid {

struct SetupContext {
  int rank;
  int nranks;
  std::string nonce;   // unique per communicator: names shared-memory segments
  std::string secret;  // the job's secret: tcp connections prove they know it (base/auth.h)
  const Config& config;
  const std::vector<PeerInfo>& peers;
  Exchange& store;
  Deadline deadline;
  // Some peers of this transport are left for first use (Transport::connectOnUse): keep what
  // they need to reach this rank (the tcp listener).
  bool connectLater = false;
  // A rank's full PeerInfo (its transports' addresses), for a transport that connects a peer on
  // first use whose address the roster does not carry (ib). Valid while the communicator lives.
  std::function<Result<PeerInfo>(int rank, const Deadline& d)> fullInfo;
};

}  // namespace braid
