// The transports Braid has, in priority order, and the choice between them for each pair of ranks:
// the first transport that both ranks can use and that reaches between them (shm within a host;
// ib where both ends have a port; tcp anywhere). A new transport is a folder plus one line in registry.cc. Every skipped transport
// comes with its reason, kept on the communicator (`braid info`, the INFO log, `braid doctor`).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "transport/transport.h"

namespace braid {

using TransportList = std::vector<std::unique_ptr<Transport>>;

// One of each transport, in priority order (the order PeerInfo::transports follows).
TransportList makeTransports(const Config& config);

// What a rank publishes for `t` (PeerInfo::transports): its address when probe() says it can run
// here, else the reason it cannot. `alone`: the rank is the communicator's only one, so nothing
// needs to listen (the entry says usable with an empty address).
Result<TransportAddress> offerTransport(Transport& t, const std::string& rendezvousIp, bool alone);

// What every rank must know of a rank (its entry in the set-up tree's roster, comm/bootstrap/
// roster.h): who and where it is, a digest of its settings, and per transport whether it can run
// there (else why not) and its reach key; for a transport that connects peers on first use (tcp),
// its address, since any rank may reach it later. selectTransport, Transport::linkClass and
// slowestLink decide from entries as from full PeerInfos. What the rest holds (shm and ib addresses,
// CPUs, the cross-memory probe, L3, the settings' text) only ranks that connect to it at set-up read.
PeerInfo rosterEntry(const TransportList& transports, const PeerInfo& full);
// The digest of a rank's settings in its roster entry.
std::string settingsDigest(const std::string& settings);

struct Selection {
  int index = -1;         // into the TransportList; -1: none reaches (never for a valid list: tcp does)
  std::string transport;  // its name
  std::string skipped;    // "shm skipped: ...; ib skipped: ..."
};

// The transport between ranks a and b, from their PeerInfos alone and the same for (b, a): every
// rank can work out every pair's choice, and both ends of a pair always agree. The reasons name
// the ranks as a person reading either one's log needs.
Selection selectTransport(const TransportList& transports, const PeerInfo& a, const PeerInfo& b);

// The slowest link among every pair of `infos` (the tuner's input, computed alike by every rank);
// withinHosts: among the pairs on one host only.
LinkClass slowestLink(const TransportList& transports, const std::vector<PeerInfo>& infos, bool withinHosts = false);

}  // namespace braid
