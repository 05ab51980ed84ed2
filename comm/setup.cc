// Creating a communicator: the rendezvous (joining the store, the communicator's nonce, every
// rank's PeerInfo), the choice of a transport per pair, what every rank agrees on before any
// connection (descriptors, cross-memory attach, oversubscription), the connections, and the host
// layout the tuner and the hierarchical algorithms read. docs/architecture/bootstrap.md.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "base/fdlimit.h"
#include "base/log.h"
#include "comm/bootstrap/roster.h"
#include "comm/communicator.h"
#include "comm/tuner.h"
#include "kernels/reduce.h"
#include "topology/topology.h"
#include "transport/registry.h"
#include "transport/setup.h"
#include "transport/tcp/tcp_transport.h"

namespace braid {
namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string readBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string hostName() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

namespace {
Result<std::shared_ptr<Comm>> created(Result<InitParams> p) {
  if (!p.ok()) return p.status();
  return Comm::create(std::move(*p));
}
}  // namespace

Result<std::shared_ptr<Comm>> initFromUniqueId(const braidUniqueId& id, int nranks, int rank, const CommOptions& options) {
  return created(paramsFromUniqueId(id, nranks, rank, options));
}
Result<std::shared_ptr<Comm>> initFromEnv(const CommOptions& options) { return created(paramsFromEnv(options)); }
Result<std::shared_ptr<Comm>> initFromStore(const std::string& host, int port, bool isHost, int nranks, int rank,
                                            const CommOptions& options) {
  return created(paramsFromStore(host, port, isHost, nranks, rank, options));
}

Result<std::shared_ptr<Comm>> Comm::create(InitParams params) {
  std::shared_ptr<Comm> c(new Comm());
  c->self_ = c;
  Status s = c->setup(params);
  if (!s.ok()) {
    // If this process hosts the store, keep it up a moment so that the notice of this failure
    // reaches the other ranks (instead of their seeing the store vanish).
    if (c->store_) c->store_->close();
    Deadline grace = Deadline::after(std::min(5.0, params.config.timeoutSec));
    if (c->storeServer_) c->storeServer_->waitUntilAllLeft(grace);
    StoreServer::waitForDetached(params.storeNonce, grace);
    c->shutdown(true);
    return s;
  }
  c->noteCudaDevice();
  return c;
}

Status Comm::setup(InitParams& p) {
  rank_ = p.rank;
  nranks_ = p.nranks;
  storeNonce_ = p.storeNonce;
  config_ = p.config;
  log::configure(config_.debug, config_.debugSubsys);
  log::setRank(rank_);
  const Deadline deadline = Deadline::after(config_.timeoutSec);
  const std::string me = "rank " + std::to_string(rank_);

  if (p.hostStore) {
    // MASTER_ADDR when it is ours, else the chosen interface; every address only if asked.
    auto bindIp = net::bindAddressFor(p.storeIp, config_.socketIfname, config_.socketBindAll);
    if (!bindIp.ok()) return bindIp.status().withContext(me + " could not host the rendezvous store");
    auto srv = StoreServer::start(*bindIp, p.storePort, p.storeNonce);
    if (!srv.ok()) return srv.status().withContext(me + " could not host the rendezvous store");
    storeServer_ = std::move(srv.value());
  }
  auto store = StoreClient::connect(p.storeIp, p.storePort, p.storeNonce, rank_, nranks_, deadline);
  if (!store.ok()) return store.status();
  store_ = std::move(store.value());

  // The communicator's own nonce names its shared memory and authenticates its sockets.
  if (rank_ == 0) {
    unsigned char raw[16] = {};
    std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(raw), sizeof(raw));
    char hex[33];
    for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    Status s = store_->set("comm/nonce", hex, deadline);
    if (!s.ok()) return s;
  }
  auto nonce = store_->get("comm/nonce", deadline);
  if (!nonce.ok()) return nonce.status();
  nonce_ = *nonce;
  commTag_ = fnv1a(nonce_);

