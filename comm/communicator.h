// The communicator: a fixed group of ranks, their connections, and the state that every call shares
// (sequence numbers, failure, scratch). Blocking calls run on the calling thread; asynchronous ones
// (braid::Work) run in call order on one worker thread that starts on first use. Either way only one
// collective runs at a time on a communicator, as NCCL requires of one stream.
#pragma once
#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/alarm.h"
#include "comm/bootstrap/init.h"
#include "base/config.h"
#include "base/socket.h"
#include "comm/algorithms/cma.h"
#include "comm/engine.h"
#include "comm/live.h"
#include "comm/memory.h"
#include "comm/bootstrap/store.h"
#include "comm/tuner.h"
#include "comm/trace.h"
#include "comm/waiter.h"
#include "topology/topology.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace braid {

class CudaProxy;
struct CudaIpc;
struct MailboxSlot;



// Shared state of one asynchronous operation.
struct WorkState {
  // The communicator whose queue holds it: wait() runs it on the waiting thread when it has not
  // started yet (Comm::runQueuedThrough).
  std::weak_ptr<Comm> owner;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::vector<std::function<void(const Status&)>> onDone;  // whenDone's, until finish
  void finish(Status s);
  // A work that is done already, with `s` (a call refused before it was queued).
  static std::shared_ptr<WorkState> finished(Status s) {
    auto w = std::make_shared<WorkState>();
    w->finish(std::move(s));
    return w;
  }
  // Calls f(status) once the work is done: at once, on this thread, if it is; else on the thread
  // that finishes it (the communicator's worker, or the CUDA proxy), after waiters are woken.
  void whenDone(std::function<void(const Status&)> f);
};

// BRAID_CONNECT=auto connects every pair at set-up up to this many ranks, and beyond only the
// ranks of each host and the peers the algorithms need (comm/connect.cc).
inline constexpr int kConnectAllUpTo = 8;
// Whether BRAID_CONNECT makes a communicator of `nranks` connect every pair at creation (the
// tuner's one-shot needs every pair; Comm::setup counts a communicator on one host as such too).
inline bool connectsEveryPair(const Config& c, int nranks) {
  return c.connect == "all" || (c.connect == "auto" && nranks <= kConnectAllUpTo);
}

class Comm final : public EngineHost, public Workspace {
 public:
  static Result<std::shared_ptr<Comm>> create(InitParams params);
  ~Comm() override;

  // Checks the arguments (invalid argument, nothing sent, communicator still usable).
  Status validate(const CollArgs& a) const;
  // Runs one call to completion on this thread. `a` has passed validate() (cuda::run does that).
  Status runBlocking(const CollArgs& a);
  // Requests the rendezvous store has served so far, when it runs in this process (the rank that
  // hosts it, or the one that made the unique id); else -1. storeBytes: the bytes of those
  // requests and of the store's answers and notices.
  std::int64_t storeRequests() const;
  std::int64_t storeBytes() const;
  // Claims the communicator for the calling thread for one call (runBlocking, runGroup, submit and
  // submitGroup do). A second thread that calls while another is inside a call is refused with
  // invalid usage naming both calls, and the communicator ends on every rank: the two threads' calls
  // may already pair differently with other ranks' (comm/caller.cc). A thread may re-enter (a Work
  // callback run by its wait), and Braid's own threads are exempt.
  class Caller {
   public:
    Caller(Comm& comm, const CollArgs& a);
    ~Caller();
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;
    const Status& status() const { return refused_; }
    // The call's result: its own, unless another thread was refused while it ran (the call may
    // have met another rank's call of the other thread: its data cannot be trusted).
    Status finish(Status s) const;

