#include "transport/registry.h"

#include <sstream>

#include "transport/shm/shm_transport.h"

namespace braid {

Availability probeIb(const Config& config) {
  if (config.ibDisable) return {false, "disabled by BRAID_IB_DISABLE=1"};
  return {false, "not built: the InfiniBand verbs transport is not implemented yet"};
}

Selection selectTransport(const PeerInfo& self, const PeerInfo& peer, const Config& config) {
  Selection s;
  auto skip = [&](const char* name, const std::string& why) {
    s.skipped += (s.skipped.empty() ? "" : "; ") + std::string(name) + " skipped: " + why;
  };
  Availability shm = ShmTransport::probe(config);
  if (!self.sameHostAs(peer)) skip("shm", "rank " + std::to_string(peer.rank) + " is on host " + peer.host);
  else if (!shm.usable) skip("shm", shm.reason);
  else if (!peer.shmUsable) skip("shm", "rank " + std::to_string(peer.rank) + " cannot use shared memory");
  else { s.transport = "shm"; return s; }
  Availability ib = probeIb(config);
  if (!ib.usable) skip("ib", ib.reason);
  s.transport = "tcp";
  return s;
}

std::string PeerInfo::serialize() const {
  std::ostringstream o;
  o << rank << '\n' << host << '\n' << bootId << '\n' << pid << '\n' << tcpAddr << '\n' << (shmUsable ? 1 : 0) << '\n'
    << settings << '\n' << cmaProbe << '\n' << cpus << '\n' << tuningL3 << '\n';
  return o.str();
}

Result<PeerInfo> PeerInfo::parse(const std::string& text) {
  std::istringstream in(text);
  PeerInfo p;
  int shm = 0;
  std::string line;
  if (!std::getline(in, line)) return Status::Internal("bad peer info");
  p.rank = std::atoi(line.c_str());
  if (!std::getline(in, p.host) || !std::getline(in, p.bootId) || !std::getline(in, line))
    return Status::Internal("bad peer info");
  p.pid = std::atoi(line.c_str());
  if (!std::getline(in, p.tcpAddr) || !(in >> shm)) return Status::Internal("bad peer info");
  p.shmUsable = shm != 0;
  in.ignore(1);
  std::getline(in, p.settings);
  if (!(in >> p.cmaProbe)) p.cmaProbe = 0;
  in.ignore(1);
  std::getline(in, p.cpus);
  if (!(in >> p.tuningL3)) p.tuningL3 = 0;
  return p;
}

}  // namespace braid