  // Publish who this rank is, with every transport's address (or why it cannot run here), then
  // learn everyone.
  transports_ = makeTransports(config_);
  PeerInfo self;
  self.rank = rank_;
  // BRAID_HOSTID stands for both: ranks that name the same host share it, whatever the kernel.
  self.host = config_.hostId.empty() ? hostName() : config_.hostId;
  self.bootId = config_.hostId.empty() ? readBootId() : "BRAID_HOSTID";
  self.pid = getpid();
  // Settings that shape the messages on the wire: ranks that differ would misread each other.
  self.settings = "BRAID_NSOCKS=" + std::to_string(config_.nsocks) + " BRAID_BUFFSIZE=" +
                  std::to_string(config_.buffSize) + " BRAID_ALGO=" + config_.algo + " BRAID_CONNECT=" + config_.connect +
                  " BRAID_ZERO_COPY=" + (config_.zeroCopy ? "1" : "0") + " BRAID_CMA=" + (config_.cma ? "1" : "0") +
                  " BRAID_TCP_CONGESTION=" + config_.tcpCongestion + " BRAID_CUDA_IPC=" + (config_.cudaIpc ? "1" : "0");
  self.cmaProbe = cmaProbeAddress();
  self.cpus = topology::cpuListText(topology::allowedCpus());
  self.tuningL3 = topology::tuningL3Bytes();
  for (auto& t : transports_) {
    auto offer = offerTransport(*t, p.storeIp, nranks_ == 1);
    if (!offer.ok()) return offer.status().withContext(me);
    self.transports.push_back(std::move(*offer));
  }
  // The set-up tree's listener (on the interface tcp uses), published with the rest.
  std::unique_ptr<RosterTree> tree;
  if (nranks_ > 1) {
    // Its descriptors (a listener, a parent, the children) and, on the store's host, one per rank:
    // a rank short of them says so to every rank now, not as a connection that fails later.
    const long children = static_cast<long>(RosterTree::childrenOf(rank_, nranks_).size());
    const Status room = fdlimit::reserve(children + 2 + (p.hostStore ? nranks_ : 0), me,
                                         std::to_string(children + 2) + " for the set-up tree" +
                                             (p.hostStore ? ", " + std::to_string(nranks_) + " for the rendezvous store's ranks" : ""));
    if (!room.ok()) {
      store_->report({Notice::kError, rank_, room.code(), room.message()});
      return room;
    }
    auto ip = jobInterfaceAddress(config_, p.storeIp);
    if (!ip.ok()) return ip.status().withContext(me + "'s set-up tree");
    auto t = RosterTree::listen(config_.socketBindAll ? "0.0.0.0" : *ip, *ip, children > 0);
    if (!t.ok()) return t.status().withContext(me);
    tree = std::move(t.value());
    self.boot = tree->address();
  }
  Status s = store_->set("info/" + std::to_string(rank_), self.serialize(), deadline);
  if (!s.ok()) return s;
  // Every rank's roster entry, through the set-up tree: the store serves each rank its parent's
  // PeerInfo and, below, those of the peers it connects now, never every rank's (O(n) requests and
  // bytes per communicator, not O(n^2) bytes).
  auto storedInfo = [store = store_.get()](int r, const Deadline& d) -> Result<PeerInfo> {
    auto text = store->get("info/" + std::to_string(r), d);
    if (!text.ok()) return text.status();
    return PeerInfo::parse(*text);
  };
  std::vector<PeerInfo> infos(static_cast<std::size_t>(nranks_));
  if (tree) {
    RosterTree::Job job{rank_, nranks_, p.storeNonce, nonce_, deadline};
    auto entries = tree->allGather(job, rosterEntry(transports_, self).serialize(), [&]() -> Result<std::string> {
      auto parent = storedInfo(RosterTree::parentOf(rank_), deadline);
      if (!parent.ok()) return parent.status();
      return parent->boot;
    }, *store_);
    if (!entries.ok()) return entries.status();  // (the tree has told every rank through the store)
    for (int r = 0; r < nranks_; ++r) {
      auto info = PeerInfo::parse((*entries)[static_cast<std::size_t>(r)]);
      if (!info.ok()) return info.status().withContext("rank " + std::to_string(r) + "'s roster entry");
      if (info->rank != r) return Status::Internal("rank " + std::to_string(r) + "'s roster entry names rank " + std::to_string(info->rank));
      infos[static_cast<std::size_t>(r)] = std::move(*info);
    }
  }
  // Every choice below reads entries alike, this rank's own too.
  infos[static_cast<std::size_t>(rank_)] = rosterEntry(transports_, self);

  const std::string mySettings = settingsDigest(self.settings);
  for (const PeerInfo& info : infos)
    if (info.rank != rank_ && info.settings != mySettings) {
      auto theirs = storedInfo(info.rank, deadline);
      return Status::InvalidUsage("rank " + std::to_string(info.rank) + " runs with " +
                                  (theirs.ok() ? theirs->settings : "other settings") + " but rank " +
                                  std::to_string(rank_) + " with " + self.settings +
                                  ": set the same BRAID_* values on every rank");
    }