   private:
    Comm& comm_;
    bool claimed_ = false;
    int overlapsBefore_ = 0;
    Status refused_;
  };
  // Marks the calling thread as Braid's own (the worker, the CUDA proxy): never refused as a caller.
  static void markInternalThread();
  // A group's calls on this communicator (braidGroupStart/End), validated already, on host memory:
  // its sends and receives as one plan (no order of posting them deadlocks), then its collectives
  // in call order.
  Status runGroup(const std::vector<CollArgs>& calls);
  // One call on CUDA device buffers, run by the CUDA proxy (comm/cuda/cuda_proxy.cc) on its thread, as
  // the user made it (`dev`). A collective other than send/recv whose ranks all sit on one host
  // reads the ranks' device buffers directly (comm/cuda/cuda_ipc.cc) on the proxy's `stream` (the
  // caller's stream is held meanwhile). Otherwise the call is staged: `staged` copies the buffers
  // through pinned host memory in pieces and calls runHost for each piece (the same collective on
  // part of the data, in pinned memory), which runs the host algorithms under the call's
  // fingerprint and sequence number.
  struct DeviceCall {
    using RunHost = std::function<Status(const CollArgs& piece)>;
    std::function<Status(const RunHost& runHost)> staged;
    void* stream = nullptr;
  };
  Status runDevice(const CollArgs& dev, const DeviceCall& d);
  // Queues one call for the worker thread. `a` has passed validate() (cuda::submit does that).
  std::shared_ptr<WorkState> submit(const CollArgs& a);
  // Queues a group (as runGroup runs it) for the worker thread: one Work for all of its calls.
  std::shared_ptr<WorkState> submitGroup(std::vector<CollArgs> calls);
  // Runs `w` on this thread if it is still queued (alsoEarlier: with the calls queued before it, in
  // order; else only when it is next), while the worker is not running a call: a blocking wait
  // right after a submit then costs no hand-off to the worker and back. (w null: every queued
  // call.) What it did not run, the worker has or will: wait as usual.
  void runQueuedThrough(const std::shared_ptr<WorkState>& w, bool alsoEarlier);
  void runIfInCallback(const std::shared_ptr<WorkState>& w);  // comm/work_queue.cc

  // Stops everything: pending and later calls fail with aborted; other ranks are told.
  void abort();
  // Clean shutdown after the last collective.
  Status destroy();

  // The error that ended the communicator, or ok.
  Status failure() override;
  std::string lastError();
  void setLastError(const Status& s);

  int rank() const override { return rank_; }
  bool closed() const { return closed_.load(); }  // destroyed or aborted
  int nranks() const override { return nranks_; }
  const Config& config() const { return config_; }
  // How many all-reduces took the zero-copy path (for tests and `braid perf`).
  std::uint64_t zeroCopyCalls() const { return zeroCopyCalls_.load(std::memory_order_relaxed); }
  // How many collectives on device buffers read the peers' buffers through CUDA IPC (for tests).
  std::uint64_t cudaIpcCalls() const { return cudaIpcCalls_.load(std::memory_order_relaxed); }
  std::uint64_t stallNs() const { return live_.stallNs(); }
  // How many all-gathers and broadcasts took the cross-memory-attach path (for tests).
  std::uint64_t cmaCalls() const { return cmaCalls_; }
  bool cmaUsable() const { return cmaUsable_; }
  // The smallest all-gather or broadcast (its whole buffer, in bytes) that cross-memory attach
  // takes where it is usable and no rank is oversubscribed (cmaFits); SIZE_MAX: never. Tests size
  // their calls from it.
  std::size_t cmaMinBytes(CollKind kind) const { return braid::cmaMinBytes(kind, nranks_, cmaCacheBytes_); }
  // Whether ranks outnumber the cores on some rank's host (agreed at setup). Cross-memory attach
  // is then left to the rings (cmaFits). Tests set it, on every rank, to cover both ways anywhere.
  void setOversubscribed(bool oversubscribed) { oversubscribed_ = oversubscribed; }
  // Per peer: the transport's name ("shm", "tcp", ...; "self" for this rank), and why the ones
  // before it in the registry were skipped ("" when none was).
  std::string transportOf(int peer) const;
  std::string skippedTransports(int peer) const;
  // The transport between any two ranks, and why the ones before it were skipped: this rank's own
  // choices, or worked out from the two ranks' roster entries (as both of them did).
  Selection choiceBetween(int a, int b) const;
  // Whether this rank holds a connection to `peer` now (BRAID_CONNECT: a peer left for first use
  // is not connected until a call reaches it); false for itself.
  bool connectedTo(int peer) const;
  // What this rank is doing now, as it answers braid status (LiveState::record).
  std::string statusRecord() const;
  bool hasIncoming(int peer);  // Communicator::hasIncoming

