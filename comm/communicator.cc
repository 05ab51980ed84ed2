// Communicator creation, the call path (validate -> fingerprint -> tune -> plan -> engine), and
// failure handling. A failure seen by any rank is reported once to the store, which tells every
// other rank; from then on each call on the communicator returns that error.
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <set>
#include <thread>

#include "braid_build_config.h"
#include "base/fdlimit.h"
#include "base/log.h"
#include "comm/tuner.h"
#include "kernels/reduce.h"
#include "topology/topology.h"
#include "transport/registry.h"
#include "transport/setup.h"

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
                  std::to_string(config_.buffSize) + " BRAID_ALGO=" + config_.algo +
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
  Status s = store_->set("info/" + std::to_string(rank_), self.serialize(), deadline);
  if (!s.ok()) return s;
  std::vector<PeerInfo> infos(static_cast<std::size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    auto text = store_->get("info/" + std::to_string(r), deadline);
    if (!text.ok()) return text.status();
    auto info = PeerInfo::parse(*text);
    if (!info.ok()) return info.status();
    infos[static_cast<std::size_t>(r)] = *info;
  }

  for (const PeerInfo& info : infos)
    if (info.settings != self.settings)
      return Status::InvalidUsage("rank " + std::to_string(info.rank) + " runs with " + info.settings + " but rank " +
                                  std::to_string(rank_) + " with " + self.settings +
                                  ": set the same BRAID_* values on every rank");

  // Choose a transport per peer (every rank could work out every pair's choice: selectTransport
  // is a function of the two PeerInfos) and connect.
  std::vector<std::vector<int>> peersOf(transports_.size());
  transportNames_.assign(static_cast<std::size_t>(nranks_), "self");
  skipped_.assign(static_cast<std::size_t>(nranks_), "");
  int localRanks = 0;
  std::set<int> localCpus;  // every CPU some rank of this host may run on
  bool cpusKnown = true;
  for (int r = 0; r < nranks_; ++r) {
    if (infos[static_cast<std::size_t>(r)].sameHostAs(self)) {
      ++localRanks;
      std::vector<int> cpus = topology::parseCpuList(infos[static_cast<std::size_t>(r)].cpus);
      cpusKnown = cpusKnown && !cpus.empty();
      localCpus.insert(cpus.begin(), cpus.end());
    }
    if (r == rank_) continue;
    Selection sel = selectTransport(transports_, self, infos[static_cast<std::size_t>(r)]);
    if (sel.index < 0)
      return Status::SystemError(me + " has no transport to rank " + std::to_string(r) + ": " + sel.skipped);
    transportNames_[static_cast<std::size_t>(r)] = sel.transport;
    skipped_[static_cast<std::size_t>(r)] = sel.skipped;
    peersOf[static_cast<std::size_t>(sel.index)].push_back(r);
    BRAID_LOG(kInfo, kInit, "peer %d: %s%s%s", r, sel.transport.c_str(), sel.skipped.empty() ? "" : " (",
              sel.skipped.empty() ? "" : (sel.skipped + ")").c_str());
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
  SetupContext ctx{rank_, nranks_, nonce_, p.storeNonce, config_, infos, *store_, deadline};
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
    for (std::atomic<bool>* f : w.beforeSleep) waiter_->addSleepFlag(f);
    if (!mailbox_) mailbox_ = t->mailbox();
  }
  // Nobody returns before every rank has read the counters: a rank 0 that returned and died at
  // once would take the store, and those reads, with it.
  s = store_->barrier("setup/agreed", nranks_, deadline);
  if (!s.ok()) return s;
  maxChannels_ = config_.nsocks;
  oneHost_ = std::all_of(infos.begin(), infos.end(), [&](const PeerInfo& i) { return i.sameHostAs(infos[0]); });
  layOutHosts(infos);
  const HostShape shape{static_cast<int>(hosts_.size()),
                        uniformHosts_.empty() ? 0 : static_cast<int>(uniformHosts_[0].size()),
                        slowestLink(transports_, infos, /*withinHosts=*/true)};
  tuner_ = Tuner(config_, nranks_, maxChannels_, link_, shape);
  for (auto& t : transports_) t->setupDone();  // everyone has mapped everything: nothing stays in /dev/shm
  store_->startWatching([this](const Notice& n) { onNotice(n); });
  trace_.init(config_.traceBuffer, config_.traceDir, {rank_, nranks_, static_cast<long>(getpid()), self.host, commTag_});
  std::string counts;
  for (std::size_t i = 0; i < transports_.size(); ++i)
    counts += std::to_string(peersOf[i].size()) + " " + std::string(transports_[i]->name()) + " peers, ";
  BRAID_LOG(kInfo, kInit, "rank %d of %d ready: %s%d local ranks on %d cpus%s, reduce isa %s, cross-memory attach %s",
            rank_, nranks_, counts.c_str(), localRanks, hostCpus, oversubscribed ? " (oversubscribed: spinning less)" : "",
            kernels::isaName(), cmaUsable_ ? "on" : "off");
  return Status::Ok();
}