  // Choose a transport per peer (every rank could work out every pair's choice: selectTransport
  // is a function of the two ranks' roster entries) and connect.
  std::vector<std::vector<int>> peersOf(transports_.size());
  transportNames_.assign(static_cast<std::size_t>(nranks_), "self");
  skipped_.assign(static_cast<std::size_t>(nranks_), "");
  std::vector<int> chosen(static_cast<std::size_t>(nranks_), -1);  // by peer: its transport's index
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    Selection sel = selectTransport(transports_, infos[static_cast<std::size_t>(rank_)], infos[static_cast<std::size_t>(r)]);
    if (sel.index < 0)
      return Status::SystemError(me + " has no transport to rank " + std::to_string(r) + ": " + sel.skipped);
    transportNames_[static_cast<std::size_t>(r)] = sel.transport;
    skipped_[static_cast<std::size_t>(r)] = sel.skipped;
    chosen[static_cast<std::size_t>(r)] = sel.index;
    BRAID_LOG(kInfo, kInit, "peer %d: %s%s%s", r, sel.transport.c_str(), sel.skipped.empty() ? "" : " (",
              sel.skipped.empty() ? "" : (sel.skipped + ")").c_str());
  }
  roster_ = infos;  // (entries: each pair's choice for the doctor, Comm::choiceBetween)
  // Which peers connect now (BRAID_CONNECT): all of them, or this host's ranks and the peers the
  // algorithms reach (comm/connect.cc); a transport that cannot connect later connects all its peers.
  maxChannels_ = config_.nsocks;
  layOutHosts(infos);
  const bool connectAll = connectsEveryPair(config_, nranks_);
  std::vector<char> now(static_cast<std::size_t>(nranks_), 1);
  if (!connectAll) {
    now.assign(static_cast<std::size_t>(nranks_), 0);
    for (int r : peersAtSetup()) now[static_cast<std::size_t>(r)] = 1;
  }
  laterVia_.assign(static_cast<std::size_t>(nranks_), -1);
  int later = 0;
  for (int r = 0; r < nranks_; ++r) {
    const int t = chosen[static_cast<std::size_t>(r)];
    if (t < 0) continue;
    if (now[static_cast<std::size_t>(r)] || !transports_[static_cast<std::size_t>(t)]->connectsOnUse()) {
      peersOf[static_cast<std::size_t>(t)].push_back(r);
    } else {
      laterVia_[static_cast<std::size_t>(r)] = t;
      ++later;
    }
  }
  // The full PeerInfos this rank reads: its host's ranks' (CPUs, L3, cross-memory probe, shm) and
  // those of every peer it connects now (their transports' addresses). One request per 1,024.
  std::vector<std::string> keys;
  std::vector<int> fetched;
  for (int r = 0; r < nranks_; ++r) {
    const int t = chosen[static_cast<std::size_t>(r)];
    const bool connectsNow = t >= 0 && laterVia_[static_cast<std::size_t>(r)] < 0;
    if (r != rank_ && (connectsNow || infos[static_cast<std::size_t>(r)].sameHostAs(self))) {
      keys.push_back("info/" + std::to_string(r));
      fetched.push_back(r);
    }
  }
  auto texts = store_->getMany(keys, deadline);
  if (!texts.ok()) return texts.status();
  for (std::size_t k = 0; k < fetched.size(); ++k) {
    auto info = PeerInfo::parse((*texts)[k]);
    if (!info.ok()) return info.status().withContext("rank " + std::to_string(fetched[k]) + "'s PeerInfo");
    infos[static_cast<std::size_t>(fetched[k])] = std::move(*info);
  }
  infos[static_cast<std::size_t>(rank_)] = self;
  int localRanks = 0;
  std::set<int> localCpus;  // every CPU some rank of this host may run on
  bool cpusKnown = true;
  for (const PeerInfo& info : infos)
    if (info.sameHostAs(self)) {
      ++localRanks;
      std::vector<int> cpus = topology::parseCpuList(info.cpus);
      cpusKnown = cpusKnown && !cpus.empty();
      localCpus.insert(cpus.begin(), cpus.end());
    }
  for (const PeerInfo& info : infos) {
    pids_.push_back(info.pid);
    localPeer_.push_back(info.sameHostAs(self));
    hostNames_.push_back(info.host);
  }
  cmaCacheBytes_ = self.tuningL3 ? self.tuningL3 : topology::kAssumedL3Bytes;
  for (const PeerInfo& info : infos)
    if (info.sameHostAs(self) && info.tuningL3) cmaCacheBytes_ = std::min<std::size_t>(cmaCacheBytes_, info.tuningL3);
  // Oversubscribed: this host's ranks outnumber the CPUs they may run on together (bound one per
  // core by `braid run` or mpirun, or each free to use the whole machine).
  const int hostCpus = cpusKnown ? static_cast<int>(localCpus.size()) : topology::summary().pus;
  const bool oversubscribed = localRanks > hostCpus;
  // The tuner's input and the shared-memory paths' condition, from every pair's link: the same on
  // every rank, which sees the same PeerInfos.
  link_ = slowestLink(transports_, infos);
  // Descriptors: room for every connection this rank is about to open (and, on the store's host,
  // one per rank for the store), the soft limit raised toward the hard one if needed.
  long fdsNeeded = p.hostStore ? nranks_ : 0;
  std::string fdsWhat = p.hostStore ? std::to_string(nranks_) + " for the rendezvous store's ranks" : "";
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    const long per = transports_[i]->descriptorsPerPeer();
    if (!per || peersOf[i].empty()) continue;
    fdsNeeded += per * static_cast<long>(peersOf[i].size());
    fdsWhat += std::string(fdsWhat.empty() ? "" : ", ") + std::to_string(per * static_cast<long>(peersOf[i].size())) +
               " for " + std::to_string(peersOf[i].size()) + " " + std::string(transports_[i]->name()) + " peers";
  }
  const Status fds = fdlimit::reserve(fdsNeeded, me, fdsWhat.empty() ? "none for its peers" : fdsWhat);
  // One counter, before any connection, holds what every rank must agree on: the low bits count
  // the ranks that can attach to each other's memory (cross-memory attach: only if every rank can
  // read every other, and only where no rank is oversubscribed), the middle ones the
  // oversubscribed ranks, the high ones the ranks that cannot open the descriptors they need (then
  // every rank fails now, naming one of them, instead of a connection timing out later).
  constexpr std::int64_t kOversubscribedUnit = std::int64_t{1} << 21, kFdsShortUnit = std::int64_t{1} << 42;
  const bool cmaHere = config_.cma && link_.sharedMemory && probeCma(infos);
  if (!fds.ok()) {
    s = store_->set("setup/fds", fds.message(), deadline);
    if (!s.ok()) return s;
  }
  auto agreed = store_->add("setup/agree", (cmaHere ? 1 : 0) + (oversubscribed ? kOversubscribedUnit : 0) +
                                               (fds.ok() ? 0 : kFdsShortUnit), deadline);
  if (!agreed.ok()) return agreed.status();
  s = store_->barrier("setup/ready", nranks_, deadline);
  if (!s.ok()) return s;
  auto total = store_->add("setup/agree", 0, deadline);
  if (!total.ok()) return total.status();
  if (!fds.ok()) return fds;
  if (const std::int64_t shortRanks = *total / kFdsShortUnit) {
    auto why = store_->get("setup/fds", deadline);
    return Status::SystemError(std::to_string(shortRanks) + " rank(s) cannot open the descriptors this communicator "
                               "needs, so no rank connects; " + (why.ok() ? *why : why.status().message()));
  }
  cmaUsable_ = link_.sharedMemory && *total % kOversubscribedUnit == nranks_;
  oversubscribed_ = *total % kFdsShortUnit >= kOversubscribedUnit;
  SetupContext ctx{rank_, nranks_, nonce_, p.storeNonce, config_, infos, *store_, deadline, later > 0, storedInfo};
  conns_.resize(static_cast<std::size_t>(nranks_));
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    auto made = transports_[i]->connect(ctx, peersOf[i]);
    const std::string name(transports_[i]->name());
    if (!made.ok()) {
      store_->report({Notice::kError, rank_, made.status().code(), me + ": " + made.status().message()});
      return made.status().withContext(me + " " + name + " setup");
    }
    for (auto& c : *made) conns_[static_cast<std::size_t>(c->peer())] = std::move(c);
  }
  waiter_ = std::make_unique<Waiter>(config_.spinUs, oversubscribed);
  lazyWorkerWake_ = oversubscribed;
  for (auto& t : transports_) {
    WaitSources w = t->waitSources();
    if (w.doorbell) waiter_->setDoorbell(w.doorbell);
    for (int fd : w.fds) waiter_->addSocket(fd);
    waitedFds_.push_back(w.fds.size());
    for (std::atomic<bool>* f : w.beforeSleep) waiter_->addSleepFlag(f);
    if (!mailbox_) mailbox_ = t->mailbox();
  }
  // Nobody returns before every rank has read the counters: a rank 0 that returned and died at
  // once would take the store, and those reads, with it.
  s = store_->barrier("setup/agreed", nranks_, deadline);
  if (!s.ok()) return s;
  oneHost_ = hosts_.size() == 1;
  HostShape shape = hostSizes_;
  shape.local = slowestLink(transports_, infos, /*withinHosts=*/true);
  // Whether every pair was connected at creation decides the tuner's candidates, so it must be
  // the same on every rank: a setting and the host layout, not this rank's own count of peers
  // left for later (which differs between ranks).
  tuner_ = Tuner(config_, nranks_, maxChannels_, link_, shape, /*allPairs=*/connectAll || oneHost_);
  for (auto& t : transports_) t->setupDone();  // everyone has mapped everything: nothing stays in /dev/shm
  // The recorder's clock, the live state and the observers before the watcher starts: it answers
  // braid status from them and serves the metrics port.
  trace_.init(config_.traceBuffer, config_.traceDir, {rank_, nranks_, static_cast<long>(getpid()), self.host, commTag_});
  live_.progress().setPeers(nranks_);
  plan_.setLive(&live_.progress());
  openObservers();  // (before the watcher starts: it serves the metrics port)
  store_->startWatching([this](const Notice& n) { onNotice(n); });
  if (const std::int64_t served = storeRequests(); served >= 0)
    BRAID_LOG(kInfo, kBoot, "store: %lld requests so far for the set-up of %d ranks (%.1f a rank), %lld bytes (%.0f a rank)",
              static_cast<long long>(served), nranks_, static_cast<double>(served) / nranks_,
              static_cast<long long>(storeBytes()), static_cast<double>(storeBytes()) / nranks_);
  std::string counts;
  for (std::size_t i = 0; i < transports_.size(); ++i)
    counts += std::to_string(peersOf[i].size()) + " " + std::string(transports_[i]->name()) + " peers, ";
  if (later) counts += std::to_string(later) + " more on first use, ";
  BRAID_LOG(kInfo, kInit, "rank %d of %d ready: %s%d local ranks on %d cpus%s, reduce isa %s, cross-memory attach %s",
            rank_, nranks_, counts.c_str(), localRanks, hostCpus, oversubscribed ? " (oversubscribed: spinning less)" : "",
            kernels::isaName(), cmaUsable_ ? "on" : "off");
  return Status::Ok();
}