  // EngineHost / Workspace
  Connection* connection(int peer) override { return conns_[static_cast<std::size_t>(peer)].get(); }
  Waiter& waiter() override { return *waiter_; }
  bool failedFast() const override { return failed_.load(std::memory_order_relaxed); }
  double timeoutSec() const override { return config_.timeoutSec; }
  std::string remoteHostOf(int peer) const override;
  // "rank 2 (tcp)", or "rank 2 (tcp, host braid-h2)" for a rank on another host.
  std::string peerName(int peer) const;
  // "rank 2, rank 3 (host braid-h2)": ranks, each other host named once after its last rank.
  std::string rankList(const std::vector<int>& ranks) const;
  Status explainTimeout(const std::string& what, const std::string& detail, bool moving = false) override;
  int pidOf(int rank) const { return pids_[static_cast<std::size_t>(rank)]; }
  std::byte* scratch(std::size_t bytes) override;
  const std::vector<int>& ringOrder() const override { return ringOrder_; }
  int ringPosition(int rank) const override { return ringPos_[static_cast<std::size_t>(rank)]; }
  const std::vector<std::vector<int>>& hosts() const override { return hosts_; }
  int hostIndex(int rank) const override { return hostOf_[static_cast<std::size_t>(rank)]; }
  int smallestHost() const override { return hostSizes_.perHost; }
  int largestHost() const override { return hostSizes_.maxPerHost; }

  // CUDA (defined in comm/cuda/cuda_path.cc): the device a context was current on at creation (-1: none
  // chosen), the staging proxy (made on the first call with device buffers when `create`; null in
  // builds without CUDA), and its shutdown (destroy drains it, abort fails what is queued).
  void noteCudaDevice();
  std::shared_ptr<CudaProxy> cudaProxy(bool create);
  void stopCudaProxy(bool abortive);

  // Runs or waits for every queued asynchronous call, with what their callbacks queue meanwhile
  // (Communicator::finishQueued; blocking calls and destroy first).
  void waitForQueuedCalls();

