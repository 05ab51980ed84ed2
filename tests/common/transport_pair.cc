#include "tests/common/transport_pair.h"

#include <unistd.h>

#include <thread>

#include "base/deadline.h"
#include "comm/bootstrap/store.h"
#include "transport/registry.h"
#include "transport/setup.h"

namespace braid::test {

struct TransportPair::Store {
  std::unique_ptr<StoreServer> server;
};

struct TransportPair::Rank {
  TransportList transports;
  Transport* used = nullptr;
  std::unique_ptr<StoreClient> store;
};

std::vector<std::string> TransportPair::registryNames() {
  std::vector<std::string> names;
  for (auto& t : makeTransports(Config{})) names.emplace_back(t->name());
  return names;
}

Result<std::unique_ptr<TransportPair>> TransportPair::make(const std::string& transport, const Config& config) {
  std::unique_ptr<TransportPair> p(new TransportPair);
  const Deadline deadline = Deadline::after(config.timeoutSec);
  const std::string secret = "transport-pair-" + std::to_string(getpid());
  auto server = StoreServer::start("127.0.0.1", 0, secret);
  if (!server.ok()) return server.status();
  p->store_ = std::make_unique<Store>();
  p->store_->server = std::move(*server);
  const int port = p->store_->server->port();

  // Each rank: its transports, the one under test offered, the others marked as not under test.
  std::vector<PeerInfo> infos(2);
  for (int r = 0; r < 2; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->transports = makeTransports(config);
    PeerInfo& info = infos[static_cast<std::size_t>(r)];
    info.rank = r;
    info.host = "this-host";
    info.bootId = "this-boot";
    info.pid = getpid();
    for (auto& t : rank->transports) {
      if (t->name() != transport) {
        info.transports.push_back({std::string(t->name()), false, "not under test"});
        continue;
      }
      auto offer = offerTransport(*t, "127.0.0.1", false);
      if (!offer.ok()) return offer.status();
      if (!offer->usable) return Status::SystemError(transport + " cannot run here: " + offer->address);
      info.transports.push_back(*offer);
      rank->used = t.get();
    }
    if (!rank->used) return Status::InvalidArgument("no transport '" + transport + "' in the registry");
    auto client = StoreClient::connect("127.0.0.1", port, secret, r, 2, deadline);
    if (!client.ok()) return client.status();
    rank->store = std::move(*client);
    p->ranks_[r] = std::move(rank);
  }
  Availability reach = p->ranks_[0]->used->canReach(infos[0], infos[1]);
  if (!reach.usable) return Status::SystemError(transport + " does not reach between the two ranks: " + reach.reason);

  // Both ends connect at once (each may wait for the other's half through the store).
  Result<std::vector<std::unique_ptr<Connection>>> made[2] = {Status::Internal("not run"), Status::Internal("not run")};
  auto connect = [&](int r) {
    SetupContext ctx{r, 2, "tp" + std::to_string(getpid()), secret, config, infos, *p->ranks_[r]->store, deadline, false, nullptr};
    made[r] = p->ranks_[r]->used->connect(ctx, {1 - r});
  };
  std::thread other(connect, 1);
  connect(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    if (!made[r].ok()) return made[r].status().withContext("rank " + std::to_string(r) + " " + transport + " connect");
    if (made[r]->size() != 1) return Status::Internal(transport + " made " + std::to_string(made[r]->size()) + " connections");
    p->conns_[r] = std::move((*made[r])[0]);
  }
  for (auto& rank : p->ranks_) rank->used->setupDone();
  return p;
}

void TransportPair::close(int side) {
  conns_[side].reset();
  if (ranks_[side]) {
    ranks_[side]->store->close();
    ranks_[side].reset();
  }
}

TransportPair::~TransportPair() {
  for (int side = 0; side < 2; ++side) close(side);
}

}  // namespace braid::test
