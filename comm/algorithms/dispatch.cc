// What a communicator and the simulator (sim/) share so that both run the same plans: the
// ranks' layout over hosts, the plan of one call from the algorithm the tuner chose, and the
// numbering and plan of a group of sends and receives.
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

Fingerprint SendRecvNumbers::number(const CollArgs& a, int rank) {
  Fingerprint fp = callFingerprint(a);
  fp.root = a.isSend ? a.peer : rank;
  fp.sender = a.isSend ? rank : a.peer;
  fp.tag = a.tag;
  fp.seq = ++(a.isSend ? sends_ : recvs_)[a.peer];
  return fp;
}

void buildSendRecvGroup(const std::vector<const CollArgs*>& calls, const std::vector<Fingerprint>& fps, Plan& plan) {
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CollArgs& a = *calls[i];
    const std::size_t bytes = a.count * dataTypeSize(a.dtype);
    plan.setFingerprint(a.isSend ? plan.send(a.peer, 0, a.send, bytes) : plan.recvCopy(a.peer, 0, a.recv, bytes), fps[i]);
  }
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
      else if (algo == Algo::kBruck) buildBruckAllGather(a, ws, plan);
      else buildRingAllGather(a, ws, channels, plan);
      break;
    case CollKind::kReduceScatter:
      if (algo == Algo::kHier && hierApplies(ws)) buildHierReduceScatter(a, ws, channels, plan);
      else if (algo == Algo::kBruck) buildBruckReduceScatter(a, ws, plan);
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
