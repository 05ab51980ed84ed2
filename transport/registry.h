// The transports Braid knows, in priority order, and the per-peer choice between them: shm when the
// peer is on this host and shm works on both sides, then ib when built and usable, then tcp. Each
// skipped transport comes with a reason, logged at INFO and shown by the tools.
#pragma once
#include <string>

#include "comm/config.h"
#include "transport/transport.h"

namespace braid {

struct Selection {
  std::string transport;  // "shm", "ib" or "tcp"
  std::string skipped;    // "shm skipped: ...; ib skipped: ..."
};

Selection selectTransport(const PeerInfo& self, const PeerInfo& peer, const Config& config);
// Whether the ib transport can run here, and if not why (also used by `braid info`).
Availability probeIb(const Config& config);

}  // namespace braid
