// What a communicator and the simulator (sim/) share so that both run the same plans: the
// ranks' layout over hosts, and the plan of one call from the algorithm the tuner chose.
#include <map>

#include "comm/algorithms/algorithms.h"

namespace braid {

RankLayout layOutRanks(const std::vector<int>& hostLabelOf) {
  RankLayout l;
  l.hostOf.assign(hostLabelOf.size(), -1);
  std::map<int, int> index;  // label -> host index
  for (std::size_t r = 0; r < hostLabelOf.size(); ++r) {
    auto [it, added] = index.emplace(hostLabelOf[r], static_cast<int>(l.hosts.size()));
    if (added) l.hosts.emplace_back();
    l.hostOf[r] = it->second;
    l.hosts[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(r));
  }
  for (const auto& h : l.hosts) l.ringOrder.insert(l.ringOrder.end(), h.begin(), h.end());
  l.ringPos.assign(hostLabelOf.size(), 0);
  for (std::size_t p = 0; p < l.ringOrder.size(); ++p) l.ringPos[static_cast<std::size_t>(l.ringOrder[p])] = static_cast<int>(p);
  return l;
}

Fingerprint callFingerprint(const CollArgs& a) {
  Fingerprint fp;
  fp.kind = a.kind;
  fp.dtype = a.dtype;
  fp.count = a.count;
  if (a.kind == CollKind::kAllReduce || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kReduce) fp.op = a.op;
  if (a.kind == CollKind::kBroadcast || a.kind == CollKind::kReduce) fp.root = a.root;
  return fp;
}

bool buildPlan(const CollArgs& a, Workspace& ws, Algo algo, int channels, int allToAllChannels, Plan& plan) {
  switch (a.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBarrier:
      if (algo == Algo::kOneShot) {
        buildOneShotAllReduce(a, ws, plan);
        return true;
      }
      if (algo == Algo::kTree) buildTreeAllReduce(a, ws, channels, plan);
      else if (algo == Algo::kHier && hierApplies(ws)) buildHierAllReduce(a, ws, channels, plan);
      else buildRingAllReduce(a, ws, channels, plan);
      break;
    case CollKind::kAllGather:
      if (algo == Algo::kHier && hierApplies(ws)) buildHierAllGather(a, ws, channels, plan);
      else buildRingAllGather(a, ws, channels, plan);
      break;
    case CollKind::kReduceScatter:
      if (algo == Algo::kHier && hierApplies(ws)) buildHierReduceScatter(a, ws, channels, plan);
      else buildRingReduceScatter(a, ws, channels, plan);
      break;
    case CollKind::kBroadcast:
    case CollKind::kReduce: buildRooted(a, ws, algo, channels, plan); break;
    case CollKind::kSendRecv: buildSendRecv(a, plan); break;
    case CollKind::kAllToAll:
    case CollKind::kAllToAllv: buildAllToAll(a, ws, allToAllChannels, plan); break;
  }
  return false;
}

}  // namespace braid