void Comm::layOutHosts(const std::vector<PeerInfo>& infos) {
  hosts_.clear();
  std::vector<int> hostOf(infos.size(), -1);
  for (std::size_t r = 0; r < infos.size(); ++r) {
    for (std::size_t h = 0; h < hosts_.size() && hostOf[r] < 0; ++h)
      if (infos[static_cast<std::size_t>(hosts_[h][0])].sameHostAs(infos[r])) hostOf[r] = static_cast<int>(h);
    if (hostOf[r] < 0) {
      hostOf[r] = static_cast<int>(hosts_.size());
      hosts_.emplace_back();
    }
    hosts_[static_cast<std::size_t>(hostOf[r])].push_back(static_cast<int>(r));
  }
  ringOrder_.clear();
  for (const auto& h : hosts_) ringOrder_.insert(ringOrder_.end(), h.begin(), h.end());
  ringPos_.assign(infos.size(), 0);
  for (std::size_t p = 0; p < ringOrder_.size(); ++p) ringPos_[static_cast<std::size_t>(ringOrder_[p])] = static_cast<int>(p);
  const bool uniform = std::all_of(hosts_.begin(), hosts_.end(), [&](const auto& h) { return h.size() == hosts_[0].size(); });
  uniformHosts_ = uniform ? hosts_ : std::vector<std::vector<int>>{};
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

Comm::~Comm() {
  // The last handle dropped ends the communicator as destroy does, but without the farewell:
  // asynchronous calls already queued run first (each within BRAID_TIMEOUT), as every rank queued
  // them; failing them here instead would leave the peers waiting in them for the timeout.
  // (Not when the last handle was a Work callback's, dropped on the worker itself.)
  if (!closed_.load() && !failed_.load() && std::this_thread::get_id() != worker_.get_id()) waitForQueuedCalls();
  if (!closed_.exchange(true)) shutdown(failed_.load());
}

std::string Comm::transportOf(int peer) const { return transportNames_[static_cast<std::size_t>(peer)]; }
std::string Comm::skippedTransports(int peer) const { return skipped_[static_cast<std::size_t>(peer)]; }

std::string Comm::remoteHostOf(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= localPeer_.size() || localPeer_[static_cast<std::size_t>(peer)])
    return "";
  return hostNames_[static_cast<std::size_t>(peer)];
}

std::string Comm::peerName(int peer) const {
  const std::string t = peer >= 0 && peer < nranks_ ? transportOf(peer) : "?", h = remoteHostOf(peer);
  return "rank " + std::to_string(peer) + " (" + t + (h.empty() ? "" : ", host " + h) + ")";
}

std::string Comm::rankList(const std::vector<int>& ranks) const {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? ", rank " : "rank ") + std::to_string(ranks[i]);
    const std::string h = remoteHostOf(ranks[i]);
    if (!h.empty() && (i + 1 == ranks.size() || remoteHostOf(ranks[i + 1]) != h)) out += " (host " + h + ")";
  }
  return out;
}

std::byte* Comm::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);  // zero-filled once: pages touched now, reused later
  return scratch_.data();
}

Status Comm::failure() {
  std::lock_guard<std::mutex> g(failMu_);
  return failure_;
}

std::string Comm::lastError() {
  std::lock_guard<std::mutex> g(errMu_);
  return lastError_;
}

void Comm::setLastError(const Status& s) {
  if (s.ok()) return;
  std::lock_guard<std::mutex> g(errMu_);
  lastError_ = s.toString();
}

void Comm::fail(const Status& s, bool tellOthers, bool peerGone) {
  if (s.ok()) return;  // not a failure (and never let one be recorded as "ok")
  {
    std::lock_guard<std::mutex> g(failMu_);
    if (!failure_.ok()) return;  // the first failure is the root cause
    failure_ = s;
    failureIsPeerGone_ = peerGone;
    failed_.store(true);
  }
  if (waiter_) waiter_->wake();
  if (!tellOthers || !store_) return;
  // The others see this text as their own failure: it must say which rank it happened on.
  const std::string who = "rank " + std::to_string(rank_), &m = s.message();
  const bool named = m.rfind(who + " ", 0) == 0 || m.rfind(who + ":", 0) == 0;
  store_->report({Notice::kError, rank_, s.code(), named ? m : who + ": " + m});
}

void Comm::onNotice(const Notice& n) {
  if (n.kind == Notice::kTimedOut) {
    std::lock_guard<std::mutex> g(timeoutMu_);
    timedOut_[n.rank] = n.message;
    timeoutCv_.notify_all();
    return;
  }
  if (n.kind == Notice::kPeerGone) {
    fail(Status::RemoteError(peerName(n.rank) + " exited or closed its connection"), false, true);
  } else if (n.rank < 0) {
    // The store's connection broke: its host process is gone. If that was a rank of this host, name it.
    fail(Status(n.code, deadLocalRanks() + n.message), false);
  } else {
    fail(Status(n.code, n.message), false);
  }
}

// "rank 0 (shm) exited; " for the ranks of this host whose process is gone (or a zombie), else "".
// A process closes its sockets just before it becomes a zombie, so this looks again for up to 100 ms.
std::string Comm::deadLocalRanks() const {
  auto gone = [](int pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (pid <= 0 || !std::getline(stat, text)) return pid > 0;
    std::size_t paren = text.rfind(')');
    return paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
  };
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::string dead;
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_ && localPeer_[static_cast<std::size_t>(r)] && gone(pids_[static_cast<std::size_t>(r)]))
        dead += "rank " + std::to_string(r) + " (" + transportOf(r) + ") exited; ";
    if (!dead.empty()) return dead;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "";
}

