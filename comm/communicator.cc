// The call path (validate -> fingerprint -> tune -> plan -> engine), the blocking and grouped
// entries, destroy, abort and shutdown. Creation is in comm/setup.cc, failure handling in
// comm/failure.cc.
#include "comm/communicator.h"
#include "comm/failure.h"

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
Comm::~Comm() {
  // The last handle dropped ends the communicator as destroy does, but without the farewell:
  // asynchronous calls already queued run first (each within BRAID_TIMEOUT), as every rank queued
  // them; failing them here instead would leave the peers waiting in them for the timeout.
  // (A Work callback that drops the last handle on the worker ends it there after the call: see
  // workerLoop.)
  if (!closed_.load() && !failed_.load()) waitForQueuedCalls();
  if (!closed_.exchange(true)) shutdown(failed_.load());
}

std::string Comm::transportOf(int peer) const { return transportNames_[static_cast<std::size_t>(peer)]; }
std::string Comm::skippedTransports(int peer) const { return skipped_[static_cast<std::size_t>(peer)]; }
Selection Comm::choiceBetween(int a, int b) const {
  if (a == rank_ || b == rank_) {
    const auto peer = static_cast<std::size_t>(a == rank_ ? b : a);
    Selection s;
    s.transport = transportNames_[peer];
    s.skipped = skipped_[peer];
    return s;
  }
  Selection s = selectTransport(transports_, roster_[static_cast<std::size_t>(a)], roster_[static_cast<std::size_t>(b)]);
  if (s.index < 0) s.transport = "none";
  return s;
}

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
  return braid::rankList(ranks, [this](int r) { return remoteHostOf(r); });
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
  if (a.kind == CollKind::kSendRecv) return sendRecvNumbers_.number(a, rank_);
  Fingerprint fp = callFingerprint(a);
  fp.seq = ++collSeq_;
  return fp;
}

Status Comm::executeCall(const CollArgs& in, const DeviceCall* dev) {
  CollArgs a = in;
  const Fingerprint fp = numberCall(a);
  // After the failure every call names itself and its number: the error says which call found out.
  if (failed_) return failure().withContext(fp.describe() + " #" + std::to_string(fp.seq) + " on a failed communicator");
  callBegins(fp);
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
      lastPath_ = "zero copy";
      BRAID_LOG(kInfo, kTune, "%s #%llu: zero-copy (every rank's buffers are braidMemAlloc memory%s)",
                fp.describe().c_str(), static_cast<unsigned long long>(fp.seq), userMemory ? "" : ": the CUDA proxy's staging");
      return Status::Ok();
    }
  }
  if (userMemory && cmaFits(a, total)) {
    lastPath_ = "cross-memory attach";
    return cmaCollective(a, fp);
  }
  const TunerChoice& t = tuner_.choose(a.kind, total);
  const bool viaMailbox = (a.kind == CollKind::kAllReduce || a.kind == CollKind::kBarrier) && mailboxFits(t, total);
  BRAID_LOG(kInfo, kTune, "%s #%llu: %s%s, %d channel(s), chunk %zu (model: ring %.1f us, tree %.1f us, oneshot %.1f us, "
            "hier %.1f us, bruck %.1f us)", fp.describe().c_str(), static_cast<unsigned long long>(fp.seq), algoName(t.algo),
            viaMailbox ? " (shm mailbox)" : "", t.channels, t.chunk, t.ringUs, t.treeUs, t.oneShotUs, t.hierUs, t.bruckUs);
  lastPath_ = viaMailbox ? "shm mailbox" : algoName(t.algo);
  lastChannels_ = viaMailbox ? 0 : t.channels;
  if (viaMailbox) return mailboxAllReduce(a, fp);
  plan_.reset(fp, commTag_, rank_, nranks_, t.chunk);
  const Algo algo = t.algo;
  const int channels = t.channels;
  // (Re-tuning for all-to-all's channels makes `t`, the tuner's last answer, another: copied above.)
  const int allToAllChannels = a.kind == CollKind::kAllToAll || a.kind == CollKind::kAllToAllv
                                   ? tuner_.choose(CollKind::kAllToAll, std::size_t{1} << 30).channels
                                   : channels;
  const bool oneShot = buildPlan(a, *this, algo, channels, allToAllChannels, plan_);
  Status s = runPlan();
  if (s.ok() && oneShot) finishOneShotAllReduce(a, *this);
  return s;
}

Status Comm::runPlan() {
  Status s = connectPlanPeers(plan_);
  if (s.ok()) s = Engine::run(plan_, *this);
  trace_.tally(plan_);
  if (inspect_)
    plan_.forEachMessage([&](const Op& op, int, std::size_t) {
      op.kind == Op::kSend ? notePeerBytes(op.peer, op.done, 0) : notePeerBytes(op.peer, 0, op.done);
    });
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
    callEnds(s);
    if (!s.ok()) return s;
  }
  for (const CollArgs& a : calls) {
    if (a.kind == CollKind::kSendRecv) continue;
    Status s = execute(a);
    callEnds(s);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// One plan for all of them (buildSendRecvGroup), each message numbered and checked as its call
// would be alone.
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
  callBegins(fps[0]);  // one entry for the group, under its first call
  const TunerChoice& t = tuner_.choose(CollKind::kSendRecv, largest);
  plan_.reset(fps[0], commTag_, rank_, nranks_, t.chunk);
  buildSendRecvGroup(calls, fps, plan_);
  lastPath_ = "send/recv", lastChannels_ = 1;
  return runPlan();
}

Status Comm::runInOrder(const CollArgs& a, const DeviceCall* dev) {
  waitForQueuedCalls();
  Status s;
  {
    std::lock_guard<std::mutex> g(execMu_);
    s = closed_ ? Status::Aborted("the communicator was aborted") : execute(a, dev);
    callEnds(s);
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
  endWorker();
  workerAlarm_.close();
  std::lock_guard<std::mutex> g(execMu_);  // waits for a blocking call on another thread to leave
  if (store_) store_->close();               // also joins the watcher: nothing else touches us now
  closeObservers();
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
    case Algo::kBruck: return "bruck";
  }
  return "?";
}

}  // namespace braid
