// Which peers a rank connects at set-up, and connecting the others when a call first needs them
// (BRAID_CONNECT). At set-up a rank connects the ranks of its own host and the peers that the
// algorithms the tuner may choose reach from it; those peers are read off the plans themselves
// (each algorithm built for a small call), so a new or changed algorithm cannot leave a peer out.
// docs/architecture/bootstrap.md.
#include <algorithm>

#include "base/fdlimit.h"
#include "base/log.h"
#include "comm/communicator.h"
#include "transport/setup.h"

namespace braid {

std::vector<int> Comm::peersAtSetup() {
  std::vector<char> want(static_cast<std::size_t>(nranks_), 0);
  for (int r : hosts_[static_cast<std::size_t>(hostOf_[static_cast<std::size_t>(rank_)])]) want[static_cast<std::size_t>(r)] = 1;
  // A call of 128 bytes per channel per rank: every block of every channel holds bytes, so every
  // queue an algorithm can have is in its plan.
  const int channels = maxChannels_;
  const std::size_t perRank = static_cast<std::size_t>(channels) * 128;
  std::vector<std::int8_t> in(perRank * static_cast<std::size_t>(nranks_)), out(in.size());
  Plan plan;
  auto build = [&](CollKind kind, std::size_t count, int root, auto&& builder) {
    CollArgs a{};
    a.kind = kind;
    a.send = in.data();
    a.recv = out.data();
    a.count = count;
    a.dtype = DataType::kInt8;
    a.op = ReduceOp::kSum;
    a.root = root;
    plan.reset(Fingerprint{}, commTag_, rank_, nranks_, std::size_t{1} << 18);
    builder(a);
    plan.forEachPeer([&](int p) { want[static_cast<std::size_t>(p)] = 1; });
  };
  const std::size_t whole = in.size();
  build(CollKind::kAllReduce, whole, -1, [&](const CollArgs& a) { buildRingAllReduce(a, *this, channels, plan); });
  build(CollKind::kAllReduce, whole, -1, [&](const CollArgs& a) { buildTreeAllReduce(a, *this, channels, plan); });
  build(CollKind::kAllGather, perRank, -1, [&](const CollArgs& a) { buildRingAllGather(a, *this, channels, plan); });
  build(CollKind::kReduceScatter, perRank, -1, [&](const CollArgs& a) { buildRingReduceScatter(a, *this, channels, plan); });
  if (hierApplies(*this)) {
    build(CollKind::kAllReduce, whole, -1, [&](const CollArgs& a) { buildHierAllReduce(a, *this, channels, plan); });
    build(CollKind::kAllGather, perRank, -1, [&](const CollArgs& a) { buildHierAllGather(a, *this, channels, plan); });
    build(CollKind::kReduceScatter, perRank, -1, [&](const CollArgs& a) { buildHierReduceScatter(a, *this, channels, plan); });
  }
  // Broadcast and reduce from rank 0 (a model's first broadcast, DDP's parameters): other roots'
  // trees connect on first use.
  for (CollKind kind : {CollKind::kBroadcast, CollKind::kReduce})
    for (Algo shape : {Algo::kTree, Algo::kRing})
      build(kind, whole, 0, [&](const CollArgs& a) { buildRooted(a, *this, shape, channels, plan); });
  want[static_cast<std::size_t>(rank_)] = 0;
  std::vector<int> peers;
  for (int r = 0; r < nranks_; ++r)
    if (want[static_cast<std::size_t>(r)]) peers.push_back(r);
  return peers;
}

bool Comm::connectedTo(int peer) const {
  return peer >= 0 && peer < nranks_ && conns_[static_cast<std::size_t>(peer)] != nullptr;
}

bool Comm::hasIncoming(int peer) {
  std::lock_guard<std::mutex> g(execMu_);  // no call reads the channels meanwhile
  if (closed_ || !connectedTo(peer)) return false;
  Connection& c = *conns_[static_cast<std::size_t>(peer)];
  for (int i = 0; i < c.numChannels(); ++i) {
    auto ready = c.channel(i).peek();
    if (!ready.ok() || !ready->empty()) return true;  // (a broken connection: the receive says so)
  }
  return false;
}

// The plan's peers that are not connected yet, connected now, per transport. Every rank whose plan
// reaches this one does the same for it (calls match), so each pair meets: the higher rank
// connects, the lower accepts (transport/tcp). A call that would need more descriptors than this
// process may open is refused before any connection or message, naming the numbers; the refusal
// fails the communicator and reaches every rank through the store (runPlan), so that the ranks
// waiting to connect to this one stop at once, with the numbers, instead of at BRAID_TIMEOUT.
Status Comm::connectPlanPeers(const Plan& plan) {
  std::vector<std::vector<int>> want(transports_.size());
  bool any = false;
  plan.forEachPeer([&](int p) {
    const auto pi = static_cast<std::size_t>(p);
    any = any || (!conns_[pi] && laterVia_[pi] >= 0);
  });
  if (!any) return Status::Ok();  // the common case: one pass over the plan's queues
  std::vector<char> taken(static_cast<std::size_t>(nranks_), 0);  // a peer's queues repeat (channels, directions)
  plan.forEachPeer([&](int p) {
    const auto pi = static_cast<std::size_t>(p);
    if (conns_[pi] || laterVia_[pi] < 0 || taken[pi]) return;
    taken[pi] = 1;
    want[static_cast<std::size_t>(laterVia_[pi])].push_back(p);
  });
  const std::string me = "rank " + std::to_string(rank_);
  const std::string call = plan.fingerprint().describe() + " #" + std::to_string(plan.fingerprint().seq);
  long fds = 0;
  std::string what;
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    if (want[i].empty()) continue;
    const long n = transports_[i]->descriptorsPerPeer() * static_cast<long>(want[i].size());
    fds += n;
    what += (what.empty() ? "" : ", ") + std::to_string(n) + " for " + std::to_string(want[i].size()) + " " +
            std::string(transports_[i]->name()) + " peers it has not reached before";
  }
  Status room = fdlimit::reserve(fds, me + "'s " + call, what);
  if (!room.ok()) return Status::InvalidUsage(room.message() + "; the call was refused before anything was sent");
  const Deadline deadline = Deadline::after(config_.timeoutSec);
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    if (want[i].empty()) continue;
    auto made = transports_[i]->connectOnUse(want[i], deadline, [this] { return failedFast(); });
    if (!made.ok() && made.status().code() != Code::kAborted) waitForNotice(*this);  // the peer may have failed: say why
    if (!made.ok() && failedFast()) return failure().withContext(call + " failed on " + me);
    if (!made.ok()) return made.status().withContext(me + "'s " + call);
    for (auto& c : *made) conns_[static_cast<std::size_t>(c->peer())] = std::move(c);
    BRAID_LOG(kInfo, kInit, "%s: connected %zu %s peer(s) on first use", call.c_str(), want[i].size(),
              std::string(transports_[i]->name()).c_str());
  }
  // The new connections' sockets wake the waiter too.
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    const std::vector<int> fdsNow = transports_[i]->waitSources().fds;
    for (std::size_t k = waitedFds_[i]; k < fdsNow.size(); ++k) waiter_->addSocket(fdsNow[k]);
    waitedFds_[i] = fdsNow.size();
  }
  return Status::Ok();
}

}  // namespace braid
