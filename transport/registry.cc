#include "transport/registry.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "base/auth.h"
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

std::string settingsDigest(const std::string& settings) {
  const auth::Digest d = auth::sha256(settings.data(), settings.size());
  std::string text(1, '#');
  text += auth::toHex(d.data(), 8);
  return text;
}

PeerInfo rosterEntry(const TransportList& transports, const PeerInfo& full) {
  PeerInfo e;
  e.rank = full.rank;
  e.host = full.host;
  e.bootId = full.bootId;
  e.pid = full.pid;
  e.settings = settingsDigest(full.settings);
  for (const auto& t : transports) {
    const TransportAddress* ta = full.transport(t->name());
    if (!ta) continue;
    TransportAddress k = *ta;
    if (k.usable && !t->connectsOnUse()) k.address = t->reachKey(k.address);
    e.transports.push_back(std::move(k));
  }
  return e;
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

namespace {
// What decides how a rank reaches any peer, beside whether the peer shares its host: per transport,
// whether it published an entry, whether that is usable, and the transport's reach key.
std::string reachProfile(const TransportList& transports, const PeerInfo& info) {
  std::string p;
  for (const auto& t : transports) {
    const TransportAddress* ta = info.transport(t->name());
    p += !ta ? '-' : !ta->usable ? 'x' : 'u';
    if (ta && ta->usable) p += t->reachKey(ta->address);
    p += '\x1f';
  }
  return p;
}
}  // namespace

// Ranks of one profile reach a peer alike, given only whether it shares their host (see reachKey),
// and `slower` keeps the same answer whatever the order and however often a link comes: so one
// pair of each kind that occurs (two profiles, on one host or on two) gives what every pair gives,
// in O(n) rather than O(n^2) pairs (at 10,000 ranks every rank would otherwise weigh 50 million).
LinkClass slowestLink(const TransportList& transports, const std::vector<PeerInfo>& infos, bool withinHosts) {
  std::map<std::string, int> profileIds;
  std::map<std::pair<std::string, std::string>, int> hostIds;
  const std::size_t n = infos.size();
  std::vector<int> profile(n), host(n);
  for (std::size_t i = 0; i < n; ++i) {
    profile[i] = profileIds.emplace(reachProfile(transports, infos[i]), static_cast<int>(profileIds.size())).first->second;
    host[i] = hostIds.emplace(std::make_pair(infos[i].host, infos[i].bootId), static_cast<int>(hostIds.size())).first->second;
  }
  const std::size_t P = profileIds.size();
  // Within a host: up to two ranks of each profile on each host. Across hosts: up to two ranks of
  // each profile, on different hosts.
  std::map<std::pair<int, int>, std::vector<std::size_t>> onHost;  // (host, profile) -> ranks
  std::vector<std::vector<std::size_t>> across(P);
  for (std::size_t i = 0; i < n; ++i) {
    auto& h = onHost[{host[i], profile[i]}];
    if (h.size() < 2) h.push_back(i);
    auto& x = across[static_cast<std::size_t>(profile[i])];
    if (x.empty() || (x.size() == 1 && host[x[0]] != host[i])) x.push_back(i);
  }
  LinkClass worst;  // one rank alone: nothing slower than its own memory
  bool any = false;
  std::set<std::tuple<int, int, bool>> seen;
  auto weigh = [&](std::size_t i, std::size_t j) {
    const bool same = host[i] == host[j];
    const int p = std::min(profile[i], profile[j]), q = std::max(profile[i], profile[j]);
    if (!seen.insert({p, q, same}).second) return;
    Selection s = selectTransport(transports, infos[i], infos[j]);
    if (s.index < 0) return;
    LinkClass l = transports[static_cast<std::size_t>(s.index)]->linkClass(infos[i], infos[j]);
    worst = any ? LinkClass::slower(worst, l) : l;
    any = true;
  };
  // Pairs on one host: every two profiles present on it.
  for (auto a = onHost.begin(); a != onHost.end(); ++a)
    for (auto b = a; b != onHost.end() && b->first.first == a->first.first; ++b) {
      if (a == b) {
        if (a->second.size() == 2) weigh(a->second[0], a->second[1]);
      } else {
        weigh(a->second[0], b->second[0]);
      }
    }
  if (withinHosts) return worst;
  // Pairs across hosts: for two profiles, any two of their ranks on different hosts.
  for (std::size_t p = 0; p < P; ++p)
    for (std::size_t q = p; q < P; ++q)
      for (std::size_t i : across[p])
        for (std::size_t j : across[q])
          if (i != j && host[i] != host[j]) weigh(i, j);
  return worst;
}

}  // namespace braid