 private:
  friend class CudaProxy;
  Comm() = default;
  Status setup(InitParams& params);
  // executeCall, with running out of memory as an error. `dev`: a call on device buffers (runDevice).
  Status execute(const CollArgs& a, const DeviceCall* dev = nullptr);
  // runBlocking and runDevice: after queued asynchronous calls, one call at a time.
  Status runInOrder(const CollArgs& a, const DeviceCall* dev);
  Status executeCall(const CollArgs& a, const DeviceCall* dev);
  // The call's fingerprint, with the next sequence number of its kind (collectives, or the pair).
  Fingerprint numberCall(const CollArgs& a);
  Status executeSendRecvs(const std::vector<const CollArgs*>& calls);
  Status checkOverlap(const CollArgs& a, std::size_t elementSize) const;
  Status validateAllToAllv(const CollArgs& a) const;
  // After executeCall's bookkeeping: the algorithms on host memory, and the device call around them.
  // userMemory: the buffers are the user's (false: the CUDA proxy's pinned staging memory, kept away
  // from cross-memory attach; its all-reduces try the zero-copy path softly, see tryZeroCopyAllReduce).
  Status executeHost(const CollArgs& a, const Fingerprint& fp, std::size_t total, bool userMemory);
  Status executeDevice(const CollArgs& a, const DeviceCall& d, const Fingerprint& fp, std::size_t total);
  // comm/cuda/cuda_ipc.cc (CUDA builds): all-reduce, all-gather, reduce-scatter, broadcast and reduce
  // through CUDA IPC; true if done, false if some rank's buffers cannot be shared (then staged).
  Result<bool> cudaIpcCollective(const CollArgs& a, const Fingerprint& fp, void* stream);
  // comm/cuda/cuda_ipc.cc: one side of a send/recv through CUDA IPC (the receiver copies straight from the
  // sender's buffer); true if done, false if the pair found it cannot (then staged).
  Result<bool> cudaIpcSendRecv(const CollArgs& a, const Fingerprint& fp, void* stream);
  // comm/cuda/cuda_ipc.cc: unmaps the peers' memory (stopCudaProxy, before destroy's farewell).
  void releaseCudaIpc();
  // comm/cuda/cuda_ipc.cc, for the CUDA proxy (a friend). prepareCudaIpc: the IPC scratch, allocated on `device` when
  // the proxy starts, before any stream is held. cudaIpcTakes: whether `a` will go through CUDA IPC
  // (unless some rank's buffers cannot be shared), so needs no pinned staging memory; callable from
  // any thread. trimCudaIpc: closes peers' mappings beyond the cache's size; only while no stream is
  // held (closing may synchronize the device).
  void prepareCudaIpc(int device);
  // Whether a device call of this kind is for CUDA IPC to take (before the ranks' agreement).
  bool cudaIpcApplies(CollKind k) const {
    return config_.cudaIpc && oneHost_ && k != CollKind::kSendRecv && k != CollKind::kBarrier;
  }
  // comm/cuda/cuda_ipc.cc: whether a send/recv of `bytes` on device buffers is offered through CUDA IPC:
  // between ranks that all talk over shm (the answer travels in the shm mailbox), from BRAID_BUFFSIZE
  // up, where a send waits for its receive anyway (a smaller one may complete before it, through the
  // ring, and stays staged). Both ends decide alike: all of it is agreed at creation.
  bool cudaIpcOffers(std::size_t bytes) const;
  bool cudaIpcTakes(const CollArgs& a) const;
  void trimCudaIpc();
  // Runs plan_; a failure ends the communicator and is reported to the other ranks.
  Status runPlan();
  // A barrier of zero-byte messages carrying `fp` (inside a collective).
  Status barrier(const Fingerprint& fp);
  // Every rank's `bytes` of `mine`, in rank order into `all` (nranks * bytes), inside a collective:
  // the descriptor exchanges of the zero-copy paths. Also an entry barrier.
  Status allGatherSmall(const void* mine, void* all, std::size_t bytes, const Fingerprint& fp);
  // Every rank's send and receive buffer of `a` as this process sees them: this rank's own, the
  // peers' through map(peer, send?) (the zero-copy paths: braidMemAlloc mappings, CUDA IPC).
  Status peerBuffers(const CollArgs& a, const std::function<Result<std::byte*>(int peer, bool send)>& map,
                     std::vector<const std::byte*>& sends, std::vector<std::byte*>& recvs) const;
  // comm/algorithms/direct.cc: true if done, false if some rank's buffers are not braidMemAlloc memory.
  // soft (the CUDA proxy's staging memory, which the user did not choose): a rank that cannot map a
  // peer's memory is not an error; the ranks agree on it, once per set of staging buffers, and stage
  // through the rings from then on (stagedZeroCopy_).
  Result<bool> tryZeroCopyAllReduce(const CollArgs& a, const Fingerprint& fp, bool soft);
  bool stagedZeroCopy_ = true;
  std::uint64_t stagedZeroCopyAgreed_ = 0;  // the staging buffers last agreed on (a hash of their ids)
  // comm/algorithms/cma.cc: single-copy all-gather and broadcast (process_vm_readv, process_vm_writev).
  bool cmaFits(const CollArgs& a, std::size_t total) const;
  Status cmaCollective(const CollArgs& a, const Fingerprint& fp);
  Status cmaAllGather(const CollArgs& a, const Fingerprint& fp);
  Status cmaBroadcast(const CollArgs& a, const Fingerprint& fp);
  Status cmaCopyFailed(const Fingerprint& fp, int peer, const Status& s);
  // Setup: hosts_, hostOf_ and the rings' order from every rank's PeerInfo.
  void layOutHosts(const std::vector<PeerInfo>& infos);
  // Setup: can this rank read and write every other rank's memory (all on this host)?
  bool probeCma(const std::vector<PeerInfo>& infos) const;
  bool cmaUsable_ = false;  // agreed by every rank at setup
  bool oversubscribed_ = false;  // see setOversubscribed
  // The L3 figure cmaMinBytes uses: the smallest tuningL3 of this host's ranks, so that every rank
  // of the host decides alike (ranks pinned to cores of different L3 domains may each see another).
  std::size_t cmaCacheBytes_ = topology::kAssumedL3Bytes;
  std::uint64_t cmaCalls_ = 0;
  std::vector<std::uint64_t> cmaAddrs_;
  // comm/algorithms/mailbox.cc: small one-shot all-reduce and barrier through the shm mailbox.
  bool mailboxFits(const TunerChoice& t, std::size_t bytes) const;
  Status mailboxAllReduce(const CollArgs& a, const Fingerprint& fp);
  // What a mailbox wait is for, to name the peer on a timeout: this rank's slot to be read by every
  // peer, every peer's message of the call, or one peer's answer to a send/recv offer (`peer`).
  enum class MailboxWait { kPosting, kArrival, kAnswer };
  template <typename Ready>
  Status mailboxWait(const Fingerprint& fp, Ready ready, MailboxWait why, int peer = -1);
  // comm/cuda/cuda_ipc.cc's wait for `peer`'s answer (the template lives in mailbox.cc).
  Status waitForAnswer(const Fingerprint& fp, int peer, const std::function<bool()>& ready);
  Status ringMessageFor(const Fingerprint& fp);
  std::vector<const MailboxSlot*> mailboxIn_;  // per peer: its slot of the current call
  // peerGone: the failure is a rank that left without destroy (its store connection closed).
  void fail(const Status& s, bool tellOthers, bool peerGone = false);
  // destroy: every rank tells every peer its last collective and waits for theirs (see destroy()).
  Status farewell();
  // Connect-on-use (comm/connect.cc): the peers this rank connects at set-up, and the connections
  // a plan needs that are not made yet.
  std::vector<int> peersAtSetup();
  Status connectPlanPeers(const Plan& plan);
  void onNotice(const Notice& n);
  void workerLoop();
  // Joins the worker (after stopWorker_), or, on the worker itself, lets it go (workerLoop).
  void endWorker();
  void shutdown(bool abortive);
  // After shutdown, under execMu_: what only calls use (the flight recorder's entries, the call
  // history): a closed communicator's C handle is kept (late calls get invalid usage) but holds
  // little more than its rank, size and last error.
  void releaseClosed();