namespace {
// "300 s", "0.1 s"
std::string secondsText(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g s", s);
  return b;
}
}  // namespace

// Every rank that gives up waiting says so through the store. A rank that is stopped, hung, or busy
// outside Braid says nothing: after a short grace, the ranks missing from the chorus are named.
Status Comm::explainTimeout(const std::string& what, const std::string& detail, bool moving) {
  // The notice carries the call ("allgather(count=4, float32) #3") on its first line, so that ranks
  // stuck in different calls (a mismatch in which nobody reads the other's header) are named.
  if (store_) store_->report({Notice::kTimedOut, rank_, Code::kTimeout, what + "\n" + detail});
  std::vector<int> silent;
  int other = -1;
  std::string otherWhat;
  {
    std::unique_lock<std::mutex> g(timeoutMu_);
    const double grace = std::min(2.0, std::max(0.2, config_.timeoutSec / 10));
    timeoutCv_.wait_for(g, std::chrono::duration<double>(grace),
                        [&] { return static_cast<int>(timedOut_.size()) >= nranks_ - 1; });
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_) continue;
      auto it = timedOut_.find(r);
      if (it == timedOut_.end()) { silent.push_back(r); continue; }
      std::string theirs = it->second.substr(0, it->second.find('\n'));
      if (other < 0 && theirs != what) { other = r; otherWhat = theirs; }
    }
  }
  // Everyone waits, nobody is silent, and not all in the same call: the ranks called different
  // collectives. (With a silent rank, others may legitimately be one call apart: name the silent one.)
  if (other >= 0 && silent.empty()) {  // "desc #seq" -> "desc as #seq", as the header check words it
    auto as = [](const std::string& w) { std::size_t h = w.rfind(" #"); return h == std::string::npos ? w : w.substr(0, h) + " as" + w.substr(h); };
    return Status::InvalidUsage(what + " timed out after " + secondsText(config_.timeoutSec) + ": " + mismatchText(rank_, as(what), other, as(otherWhat)));
  }
  if (moving)
    return Status::Timeout(what + " did not finish within " + secondsText(config_.timeoutSec) +
                           ", the time BRAID_TIMEOUT gives a whole call, though its data was still moving (" + detail +
                           "): no rank is silent; the call is slower than the limit allows: raise BRAID_TIMEOUT, or "
                           "look for a slow link (braid doctor)");
  const std::string who = rankList(silent);
  std::string msg = what + " timed out after " + secondsText(config_.timeoutSec) + ": ";
  if (!silent.empty() && silent.size() < static_cast<std::size_t>(nranks_ - 1))
    msg += who + (silent.size() == 1 ? " is" : " are") + " silent (stopped, hung, or busy outside Braid) while the " +
           "other ranks wait; ";
  msg += detail + ". BRAID_TIMEOUT bounds this wait: raise it if the silent rank is only slow, lower it to notice a " +
         "lost rank or host sooner";
  return Status::Timeout(msg);
}

Status Comm::validate(const CollArgs& a) const {
  if (closed_) return Status::InvalidUsage("the communicator was destroyed or aborted");
  if (!isValid(a.dtype)) return Status::InvalidArgument("unknown data type " + std::to_string(static_cast<int>(a.dtype)));
  bool reduces = a.kind == CollKind::kAllReduce || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kReduce;
  if (reduces && !isValid(a.op)) return Status::InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(a.op)));
  if ((a.kind == CollKind::kBroadcast || a.kind == CollKind::kReduce) && (a.root < 0 || a.root >= nranks_))
    return Status::InvalidArgument("root " + std::to_string(a.root) + " is outside 0.." + std::to_string(nranks_ - 1));
  if (a.kind == CollKind::kSendRecv) {
    if (a.peer < 0 || a.peer >= nranks_)
      return Status::InvalidArgument("peer " + std::to_string(a.peer) + " is outside 0.." + std::to_string(nranks_ - 1));
    if (a.peer == rank_) return Status::InvalidArgument("send/recv to itself (rank " + std::to_string(rank_) + ") is not supported");
  }
  const std::size_t es = dataTypeSize(a.dtype);
  if (a.kind == CollKind::kAllToAllv) return validateAllToAllv(a);
  std::size_t elems = a.count;
  if (a.kind == CollKind::kAllGather || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kAllToAll) {
    if (a.count > ~std::size_t{0} / static_cast<std::size_t>(nranks_))
      return Status::InvalidArgument("count " + std::to_string(a.count) + " times " + std::to_string(nranks_) + " ranks overflows");
    elems = a.count * static_cast<std::size_t>(nranks_);
  }
  if (elems > ~std::size_t{0} / es) return Status::InvalidArgument("count " + std::to_string(a.count) + " overflows the buffer size");
  if (a.count > 0 && a.kind != CollKind::kBarrier) {
    bool needSend = a.kind != CollKind::kSendRecv || a.isSend;
    bool needRecv = a.kind == CollKind::kSendRecv ? !a.isSend : (a.kind != CollKind::kReduce || a.root == rank_);
    if (a.kind == CollKind::kBroadcast) needSend = a.root == rank_;
    if (needSend && !a.send) return Status::InvalidArgument("send buffer is NULL with count " + std::to_string(a.count));
    if (needRecv && !a.recv) return Status::InvalidArgument("receive buffer is NULL with count " + std::to_string(a.count));
    if (needSend && needRecv && a.kind != CollKind::kSendRecv) return checkOverlap(a, es);
  }
  return Status::Ok();
}

