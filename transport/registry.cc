#include "transport/registry.h"

#include <algorithm>

#include "braid_build_config.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#if BRAID_HAVE_IBVERBS
#include "transport/ib/ib_transport.h"
#endif

namespace braid {

TransportList makeTransports(const Config& config) {
  TransportList list;
  list.push_back(std::make_unique<ShmTransport>(config));
#if BRAID_HAVE_IBVERBS
  list.push_back(std::make_unique<IbTransport>(config));
#endif
  list.push_back(std::make_unique<TcpTransport>(config));
  return list;
}

Result<TransportAddress> offerTransport(Transport& t, const std::string& rendezvousIp, bool alone) {
  TransportAddress ta{std::string(t.name()), false, ""};
  Availability here = t.probe();
  if (!here.usable) {
    ta.address = here.reason;
    return ta;
  }
  ta.usable = true;
  if (alone) return ta;
  auto addr = t.localAddress(rendezvousIp);
  if (!addr.ok()) return addr.status().withContext(ta.name + " transport");
  ta.address = *addr;
  return ta;
}

Selection selectTransport(const TransportList& transports, const PeerInfo& x, const PeerInfo& y) {
  // In rank order, so that (x, y) and (y, x) ask every transport the same question.
  const PeerInfo& a = x.rank <= y.rank ? x : y;
  const PeerInfo& b = x.rank <= y.rank ? y : x;
  Selection s;
  for (std::size_t i = 0; i < transports.size(); ++i) {
    const Transport& t = *transports[i];
    const std::string name(t.name());
    std::string why;
    const TransportAddress* ta = a.transport(name);
    const TransportAddress* tb = b.transport(name);
    if (!ta || !tb) why = "rank " + std::to_string(ta ? b.rank : a.rank) + " does not offer it";
    else if (!ta->usable) why = "unusable on rank " + std::to_string(a.rank) + ": " + ta->address;
    else if (!tb->usable) why = "unusable on rank " + std::to_string(b.rank) + ": " + tb->address;
    else {
      Availability reach = t.canReach(a, b);
      if (reach.usable) {
        s.index = static_cast<int>(i);
        s.transport = name;
        return s;
      }
      why = reach.reason;
    }
    s.skipped += (s.skipped.empty() ? "" : "; ") + name + " skipped: " + why;
  }
  return s;
}

LinkClass LinkClass::slower(const LinkClass& a, const LinkClass& b) {
  if (a.latencyUs != b.latencyUs) return a.latencyUs > b.latencyUs ? a : b;
  LinkClass c = a;
  c.bytesPerUs = std::min(a.bytesPerUs, b.bytesPerUs);
  c.minPiece = std::max(a.minPiece, b.minPiece);
  c.sameHost = a.sameHost && b.sameHost;
  c.sharedMemory = a.sharedMemory && b.sharedMemory;
  c.oneStreamBest = a.oneStreamBest && b.oneStreamBest;
  c.maxPiece = std::min(a.maxPiece, b.maxPiece);
  return c;
}

LinkClass slowestLink(const TransportList& transports, const std::vector<PeerInfo>& infos, bool withinHosts) {
  LinkClass worst;  // one rank alone: nothing slower than its own memory
  bool any = false;
  for (std::size_t i = 0; i < infos.size(); ++i)
    for (std::size_t j = i + 1; j < infos.size(); ++j) {
      if (withinHosts && !infos[i].sameHostAs(infos[j])) continue;
      Selection s = selectTransport(transports, infos[i], infos[j]);
      if (s.index < 0) continue;
      LinkClass l = transports[static_cast<std::size_t>(s.index)]->linkClass(infos[i], infos[j]);
      worst = any ? LinkClass::slower(worst, l) : l;
      any = true;
    }
  return worst;
}

}  // namespace braid