  int rank_ = 0, nranks_ = 1;
  Config config_;
  std::uint64_t commTag_ = 0;
  std::string nonce_;
  std::string storeNonce_;
  std::unique_ptr<StoreServer> storeServer_;
  std::unique_ptr<StoreClient> store_;
  TransportList transports_;  // every transport of the registry, used or not
  std::vector<std::unique_ptr<Connection>> conns_;  // by peer rank; null for self and for peers not connected yet
  std::vector<int> laterVia_;  // by peer rank: the transport (index) that connects it on first use; -1: none
  std::vector<std::size_t> waitedFds_;  // by transport: how many of its waitSources().fds the waiter has
  std::vector<std::string> transportNames_, skipped_;  // by peer rank
  std::vector<PeerInfo> roster_;  // every rank's roster entry (transport/registry.h rosterEntry)
  std::vector<std::string> hostNames_;  // by rank: PeerInfo::host
  std::unique_ptr<Waiter> waiter_;
  Mailbox* mailbox_ = nullptr;  // the host's mailbox, when a transport has one (shm)
  // The slowest link among all pairs (agreed: every rank derives it from the same PeerInfos). Its
  // sharedMemory: every pair maps shared memory, which the mailbox, cross-memory attach and the
  // zero-copy all-reduce need.
  LinkClass link_;
  std::vector<int> pids_;  // by rank, to map peers' braidMemAlloc memory
  std::vector<bool> localPeer_;  // by rank: on this host (its pid can be checked)
  bool oneHost_ = false;         // every rank is on one host (agreed by all: the same PeerInfos)
  // The hosts and the rings' order (Workspace), from the PeerInfos at setup.
  std::vector<std::vector<int>> hosts_;
  std::vector<int> hostOf_;  // by rank: its index in hosts_
  HostShape hostSizes_;      // hostShape(hosts_), kept by layOutHosts
  std::vector<int> ringOrder_, ringPos_;
  std::string deadLocalRanks() const;
  mem::PeerMappings peerMemory_;
  int maxChannels_ = 2;
  Tuner tuner_;