std::int64_t Comm::storeRequests() const {
  return storeServer_ ? storeServer_->requests() : StoreServer::requestsOfDetached(storeNonce_);
}

std::int64_t Comm::storeBytes() const {
  return storeServer_ ? storeServer_->bytes() : StoreServer::bytesOfDetached(storeNonce_);
}

void Comm::layOutHosts(const std::vector<PeerInfo>& infos) {
  std::map<std::pair<std::string, std::string>, int> label;  // (host, boot id): PeerInfo::sameHostAs
  std::vector<int> labelOf(infos.size());
  for (std::size_t r = 0; r < infos.size(); ++r)
    labelOf[r] = label.emplace(std::make_pair(infos[r].host, infos[r].bootId), static_cast<int>(label.size())).first->second;
  RankLayout l = layOutRanks(labelOf);
  hosts_ = std::move(l.hosts);
  hostOf_ = std::move(l.hostOf);
  ringOrder_ = std::move(l.ringOrder);
  ringPos_ = std::move(l.ringPos);
  hostSizes_ = hostShape(hosts_);
}

bool Comm::probeCma(const std::vector<PeerInfo>& infos) const {
  for (const PeerInfo& info : infos) {
    if (info.rank == rank_) continue;
    Status s = cmaProbe(info.pid, info.cmaProbe);
    if (!s.ok()) {
      BRAID_LOG(kInfo, kInit, "cross-memory attach to rank %d: %s", info.rank, s.message().c_str());
      return false;
    }
  }
  return true;
}

}  // namespace braid