// Send and receive buffers either do not overlap or are laid out exactly in place; anything in
// between would read what the call already wrote (NCCL leaves it undefined), so it is refused
// before anything is sent.
Status Comm::checkOverlap(const CollArgs& a, std::size_t es) const {
  const std::size_t n = static_cast<std::size_t>(nranks_), me = static_cast<std::size_t>(rank_);
  std::size_t sendBytes = a.count * es, recvBytes = a.count * es;
  const auto* send = static_cast<const std::byte*>(a.send);
  const auto* recv = static_cast<const std::byte*>(a.recv);
  const std::byte* inPlace = recv;  // where send must start for the in-place form
  std::string form = "recvbuff == sendbuff";
  if (a.kind == CollKind::kAllGather) {
    recvBytes *= n;
    inPlace = recv + me * sendBytes;
    form = "sendbuff == recvbuff + rank * sendcount elements";
  } else if (a.kind == CollKind::kReduceScatter) {
    sendBytes *= n;
    inPlace = recv - me * recvBytes;
    form = "recvbuff == sendbuff + rank * recvcount elements";
  } else if (a.kind == CollKind::kAllToAll) {
    sendBytes *= n;
    recvBytes *= n;
  }
  const auto lo = [](const std::byte* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool overlap = lo(send) < lo(recv) + recvBytes && lo(recv) < lo(send) + sendBytes;
  if (!overlap || send == inPlace) return Status::Ok();
  char text[160];
  std::snprintf(text, sizeof(text), "send buffer %p (%zu bytes) and receive buffer %p (%zu bytes)", a.send, sendBytes,
                a.recv, recvBytes);
  return Status::InvalidArgument(std::string(collName(a.kind)) + ": the " + text +
                                 " overlap without being in place: only the exact in-place layout (" + form +
                                 ") is defined; nothing was sent");
}

// The four arrays have nranks entries each; the counts and the buffer extents they imply fit in
// size_t; a rank sends itself what it receives from itself; buffers are there where counts are.
Status Comm::validateAllToAllv(const CollArgs& a) const {
  const std::size_t n = static_cast<std::size_t>(nranks_), me = static_cast<std::size_t>(rank_);
  if (!a.v) return Status::InvalidArgument("alltoallv: the counts and displacements are NULL");
  const AllToAllvCounts& v = *a.v;
  if (v.sendCounts.size() != n || v.sendDispls.size() != n || v.recvCounts.size() != n || v.recvDispls.size() != n)
    return Status::InvalidArgument("alltoallv: sendcounts, sdispls, recvcounts and rdispls need " + std::to_string(n) +
                                   " entries each (one per rank)");
  const std::size_t es = dataTypeSize(a.dtype), limit = ~std::size_t{0} / es;
  bool sends = false, recvs = false;
  for (std::size_t p = 0; p < n; ++p) {
    for (auto [count, displ, what] : {std::tuple{v.sendCounts[p], v.sendDispls[p], "send"},
                                      std::tuple{v.recvCounts[p], v.recvDispls[p], "recv"}})
      if (count > limit || displ > limit - count)
        return Status::InvalidArgument(std::string("alltoallv: ") + what + "counts[" + std::to_string(p) + "] = " +
                                       std::to_string(count) + " at displacement " + std::to_string(displ) +
                                       " overflows the buffer size");
    sends = sends || v.sendCounts[p] > 0;
    recvs = recvs || v.recvCounts[p] > 0;
  }
  if (v.sendCounts[me] != v.recvCounts[me])
    return Status::InvalidArgument("alltoallv: rank " + std::to_string(me) + " sends itself " + std::to_string(v.sendCounts[me]) +
                                   " elements (sendcounts[" + std::to_string(me) + "]) but receives " +
                                   std::to_string(v.recvCounts[me]) + " from itself (recvcounts[" + std::to_string(me) +
                                   "]): they must be equal");
  if (sends && !a.send) return Status::InvalidArgument("alltoallv: send buffer is NULL with nonzero sendcounts");
  if (recvs && !a.recv) return Status::InvalidArgument("alltoallv: receive buffer is NULL with nonzero recvcounts");
  std::size_t sendEnd = 0, recvEnd = 0;  // in elements
  for (std::size_t p = 0; p < n; ++p) {
    if (v.sendCounts[p]) sendEnd = std::max(sendEnd, v.sendDispls[p] + v.sendCounts[p]);
    if (v.recvCounts[p]) recvEnd = std::max(recvEnd, v.recvDispls[p] + v.recvCounts[p]);
  }
  const auto s = reinterpret_cast<std::uintptr_t>(a.send), r = reinterpret_cast<std::uintptr_t>(a.recv);
  if (sendEnd && recvEnd && a.send != a.recv && s < r + recvEnd * es && r < s + sendEnd * es)
    return Status::InvalidArgument("alltoallv: the send buffer (" + std::to_string(sendEnd * es) + " bytes) and the receive "
                                   "buffer (" + std::to_string(recvEnd * es) + " bytes) overlap without being the same "
                                   "buffer: only recvbuff == sendbuff is defined; nothing was sent");
  return Status::Ok();
}

Status Comm::execute(const CollArgs& a, const DeviceCall* dev) {
  try {
    return executeCall(a, dev);
  } catch (const std::bad_alloc&) {
    // Scratch or a plan could not grow. Other ranks may already wait for this call: end the
    // communicator and tell them, rather than letting them time out.
    Status s = Status::SystemError("rank " + std::to_string(rank_) + " ran out of memory in " + collName(a.kind) +
                                   " of " + std::to_string(a.count) + " elements (scratch for it could not be allocated)");
    if (!failed_) fail(s, true);
    return s;
  }
}

Fingerprint Comm::numberCall(const CollArgs& a) {
  Fingerprint fp;
  fp.kind = a.kind;
  fp.dtype = a.dtype;
  fp.count = a.count;
  if (a.kind == CollKind::kAllReduce || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kReduce) fp.op = a.op;
  if (a.kind == CollKind::kBroadcast || a.kind == CollKind::kReduce) fp.root = a.root;
  if (a.kind == CollKind::kSendRecv) {
    fp.root = a.isSend ? a.peer : rank_;
    fp.sender = a.isSend ? rank_ : a.peer;
    fp.tag = a.tag;
    fp.seq = ++(a.isSend ? sendSeq_ : recvSeq_)[a.peer];
  } else {
    fp.seq = ++collSeq_;
  }
  return fp;
}

Status Comm::executeCall(const CollArgs& in, const DeviceCall* dev) {
  CollArgs a = in;
  const Fingerprint fp = numberCall(a);
  // After the failure every call names itself and its number: the error says which call found out.
  if (failed_) return failure().withContext(fp.describe() + " #" + std::to_string(fp.seq) + " on a failed communicator");
  trace_.begin(fp);
  if (a.kind != CollKind::kSendRecv) {
    history_[fp.seq % kHistory] = fp;
    if (fp.seq % kHistory == 0) {  // now and then: a mismatch that no plan of this rank has read yet
      Status left = checkLeftovers(fp.seq - 1);
      if (!left.ok()) {
        fail(left, true);
        return failure().withContext(failedOn(fp, rank_));
      }
    }
  }
  const std::size_t es = dataTypeSize(a.dtype);
  const std::size_t total = callBytes(a, nranks_);

  if (nranks_ == 1) {  // no peers: a local copy (avg divides by 1)
    if (a.kind == CollKind::kAllToAllv) {
      const std::size_t bytes = a.v->sendCounts[0] * es;
      if (bytes) std::memmove(static_cast<std::byte*>(a.recv) + a.v->recvDispls[0] * es,
                              static_cast<const std::byte*>(a.send) + a.v->sendDispls[0] * es, bytes);
      return Status::Ok();
    }
    const std::size_t bytes = a.count * es;  // one rank: every collective's output is its input
    if (a.kind != CollKind::kBarrier && a.send != a.recv && bytes && a.recv) std::memmove(a.recv, a.send, bytes);
    return Status::Ok();
  }
  if (dev) return executeDevice(a, *dev, fp, total);
  return executeHost(a, fp, total, true);
}

// `a` and `total` serve the IPC path only; a build without CUDA stages every device call.
Status Comm::executeDevice([[maybe_unused]] const CollArgs& a, const DeviceCall& d, const Fingerprint& fp,
                           [[maybe_unused]] std::size_t total) {
#if BRAID_HAVE_CUDA
  const bool p2p = a.kind == CollKind::kSendRecv;
  if (p2p ? cudaIpcOffers(total) : cudaIpcApplies(a.kind) && total > 0) {
    auto done = p2p ? cudaIpcSendRecv(a, fp, d.stream) : cudaIpcCollective(a, fp, d.stream);
    if (!done.ok()) {
      if (!failed_) fail(done.status().withContext("CUDA IPC (BRAID_CUDA_IPC=0 turns it off)"), true);
      return failure().withContext(failedOn(fp, rank_));
    }
    if (*done) {
      ++cudaIpcCalls_;
      return Status::Ok();
    }
  }
#endif
  // Staged through pinned host memory: the proxy copies pieces in and out around the host
  // algorithms, which run here, piece by piece, under this call's fingerprint and sequence number.
  // The staging memory is normally braidMemAlloc memory (cuda_proxy.cc), so an all-reduce's pieces
  // may take the zero-copy path; cross-memory attach is skipped (staging memory that came from
  // cudaHostAlloc instead is the driver's mapping, which process_vm_readv may refuse).
  return d.staged([&](const CollArgs& piece) { return executeHost(piece, fp, callBytes(piece, nranks_), false); });
}

Status Comm::executeHost(const CollArgs& in, const Fingerprint& fp, std::size_t total, bool userMemory) {
  CollArgs a = in;
  if (a.kind == CollKind::kBroadcast && a.root != rank_) a.send = a.recv;  // only the root's send buffer counts
  if (a.kind == CollKind::kAllReduce && (userMemory || stagedZeroCopy_) && config_.zeroCopy && link_.sharedMemory &&
      total >= kZeroCopyMinBytes) {
    auto done = tryZeroCopyAllReduce(a, fp, !userMemory);
    if (!done.ok()) {
      if (!failed_) fail(done.status().withContext("zero-copy all-reduce (BRAID_ZERO_COPY=0 turns it off)"), true);
      return failure().withContext(failedOn(fp, rank_));
    }
    if (*done) {
      ++zeroCopyCalls_;
      BRAID_LOG(kInfo, kTune, "%s #%llu: zero-copy (every rank's buffers are braidMemAlloc memory%s)",
                fp.describe().c_str(), static_cast<unsigned long long>(fp.seq), userMemory ? "" : ": the CUDA proxy's staging");
      return Status::Ok();
    }
  }
  if (userMemory && cmaFits(a, total)) return cmaCollective(a, fp);
  const TunerChoice& t = tuner_.choose(a.kind, total);
  const bool viaMailbox = (a.kind == CollKind::kAllReduce || a.kind == CollKind::kBarrier) && mailboxFits(t, total);
  BRAID_LOG(kInfo, kTune, "%s #%llu: %s%s, %d channel(s), chunk %zu (model: ring %.1f us, tree %.1f us, oneshot %.1f us, "
            "hier %.1f us)", fp.describe().c_str(), static_cast<unsigned long long>(fp.seq), algoName(t.algo),
            viaMailbox ? " (shm mailbox)" : "", t.channels, t.chunk, t.ringUs, t.treeUs, t.oneShotUs, t.hierUs);
  if (viaMailbox) return mailboxAllReduce(a, fp);
  plan_.reset(fp, commTag_, rank_, nranks_, t.chunk);
  switch (a.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBarrier:
      if (t.algo == Algo::kOneShot) {
        buildOneShotAllReduce(a, *this, plan_);
        Status s = runPlan();
        if (s.ok()) finishOneShotAllReduce(a, *this);
        return s;
      }
      if (t.algo == Algo::kTree) buildTreeAllReduce(a, *this, t.channels, plan_);
      else if (t.algo == Algo::kHier && hierApplies(*this)) buildHierAllReduce(a, *this, t.channels, plan_);
      else buildRingAllReduce(a, *this, t.channels, plan_);
      break;
    case CollKind::kAllGather:
      if (t.algo == Algo::kHier && hierApplies(*this)) buildHierAllGather(a, *this, t.channels, plan_);
      else buildRingAllGather(a, *this, t.channels, plan_);
      break;
    case CollKind::kReduceScatter: buildRingReduceScatter(a, *this, t.channels, plan_); break;
    case CollKind::kBroadcast:
    case CollKind::kReduce: buildRooted(a, *this, t.algo, t.channels, plan_); break;
    case CollKind::kSendRecv: buildSendRecv(a, plan_); break;
    case CollKind::kAllToAll:
    case CollKind::kAllToAllv: {
      // Both ends of a pair must cut a block alike, from what they share: the block's size and
      // the channels a large call gets (not this rank's total, which differs by rank in alltoallv).
      // (This re-tunes: `t` refers to the tuner's last answer, and is not used past here.)
      const int channels = tuner_.choose(CollKind::kAllToAll, std::size_t{1} << 30).channels;
      buildAllToAll(a, *this, channels, plan_);
      break;
    }
  }
  return runPlan();
}

Status Comm::runPlan() {
  Status s = Engine::run(plan_, *this);
  trace_.tally(plan_);
  if (!s.ok()) fail(s, !failed_.load());  // a failure that came as a notice is not reported back
  return s;
}

Status Comm::runDevice(const CollArgs& dev, const DeviceCall& d) { return runInOrder(dev, &d); }

Status Comm::runBlocking(const CollArgs& a) {
  Caller caller(*this, a);
  return caller.status().ok() ? caller.finish(runInOrder(a, nullptr)) : caller.status();
}

Status Comm::runGroup(const std::vector<CollArgs>& calls) {
  Caller caller(*this, calls.empty() ? CollArgs{} : calls.front());
  if (!caller.status().ok()) return caller.status();
  waitForQueuedCalls();
  std::lock_guard<std::mutex> g(execMu_);
  if (closed_) return Status::Aborted("the communicator was aborted");
  return caller.finish(executeGroup(calls));
}

Status Comm::executeGroup(const std::vector<CollArgs>& calls) {
  std::vector<const CollArgs*> p2p;
  for (const CollArgs& a : calls)
    if (a.kind == CollKind::kSendRecv) p2p.push_back(&a);
  if (!p2p.empty()) {
    Status s;
    try {
      s = executeSendRecvs(p2p);
    } catch (const std::bad_alloc&) {
      s = Status::SystemError("rank " + std::to_string(rank_) + " ran out of memory for a group of " +
                              std::to_string(p2p.size()) + " sends and receives");
      if (!failed_) fail(s, true);
    }
    trace_.end(s);
    if (!s.ok()) return s;
  }
  for (const CollArgs& a : calls) {
    if (a.kind == CollKind::kSendRecv) continue;
    Status s = execute(a);
    trace_.end(s);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// One plan for all of them: the engine moves every peer's send and receive queues together, so
// the group finishes whatever order each rank posted its calls in. Each message is numbered and
// checked as the call would be alone, so a peer may match a grouped send with a plain recv.
Status Comm::executeSendRecvs(const std::vector<const CollArgs*>& calls) {
  std::vector<Fingerprint> fps;
  std::size_t largest = 0;
  for (const CollArgs* a : calls) {
    fps.push_back(numberCall(*a));
    largest = std::max(largest, a->count * dataTypeSize(a->dtype));
  }
  if (failed_)
    return failure().withContext("a group of " + std::to_string(calls.size()) + " sends and receives (the first " +
                                 fps[0].describe() + " #" + std::to_string(fps[0].seq) + ") on a failed communicator");
  trace_.begin(fps[0]);  // one entry for the group, under its first call
  const TunerChoice& t = tuner_.choose(CollKind::kSendRecv, largest);
  plan_.reset(fps[0], commTag_, rank_, nranks_, t.chunk);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CollArgs& a = *calls[i];
    const std::size_t bytes = a.count * dataTypeSize(a.dtype);
    plan_.setFingerprint(a.isSend ? plan_.send(a.peer, 0, a.send, bytes) : plan_.recvCopy(a.peer, 0, a.recv, bytes), fps[i]);
  }
  return runPlan();
}

Status Comm::runInOrder(const CollArgs& a, const DeviceCall* dev) {
  waitForQueuedCalls();
  Status s;
  {
    std::lock_guard<std::mutex> g(execMu_);
    s = closed_ ? Status::Aborted("the communicator was aborted") : execute(a, dev);
    trace_.end(s);
  }
  return s;
}

void Comm::abort() {
  if (closed_.load()) return;
  fail(Status::Aborted("rank " + std::to_string(rank_) + " aborted the communicator"), true);
  if (closed_.exchange(true)) return;
  shutdown(true);
  std::lock_guard<std::mutex> g(execMu_);
  trace_.failed(failure());  // no call was running: the flight recorder is written here
  releaseClosed();
}

void Comm::releaseClosed() {
  trace_.release();
  std::vector<Fingerprint>().swap(history_);
}

Status Comm::destroy() {
  if (closed_.load()) return Status::Ok();
  stopCudaProxy(false);  // calls queued on CUDA streams finish first
  Status left;
  if (!failed_ && !closed_) {
    waitForQueuedCalls();  // the calls queued before destroy run first, in order
    std::lock_guard<std::mutex> g(execMu_);
    left = checkLeftovers(collSeq_);
    if (left.ok()) left = farewell();
    if (!left.ok() && !failed_) fail(left, true);
  }
  if (closed_.exchange(true)) return Status::Ok();
  shutdown(false);
  {
    std::lock_guard<std::mutex> g(execMu_);
    releaseClosed();
  }
  return left.ok() ? left : left.withContext("destroy on rank " + std::to_string(rank_));
}

// A message that is still unread although its call is over here (its sequence number is one this
// rank has finished) belongs to a call the sender made differently: no plan of this rank read that
// channel, so the header check never saw it (e.g. two ranks that disagree on a reduce's root and
// both only send). Every correct plan reads every message sent to it within its call.
namespace {
// A peer's collective message for a call this rank has already finished (its sequence number is at
// most `finished`): the call never read it. Send/recv messages have sequence numbers of their own.
bool ofFinishedCall(const Fingerprint& theirs, std::uint64_t finished) {
  return theirs.kind != CollKind::kSendRecv && theirs.seq > 0 && theirs.seq <= finished;
}
}  // namespace

Status Comm::checkLeftovers(std::uint64_t finished) {
  return forEachWaitingHeader([&](int p, const WireHeader& h) {
    if (isFarewell(h)) return Status::Ok();  // the peer is in destroy: farewell() reads it
    Fingerprint theirs = fingerprintOf(h);
    return ofFinishedCall(theirs, finished) ? unreadMessageError(p, theirs) : Status::Ok();
  });
}

Status Comm::forEachWaitingHeader(const std::function<Status(int, const WireHeader&)>& f) {
  for (int p = 0; p < nranks_; ++p) {
    Connection* c = p == rank_ ? nullptr : conns_[static_cast<std::size_t>(p)].get();
    for (int ch = 0; c && ch < c->numChannels(); ++ch) {
      auto view = c->channel(ch).peek();
      if (!view.ok() || view->size() < sizeof(WireHeader)) continue;
      WireHeader h;
      std::memcpy(&h, view->data(), sizeof(h));
      if (h.magic != kWireMagic || h.commTag != commTag_) continue;
      Status s = f(p, h);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

// Peer p's message of call theirs.seq, which this rank finished without reading it.
Status Comm::unreadMessageError(int p, const Fingerprint& theirs) const {
  const Fingerprint& mine = history_[theirs.seq % kHistory];
  const std::string when = " (rank " + std::to_string(p) + "'s message for it was never read by rank " +
                           std::to_string(rank_) + ")";
  if (mine.seq != theirs.seq)  // too long ago to name this rank's own call
    return Status::InvalidUsage("rank " + std::to_string(p) + " called " + callAs(theirs) + ", but rank " +
                                std::to_string(rank_) + "'s call #" + std::to_string(theirs.seq) +
                                " never read it: every rank must issue the same collectives in the same order");
  return Status::InvalidUsage(mismatchText(rank_, callAs(mine), p, callAs(theirs)) + when);
}

// Destroy's farewell: every rank sends each peer, on channel 0 after all its messages, a header
// carrying its last collective (kFarewellStep, no payload), then reads each peer's channel 0 up to
// that peer's farewell. So a rank whose calls all went through learns of a mismatch that another
// rank found (that rank reports it to the store instead of saying farewell), a peer that made a
// different number of calls or a different last call is named with both calls, and a message
// still waiting before a farewell is a call this rank never read. A peer that left without destroy
// (its connection closed, or the store announced it gone) counts as said farewell: nothing is
// wrong with this rank's calls. Bounded by BRAID_TIMEOUT; a peer that stays silent that long is
// only logged.
Status Comm::farewell() {
  if (nranks_ < 2) return Status::Ok();
  const Fingerprint mine = collSeq_ ? history_[collSeq_ % kHistory] : Fingerprint{};
  const WireHeader bye = makeHeader(mine, commTag_, rank_, 0, kFarewellStep);
  const std::string myLast = lastCallAs(mine);
  const Deadline deadline = Deadline::after(config_.timeoutSec);
  std::vector<std::size_t> sent(static_cast<std::size_t>(nranks_), 0);
  std::vector<bool> done(static_cast<std::size_t>(nranks_), false);
  done[static_cast<std::size_t>(rank_)] = true;
  int left = nranks_ - 1;
  auto unsent = [&] {
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_ && sent[static_cast<std::size_t>(p)] < sizeof(bye)) return true;
    return false;
  };
  waiter_->progressed();
  while (left > 0 || unsent()) {  // a peer may still wait for this rank's farewell
    bool moved = false;
    for (int p = 0; p < nranks_; ++p) {
      const auto pi = static_cast<std::size_t>(p);
      if (p == rank_) continue;
      Channel& ch = conns_[pi]->channel(0);
      if (sent[pi] < sizeof(bye)) {
        auto k = ch.trySend(reinterpret_cast<const std::byte*>(&bye) + sent[pi], sizeof(bye) - sent[pi]);
        if (k.ok()) sent[pi] += *k, moved |= *k > 0;
        else sent[pi] = sizeof(bye);  // the peer is gone: nothing to tell it
      }
      if (done[pi]) continue;
      auto view = ch.peek();
      if (!view.ok()) {
        // Closed without a farewell: the peer left, or it failed (a mismatch it found in its own
        // destroy) and is reporting that now. Give the store's notice a moment, as the engine does.
        waitForNotice(*this);
        if (failedFast()) break;
        done[pi] = true, --left, moved = true;
        continue;
      }
      if (view->size() < sizeof(WireHeader)) continue;
      WireHeader h;
      std::memcpy(&h, view->data(), sizeof(h));
      if (h.magic != kWireMagic || h.commTag != commTag_)
        return Status::Internal("corrupt or foreign message from rank " + std::to_string(p) + " at destroy");
      const Fingerprint theirs = fingerprintOf(h);
      if (!isFarewell(h)) {  // a message before the farewell
        if (ofFinishedCall(theirs, collSeq_)) return unreadMessageError(p, theirs);
        return Status::InvalidUsage(mismatchText(rank_, myLast, p, callAs(theirs)) + " (rank " +
                                    std::to_string(rank_) + " has called destroy)");
      }
      if (theirs.seq != collSeq_ || (collSeq_ && !theirs.sameCall(mine)))
        return Status::InvalidUsage(mismatchText(rank_, myLast, p, lastCallAs(theirs)) + " (the last calls before destroy)");
      ch.consume(sizeof(WireHeader));
      done[pi] = true, --left, moved = true;
    }
    if (failedFast()) {
      std::lock_guard<std::mutex> g(failMu_);
      return failureIsPeerGone_ ? Status::Ok() : failure_;
    }
    if (moved) {
      waiter_->progressed();
      continue;
    }
    waiter_->idle();
    if (deadline.expired()) {
      BRAID_LOG(kWarn, kInit, "destroy on rank %d: %d rank(s) did not call destroy within BRAID_TIMEOUT", rank_, left);
      return Status::Ok();
    }
  }
  return Status::Ok();
}

void Comm::shutdown(bool abortive) {
  closed_ = true;
  stopCudaProxy(true);  // releases the streams of calls that never ran
  {
    std::lock_guard<std::mutex> g(qMu_);
    stopWorker_ = true;
    workerAlarm_.wakeNow();
  }
  if (abortive) {
    // Queued work that never started fails now; the running call sees the failure within a slice.
    std::lock_guard<std::mutex> g(qMu_);
    for (auto& item : queue_) item.work->finish(Status::Aborted("the communicator was aborted before this call ran"));
    asyncPending_.fetch_sub(static_cast<int>(queue_.size()), std::memory_order_release);
    queue_.clear();
    if (!workerBusy_) drainedCv_.notify_all();
  }
  std::thread worker;
  {
    std::lock_guard<std::mutex> g(qMu_);
    worker = std::move(worker_);
  }
  if (worker.joinable()) worker.join();
  workerAlarm_.close();
  std::lock_guard<std::mutex> g(execMu_);  // waits for a blocking call on another thread to leave
  if (store_) store_->close();               // also joins the watcher: nothing else touches us now
  if (storeServer_) storeServer_->waitUntilAllLeft(Deadline::after(abortive ? 0 : config_.timeoutSec));
  if (!abortive) StoreServer::waitForDetached(storeNonce_, Deadline::after(config_.timeoutSec));
  // Release everything now: the C handle outlives this (later calls get invalid usage), so the
  // sockets, mappings and buffers must not wait for the object to be freed.
  conns_.clear();
  waiter_.reset();  // before the transports: it may point at a doorbell in shared memory
  mailbox_ = nullptr;
  for (auto& t : transports_) t->setupDone();
  transports_.clear();
  store_.reset();
  storeServer_.reset();
  std::vector<std::byte>().swap(scratch_);
  peerMemory_.clear();
  plan_ = Plan();
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kRing: return "ring";
    case Algo::kTree: return "tree";
    case Algo::kOneShot: return "oneshot";
    case Algo::kHier: return "hier";
  }
  return "?";
}

}  // namespace braid