  std::uint64_t collSeq_ = 0;
  // This rank's last collectives by sequence number (mod 64), to name them when a peer's message
  // for one of them turns up unread (checkLeftovers).
  static constexpr std::uint64_t kHistory = 64;
  std::vector<Fingerprint> history_ = std::vector<Fingerprint>(kHistory);  // freed at close (releaseClosed)
  Status checkLeftovers(std::uint64_t finished);  // finished: the last collective this rank completed
  Status unreadMessageError(int peer, const Fingerprint& theirs) const;
  // Calls f(peer, header) for each header of this communicator waiting whole at the head of an
  // incoming channel; returns the first error f returns.
  Status forEachWaitingHeader(const std::function<Status(int, const WireHeader&)>& f);
  std::atomic<std::uint64_t> zeroCopyCalls_{0};  // also written by the CUDA proxy (staged pieces), read by tests
  std::atomic<std::uint64_t> cudaIpcCalls_{0};  // written by the CUDA proxy, read by tests
  std::shared_ptr<CudaIpc> cudaIpc_;  // comm/cuda/cuda_ipc.cc: what the ranks agreed and the mapped buffers
  SendRecvNumbers sendRecvNumbers_;
  Plan plan_;
  FlightRecorder trace_;  // touched only under execMu_
  LiveState live_;        // written by the executing thread, read by the watcher (braid status)
  // The flight recorder and the live state at a call's start and end.
  // (one read of the recorder's clock, the TSC where usable, for both)
  void callBegins(const Fingerprint& fp) {
    callStart_ = trace_.now();
    trace_.begin(fp, callStart_);
    live_.begin(fp, callStart_);
    if (inspect_) lastCall_ = fp, callPeers_.clear(), lastPath_ = "", lastChannels_ = 0, inspecting_ = true;
  }
  void callEnds(const Status& s) {
    const std::int64_t now = trace_.now();
    trace_.end(s, now);
    live_.end(s.ok(), now);
    if (inspecting_) inspectCall(s, now), inspecting_ = false;  // (a call refused before it began has no line)
  }
  // Bytes a path without a plan (mailbox, cross-memory attach) moved with `peer`.
  void peerBytes(int peer, std::uint64_t sent, std::uint64_t recv) {
    trace_.peerBytes(peer, sent, recv);
    live_.progress().add(peer, sent + recv);
    if (inspect_) notePeerBytes(peer, sent, recv);
  }
  // What observers see besides braid status's answers (comm/observe.cc): the metrics port
  // (BRAID_METRICS_PORT) and one JSON line per call (BRAID_INSPECT_DIR).
  void openObservers();
  void serveMetrics();
  void notePeerBytes(int peer, std::uint64_t sent, std::uint64_t recv);
  void inspectCall(const Status& s, std::int64_t now);
  void closeObservers();
  net::Fd metricsListen_;
  std::FILE* inspect_ = nullptr;
  std::int64_t inspectFlushedNs_ = 0, callStart_ = 0;  // (callStart_: the recorder's clock)
  Fingerprint lastCall_;
  const char* lastPath_ = "";  // the path the call took: "zero copy", "shm mailbox", an algorithm, ...
  int lastChannels_ = 0;
  bool inspecting_ = false;  // callBegins opened a line that callEnds writes
  std::vector<TracePeerBytes> callPeers_;  // this call's bytes per peer (BRAID_INSPECT_DIR only)
  std::vector<std::byte> scratch_;

  std::mutex failMu_;
  std::atomic<bool> failed_{false};
  std::atomic<long> callerTid_{0};              // the thread inside a call (Caller), 0 if none
  std::atomic<int> callerOverlaps_{0};          // threads refused so far
  std::atomic<std::uint64_t> callerCall_{0};   // that call, packed (kind, type, count: comm/caller.cc)
  Status failure_;
  bool failureIsPeerGone_ = false;  // under failMu_: the first failure was a peer that left (or the store's host)
  std::mutex timeoutMu_;
  std::condition_variable timeoutCv_;
  std::map<int, std::string> timedOut_;  // rank -> what it waited for, from kTimedOut notices
  std::mutex errMu_;
  std::string lastError_;

  std::mutex execMu_;  // one collective at a time
  std::atomic<bool> closed_{false};

  std::mutex qMu_;
  // Nothing wakes a thread that has nothing to do: the worker sleeps on workerAlarm_ (a call
  // queued, at once or within a bound, see work_queue.cc; the end of a call with another queued
  // behind it; stop); waitForQueuedCalls waits on drainedCv_ (the queue empty and nothing running).
  Alarm workerAlarm_;
  bool workerSleeping_ = false;  // under qMu_: on workerAlarm_
  bool lazyWorkerWake_ = false;  // this host's ranks outnumber its CPUs (set at init)
  std::condition_variable drainedCv_;
  struct Queued {
    std::vector<CollArgs> calls;  // one call, or a group's
    bool group = false;
    std::shared_ptr<WorkState> work;
    std::uint64_t number = 0;  // in queueing order
    std::int64_t queuedUs = 0;  // nowUs() at submit
  };
  std::shared_ptr<WorkState> enqueue(Queued item);
  std::uint64_t queuedCount_ = 0;  // under qMu_
  // A queued item's run, by the worker or by runQueuedThrough's thread (workerBusy_ set by the caller).
  // With keepThroughCallbacks, a handle on this communicator is held there from before its Work's
  // callbacks run (the worker's: a callback may drop the last handle).
  void runQueued(Queued& item, std::shared_ptr<Comm>* keepThroughCallbacks = nullptr);
  std::weak_ptr<Comm> self_;  // for WorkState::owner
  // runGroup's body, with execMu_ held.
  Status executeGroup(const std::vector<CollArgs>& calls);
  std::deque<Queued> queue_;
  bool workerBusy_ = false;
  std::atomic<int> asyncPending_{0};  // submitted calls not yet finished (queued, running, or in their callbacks)
  int callbacksRunning_ = 0;           // under qMu_: calls whose Work callbacks are running
  bool stopWorker_ = false;
  std::thread worker_;

  std::mutex cudaMu_;
  int cudaDevice_ = -1;
  std::shared_ptr<CudaProxy> cudaProxy_;
  std::atomic<bool> haveCudaProxy_{false};  // cudaProxy_ is set: host calls skip cudaMu_ without one
};

// A communicator from each of the bootstrap's three forms (comm/bootstrap/init.h).
Result<std::shared_ptr<Comm>> initFromUniqueId(const braidUniqueId& id, int nranks, int rank,
                                               const CommOptions& options = {});
Result<std::shared_ptr<Comm>> initFromEnv(const CommOptions& options = {});
Result<std::shared_ptr<Comm>> initFromStore(const std::string& host, int port, bool isHost, int nranks, int rank,
                                            const CommOptions& options = {});
// braidCommSplit (comm/split.cc): nullptr for BRAID_SPLIT_NOCOLOR. A non-empty `refusal` (this
// rank's arguments are bad) still takes part in the parent's exchange, so that every rank returns
// invalid argument rather than waiting for this one.
Result<std::shared_ptr<Comm>> splitComm(Comm& parent, int color, int key, const CommOptions& options,
                                        const std::string& refusal = "");

}  // namespace braid
