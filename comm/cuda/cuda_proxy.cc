// The CUDA proxy (see cuda_proxy.h for the protocol).
//
// Holding the caller's stream, two ways (BRAID_CUDA_WAIT; docs/architecture/cuda.md):
// - value (default when the driver has it): cuStreamWaitValue32 on a word of mapped pinned memory
//   that the proxy sets when the call is done; "ready" is an event recorded just before the wait.
//   The stream waits in the GPU's front end; no host thread of CUDA's is involved. This is the
//   mechanism CUDA sanctions for waiting on a host-side condition.
// - hostfn: a host function that signals "ready" and blocks until "done". It needs nothing but the
//   runtime API, but CUDA's documentation forbids a host function to wait on work "not mandated to
//   run earlier" (our proxy's copies are exactly that), and it holds one of CUDA's callback threads
//   for the whole collective. Kept as the fallback and as a second opinion for the GPU tests.
#include "comm/cuda/cuda_proxy.h"

#include <cuda_runtime.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "comm/cuda/cuda_util.h"
#include "base/log.h"
#include "comm/memory.h"
#include "kernels/reduce_cuda.h"

namespace braid {

using cuda::failed;

// Staging memory: braidMemAlloc memory (a memfd the peers on this host can map) page-locked with
// cudaHostRegister, so that the host all-reduce of a staged piece can take the zero-copy path
// (comm/algorithms/direct.cc) and the copies to and from the GPU run at pinned speed; plain
// cudaHostAlloc memory where that cannot be had.
struct CudaProxy::Pinned {
  std::byte* data = nullptr;
  std::size_t size = 0;
  bool shared = false;  // braidMemAlloc memory, registered
  ~Pinned() {
    if (!data) return;
    if (shared) {
      cudaHostUnregister(data);
      (void)mem::release(data);  // (ours: cannot fail)
    } else {
      cudaFreeHost(data);
    }
  }
};

struct CudaProxy::Op {
  CollArgs dev{};           // the call as the user made it
  CollArgs host{};          // the call, pointing into pinned memory
  const void* sendDev = nullptr;
  void* recvDev = nullptr;
  std::byte* sendHost = nullptr;  // where sendDev's bytes go (may lie inside recvHost's range)
  std::byte* recvHost = nullptr;
  std::size_t sendBytes = 0, recvBytes = 0;  // 0: nothing to copy that way
  // Pieces (see runStaged): how many, and for all-gather and reduce-scatter in more than one piece
  // the two pinned slots their pieces alternate between (each n x the largest piece); the natural
  // layout (sendHost, recvHost) is then not used.
  std::size_t pieces = 1;
  std::byte* slots[2] = {nullptr, nullptr};
  // The pinned layout, decided by enqueue and placed by placeStaging when the call is staged (calls
  // that go through CUDA IPC need no pinned memory): bytes in all, and where each buffer starts.
  std::size_t stagingBytes = 0, sendOff = 0, recvOff = 0, slotBytes = 0;
  bool recvInSend = false;
  // No reference to the pinned buffer: the op may outlive its call inside the host function, and the
  // last reference must never be dropped there (freeing pinned memory is a CUDA call). The proxy keeps
  // every buffer an op may use alive until it is idle.
  std::shared_ptr<WorkState> work;
  double holdSec = 0;  // how long the host function may hold the stream
  void* readyEvent = nullptr;   // value mechanism: recorded on the caller's stream before the hold
  bool readyEventDone = false;  // its record completed (it may be recorded again)
  unsigned* doneWord = nullptr; // value mechanism: set to `seq` when done (releases the stream)
  unsigned seq = 0;
  bool captured = false;  // a launch of a CUDA graph made this call

  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;      // the stream reached the call
  bool done = false;       // the proxy finished it (or gave up)
  bool abandoned = false;  // the host function stopped waiting: the result must not be copied in late
  Status status;

  void finish(Status s) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (done) return;
      done = true;
      status = s;
      if (doneWord) __atomic_store_n(doneWord, seq, __ATOMIC_RELEASE);  // calls finish in sequence order
      cv.notify_all();
    }
    if (work) work->finish(std::move(s));
  }
};

namespace {

// Runs on CUDA's callback thread once the stream has reached the call. It only touches host state:
// a host function must not call CUDA.
void CUDART_CB releaseWhenDone(void* arg) {
  auto* holder = static_cast<std::shared_ptr<CudaProxy::Op>*>(arg);
  CudaProxy::Op& op = **holder;
  {
    std::unique_lock<std::mutex> g(op.mu);
    op.ready = true;
    op.cv.notify_all();
    if (!op.cv.wait_for(g, std::chrono::duration<double>(op.holdSec), [&] { return op.done; })) op.abandoned = true;
  }
  delete holder;
}

}  // namespace

Result<std::shared_ptr<CudaProxy>> CudaProxy::start(Comm& comm, int device) {
  std::shared_ptr<CudaProxy> p(new CudaProxy(comm, device));
  cuda::DeviceScope on(device);
  if (on.error() != cudaSuccess) return failed(on.failedCall(), on.error());
  // Every kernel Braid launches is loaded now, before this proxy holds any stream: a lazy first load
  // on the proxy thread could wait for the held stream, which waits for the proxy (reduce_cuda.h).
  Status loaded = kernels::gpu::preload();
  if (!loaded.ok()) return loaded;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return failed("cudaStreamCreateWithFlags", e);
  p->stream_ = s;
  cudaStream_t out = nullptr;
  if ((e = cudaStreamCreateWithFlags(&out, cudaStreamNonBlocking)) != cudaSuccess) return failed("cudaStreamCreateWithFlags", e);
  p->outStream_ = out;
  int maxPitch = 0;
  if (cudaDeviceGetAttribute(&maxPitch, cudaDevAttrMaxPitch, device) == cudaSuccess && maxPitch > 0)
    p->maxPitch_ = static_cast<std::size_t>(maxPitch);
  for (void*& ev : p->events_) {
    cudaEvent_t created = nullptr;
    if ((e = cudaEventCreateWithFlags(&created, cudaEventDisableTiming)) != cudaSuccess)
      return failed("cudaEventCreateWithFlags (staging)", e);
    ev = created;
  }
  const std::string& mode = comm.config().cudaWait;
  if (mode != "hostfn") {
    void* fn = nullptr;
    void* word = nullptr;
    void* wordDev = nullptr;
    cudaDriverEntryPointQueryResult found{};
    std::string why;
    e = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
      why = "cuStreamWaitValue32 not found in the driver";
    } else if ((e = cudaHostAlloc(&word, 64, cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess ||
               (e = cudaHostGetDevicePointer(&wordDev, word, 0)) != cudaSuccess) {
      why = failed("mapped pinned memory for the done word", e).message();
    } else {
      p->waitValue_ = fn;
      p->doneWord_ = static_cast<unsigned*>(word);
      *p->doneWord_ = 0;
      p->doneWordDev_ = reinterpret_cast<unsigned long long>(wordDev);
    }
    if (!why.empty()) {
      if (mode == "value") return Status::CudaError("BRAID_CUDA_WAIT=value: " + why);
      BRAID_LOG(kInfo, kInit, "rank %d: %s: holding streams with host functions instead", comm.rank(), why.c_str());
    }
  }
  p->pinned_ = std::make_shared<Pinned>();
  p->thread_ = std::thread([raw = p.get()] { raw->loop(); });
  BRAID_LOG(kInfo, kInit, "rank %d: CUDA proxy started on device %d (streams held by %s)", comm.rank(), device,
            p->waitValue_ ? "cuStreamWaitValue32" : "host functions");
  return p;
}

CudaProxy::~CudaProxy() { stop(true); }

// After the thread has ended (stop): the CUDA resources go now, on the caller's thread, so that the
// proxy's last reference, which a graph's node may hold for a moment, frees no CUDA object on CUDA's
// callback thread. Safe to repeat.
void CudaProxy::releaseCuda() {
  std::lock_guard<std::mutex> growing(growMu_);  // (a growPinned under way swaps nothing in once stopping_)
  for (void*& ev : events_)
    if (void* e = std::exchange(ev, nullptr)) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (void* ev : spareEvents_) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
  spareEvents_.clear();
  if (void* st = std::exchange(stream_, nullptr)) cudaStreamDestroy(static_cast<cudaStream_t>(st));
  if (void* st = std::exchange(outStream_, nullptr)) cudaStreamDestroy(static_cast<cudaStream_t>(st));
  retired_.clear();
  if (pinned_) pinned_ = std::make_shared<Pinned>();  // (an empty one frees nothing)
}

std::shared_ptr<CudaProxy::Op> CudaProxy::prepare(const CollArgs& a) const {
  const int n = comm_.nranks(), me = comm_.rank();
  const std::size_t es = dataTypeSize(a.dtype);
  std::size_t sendBytes = a.count * es, recvBytes = a.count * es;
  if (a.kind == CollKind::kAllGather) recvBytes *= static_cast<std::size_t>(n);
  if (a.kind == CollKind::kReduceScatter) sendBytes *= static_cast<std::size_t>(n);
  bool needSend = a.kind != CollKind::kSendRecv || a.isSend;
  bool needRecv = a.kind == CollKind::kSendRecv ? !a.isSend : (a.kind != CollKind::kReduce || a.root == me);
  if (a.kind == CollKind::kBroadcast) needSend = a.root == me;
  if (!a.send) needSend = false;
  if (!a.recv) needRecv = false;

  auto op = std::make_shared<Op>();
  op->dev = a;
  op->host = a;
  op->holdSec = 3 * comm_.timeoutSec() + 60;  // the proxy gives up after ~2 timeouts; this is the backstop
  const auto* s = static_cast<const std::byte*>(a.send);
  auto* r = static_cast<std::byte*>(a.recv);
  // The pinned layout keeps in-place calls in place: a send range inside the recv range (all-gather,
  // all-reduce with send == recv) or a recv range inside the send range (reduce-scatter) keeps its offset.
  std::size_t total = 0, sendOff = 0, recvOff = 0;
  const bool blocks = a.kind == CollKind::kAllGather || a.kind == CollKind::kReduceScatter;
  op->pieces = std::max<std::size_t>(1, std::max(needSend ? sendBytes : 0, needRecv ? recvBytes : 0) / kStagePieceBytes);
  if (op->pieces > a.count) op->pieces = std::max<std::size_t>(1, a.count);
  std::size_t slotBytes = 0;
  if (blocks && op->pieces > 1) {
    slotBytes = ((a.count + op->pieces - 1) / op->pieces * es * static_cast<std::size_t>(n) + 255) / 256 * 256;
    total = 2 * slotBytes;
  } else if (needSend && needRecv && s >= r && s + sendBytes <= r + recvBytes) {
    total = recvBytes;
    sendOff = static_cast<std::size_t>(s - r);
  } else if (needSend && needRecv && r >= s && r + recvBytes <= s + sendBytes) {
    total = sendBytes;
    recvOff = static_cast<std::size_t>(r - s);
    op->recvInSend = true;
  } else {
    recvOff = 0;
    sendOff = needRecv ? (recvBytes + 255) / 256 * 256 : 0;
    total = sendOff + (needSend ? sendBytes : 0);
  }
  op->stagingBytes = total;
  op->sendOff = sendOff;
  op->recvOff = recvOff;
  op->slotBytes = slotBytes;
  op->sendDev = needSend ? a.send : nullptr;
  op->recvDev = needRecv ? a.recv : nullptr;
  op->sendBytes = needSend ? sendBytes : 0;
  op->recvBytes = needRecv ? recvBytes : 0;
  return op;
}

Status CudaProxy::enqueue(const CollArgs& a, void* stream, std::shared_ptr<WorkState> work) {
  std::shared_ptr<Op> op = prepare(a);
  op->work = std::move(work);
  const std::size_t total = op->stagingBytes;
  // Pinned memory is allocated here, before this call's stream is held (an allocation may
  // synchronize with other streams), unless the call goes through CUDA IPC and needs none.
  if (!comm_.cudaIpcTakes(a)) {
    Status grown = growPinned(total);
    if (!grown.ok()) return grown;
  }
  std::unique_lock<std::mutex> g(mu_);
  if (stopping_) return Status::InvalidUsage("the communicator was destroyed or aborted");
  // No stream is held: outgrown buffers may go now (not once graphs exist: freeing may wait for a
  // stream whose graph is about to reach one of this proxy's calls, which needs mu_, held here).
  if (!busy_ && queue_.empty() && capturedCalls_ == 0) retired_.clear();
  // Graphs may hold calls of this proxy that their streams have yet to reach: this call is queued
  // when its own stream reaches it, behind any such call on that stream.
  if (capturedCalls_ > 0) return queueWhenReached(op, stream, g);
  op->seq = ++seq_;
  bool held = false;
  if (waitValue_) {
    Status hs = holdWithValue(*op, stream, &held);
    if (!hs.ok()) return hs;
  }
  if (!held) {
    Status hs = holdWithHostFn(op, stream);
    if (!hs.ok()) return hs;
  }
  queue_.push_back(op);
  cv_.notify_all();
  return Status::Ok();
}

namespace {

// Every captured call's node argument, for the life of the process (see CudaProxy::Captured).
std::mutex& capturedMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::vector<std::unique_ptr<CudaProxy::Captured>>& capturedCalls() {
  static auto* v = new std::vector<std::unique_ptr<CudaProxy::Captured>>();
  return *v;
}

// A captured call's node, each time a launch of its graph reaches it (CUDA's callback thread).
void CUDART_CB replayCaptured(void* arg) {
  auto* c = static_cast<CudaProxy::Captured*>(arg);
  if (auto p = c->proxy.lock()) {
    p->replay(c->args);
  } else {
    BRAID_LOG(kWarn, kColl, "a CUDA graph reached a %s of a destroyed communicator: skipped", collName(c->args.kind));
  }
}

// A call made once graphs exist, when its stream reaches it.
struct Deferred {
  std::weak_ptr<CudaProxy> proxy;
  std::shared_ptr<CudaProxy::Op> op;
};
void CUDART_CB queueReached(void* arg) {
  std::unique_ptr<Deferred> d(static_cast<Deferred*>(arg));
  if (auto p = d->proxy.lock()) p->queueAndWait(d->op);
  else d->op->finish(Status::Aborted("the communicator was destroyed before the stream reached this call"));
}

}  // namespace

Status CudaProxy::enqueueCaptured(const CollArgs& a, void* stream) {
  std::shared_ptr<Op> op = prepare(a);
  // A staged replay's pinned memory now: the node cannot allocate it (no CUDA call in a host
  // function), nor should the proxy while the replay holds the stream.
  if (!comm_.cudaIpcTakes(a)) {
    Status grown = growPinned(op->stagingBytes);
    if (!grown.ok())
      return grown.withContext("capturing " + std::string(collName(a.kind)) +
                               " (Braid allocates pinned memory while capturing: use cudaStreamCaptureModeRelaxed)");
  }
  {
    // Counted before the node exists (from now on every call is queued when its stream reaches
    // it); the CUDA call below is made without mu_ held.
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) return Status::InvalidUsage("the communicator was destroyed or aborted");
    ++capturedCalls_;
  }
  Captured* c = nullptr;
  {
    std::lock_guard<std::mutex> l(capturedMutex());
    capturedCalls().push_back(std::make_unique<Captured>(Captured{weak_from_this(), a}));
    c = capturedCalls().back().get();
  }
  cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), replayCaptured, c);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> g(mu_);
    --capturedCalls_;  // (no node holds it)
    return failed("cudaLaunchHostFunc (capturing the call into the graph)", e);
  }
  return Status::Ok();
}

void CudaProxy::replay(const CollArgs& a) {
  std::shared_ptr<Op> op;
  {
    // Prepared under mu_: once stop() has begun, the communicator it reads may be gone.
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) {
      BRAID_LOG(kWarn, kColl, "a CUDA graph reached a %s of a destroyed communicator: skipped", collName(a.kind));
      return;
    }
    op = prepare(a);
    op->captured = true;
    ++deferred_;
  }
  queueAndWait(op);
}

void CudaProxy::queueAndWait(const std::shared_ptr<Op>& op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    --deferred_;
    if (stopping_) {
      cv_.notify_all();
      op->finish(Status::Aborted("the communicator was destroyed or aborted before this call ran"));
      return;
    }
    op->ready = true;  // this node is the hold: the stream has reached the call
    op->seq = ++seq_;
    queue_.push_back(op);
    cv_.notify_all();
  }
  std::unique_lock<std::mutex> g(op->mu);
  if (!op->cv.wait_for(g, std::chrono::duration<double>(op->holdSec), [&] { return op->done; })) op->abandoned = true;
}

Status CudaProxy::queueWhenReached(const std::shared_ptr<Op>& op, void* stream, std::unique_lock<std::mutex>& lock) {
  ++deferred_;  // (drain waits for it from now on)
  lock.unlock();
  auto* d = new Deferred{weak_from_this(), op};
  cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), queueReached, d);
  if (e != cudaSuccess) {
    delete d;
    lock.lock();
    --deferred_;
    cv_.notify_all();
    return failed("cudaLaunchHostFunc (ordering the call with the stream)", e);
  }
  return Status::Ok();
}

Status CudaProxy::holdWithValue(Op& op, void* stream, bool* held) {
  auto st = static_cast<cudaStream_t>(stream);
  cuda::DeviceScope on(device_);  // the event must be on the stream's device, whatever the caller's thread has current
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaSuccess;
  if (!spareEvents_.empty()) {  // (enqueue holds mu_)
    ev = static_cast<cudaEvent_t>(spareEvents_.back());
    spareEvents_.pop_back();
  } else if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
    return failed("cudaEventCreateWithFlags", e);
  }
  if ((e = cudaEventRecord(ev, st)) != cudaSuccess) {
    cudaEventDestroy(ev);
    return failed("cudaEventRecord (on the caller's stream)", e);
  }
  // CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned flags); flags 0 = GEQ:
  // wait until (int32_t)(*word - seq) >= 0, which survives the counter wrapping.
  using WaitValue32 = int (*)(void* stream, unsigned long long addr, unsigned value, unsigned flags);
  const int rc = reinterpret_cast<WaitValue32>(waitValue_)(stream, doneWordDev_, op.seq, 0);
  if (rc != 0) {
    cudaEventDestroy(ev);
    if (comm_.config().cudaWait == "value")
      return Status::CudaError("cuStreamWaitValue32 (holding the caller's stream) failed with CUresult " + std::to_string(rc));
    BRAID_LOG(kWarn, kColl, "rank %d: cuStreamWaitValue32 failed (CUresult %d): holding streams with host functions from now on",
              comm_.rank(), rc);
    waitValue_ = nullptr;
    return Status::Ok();
  }
  op.readyEvent = ev;
  op.doneWord = doneWord_;
  *held = true;
  return Status::Ok();
}

Status CudaProxy::holdWithHostFn(const std::shared_ptr<Op>& op, void* stream) {
  auto* holder = new std::shared_ptr<Op>(op);
  cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), releaseWhenDone, holder);
  if (e != cudaSuccess) {
    delete holder;
    return failed("cudaLaunchHostFunc (ordering the call with the stream)", e);
  }
  return Status::Ok();
}

Status CudaProxy::drain(double seconds) {
  std::unique_lock<std::mutex> g(mu_);
  if (!cv_.wait_for(g, std::chrono::duration<double>(seconds), [&] { return queue_.empty() && !busy_ && deferred_ <= 0; }))
    return Status::Timeout("calls on CUDA streams did not finish within " + std::to_string(static_cast<long>(seconds)) +
                           " s (a stream blocked before a Braid call?)");
  return Status::Ok();
}

void CudaProxy::stop(bool abortive) {
  // Calls made on streams that have not reached them yet (once graphs exist) finish first, bounded.
  if (!abortive) (void)drain(3 * comm_.timeoutSec() + 60);
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    abortive_ = abortive_ || abortive;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& op : queue_) {
      op->finish(Status::Aborted("the communicator was destroyed or aborted before this call ran"));
      if (op->readyEvent) cudaEventDestroy(static_cast<cudaEvent_t>(op->readyEvent));
      op->readyEvent = nullptr;
    }
    queue_.clear();
  }
  // Not under mu_: freeing pinned memory may wait for a stream whose graph node waits for mu_ (it
  // then finds the proxy stopping and returns). Nothing else touches these once the thread is gone.
  releaseCuda();
}

void CudaProxy::loop() {
  Comm::markInternalThread();  // its calls run on the user's behalf, in the order the user made them
  if (cudaSetDevice(device_) != cudaSuccess) {
    // Every call will fail in stage() with the error named.
  }
  // This thread polls GPU work in short sleeps (cuda::PollPause) once a wait passes 200 us: with
  // Linux's default 50 us timer slack a 20 us sleep lasts about 70 us, 125 us on a VM (1 us: 62 us there).
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty() || (stopping_ && abortive_)) return;
      op = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    process(*op);
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
    if (void* ev = std::exchange(op->readyEvent, nullptr)) {
      if (op->readyEventDone && spareEvents_.size() < 64) spareEvents_.push_back(ev);
      else cudaEventDestroy(static_cast<cudaEvent_t>(ev));  // (it may still be recorded: CUDA frees it when it completes)
    }
    if (queue_.empty() && capturedCalls_ == 0) {
      // Idle, and under mu_ no call can queue a hold meanwhile: no stream is held, so what may
      // synchronize the device may run now. (Not once graphs exist: a launch may be about to
      // reach one of this proxy's calls, and would wait for the proxy while the proxy waits for it.)
      retired_.clear();
      comm_.trimCudaIpc();
    }
    cv_.notify_all();
  }
}

namespace {

// One copy of `rows` rows of `width` bytes (pitches: bytes from one row to the next), on `stream`:
// one 2-D copy, or a copy per row where a pitch exceeds what 2-D copies allow (cudaDevAttrMaxPitch,
// about 2 GiB: blocks that large are rare, and their rows are long enough not to mind).
Status copyRows(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                std::size_t rows, std::size_t maxPitch, cudaStream_t stream, const char* what) {
  if (!width || !rows) return Status::Ok();
  cudaError_t e = cudaSuccess;
  if (rows == 1) {
    e = cudaMemcpyAsync(dst, src, width, cudaMemcpyDefault, stream);
  } else if (dpitch <= maxPitch && spitch <= maxPitch) {
    e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, stream);
  } else {
    for (std::size_t i = 0; i < rows && e == cudaSuccess; ++i)
      e = cudaMemcpyAsync(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width,
                          cudaMemcpyDefault, stream);
  }
  return e == cudaSuccess ? Status::Ok() : failed(what, e);
}

}  // namespace

// Grows the one pinned buffer (the proxy runs one call at a time, so it serves every call) to at
// least `bytes`; from enqueue, enqueueCaptured or placeStaging, without mu_ held (see the header).
// An outgrown buffer is retired, not freed (freeing pinned memory may synchronize the device
// while a caller's stream is held).
Status CudaProxy::growPinned(std::size_t bytes) {
  std::lock_guard<std::mutex> growing(growMu_);
  std::size_t want = 0;
  bool share = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) return Status::InvalidUsage("the communicator was destroyed or aborted");
    if (pinned_->size >= bytes) return Status::Ok();
    want = std::max(bytes, pinned_->size * 2);
    share = shareStaging_;
  }
  auto bigger = std::make_shared<Pinned>();
  void* p = nullptr;
  if (share && mem::allocate(&p, want).ok()) {
    if (cudaHostRegister(p, want, cudaHostRegisterPortable) == cudaSuccess) {
      bigger->shared = true;
    } else {
      cudaGetLastError();  // (not sticky) cudaHostAlloc below, from now on
      (void)mem::release(p);
      p = nullptr;
      share = false;
    }
  }
  if (!p) {
    cudaError_t e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
    if (e != cudaSuccess) return failed("cudaHostAlloc (staging for device buffers)", e);
  }
  bigger->data = static_cast<std::byte*>(p);
  bigger->size = want;
  std::lock_guard<std::mutex> g(mu_);
  shareStaging_ = share;
  if (stopping_) return Status::InvalidUsage("the communicator was destroyed or aborted");  // (bigger is freed)
  retired_.push_back(std::move(pinned_));
  pinned_ = std::move(bigger);
  return Status::Ok();
}

// Points the op's staging at the pinned buffer, grown first if the op needs more (a call that was
// to go through CUDA IPC and was not given pinned memory by enqueue).
Status CudaProxy::placeStaging(Op& op) {
  std::byte* base = nullptr;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (pinned_->size < op.stagingBytes)
      BRAID_LOG(kInfo, kColl, "rank %d: staging a call that was to go through CUDA IPC: allocating %zu bytes of pinned "
                "memory while streams are held", comm_.rank(), op.stagingBytes);
  }
  Status grown = growPinned(op.stagingBytes);
  if (!grown.ok()) return grown;
  {
    std::lock_guard<std::mutex> g(mu_);
    base = pinned_->data;
  }
  if (op.slotBytes) {
    op.slots[0] = base;
    op.slots[1] = base + op.slotBytes;
  }
  op.sendHost = op.recvInSend ? base : base + op.sendOff;
  op.recvHost = op.recvInSend ? base + op.recvOff : base;
  op.host.send = op.dev.send ? op.sendHost : nullptr;
  op.host.recv = op.dev.recv ? op.recvHost : nullptr;
  return Status::Ok();
}

// The staged path, pipelined: the call is cut into pieces (op.pieces, each at least kStagePieceBytes
// of the larger buffer); piece k+1 is copied in on one stream while the host collective of piece k
// runs on this thread, and piece k is copied out on a second stream while piece k+1 runs.
//   all-reduce, broadcast, reduce, send/recv: piece k is elements [off, off+len) of every buffer, in
//     the natural pinned layout (in place stays in place).
//   all-gather, reduce-scatter (in more than one piece): piece k is elements [off, off+len) of every
//     rank's block, gathered into one of two pinned slots as n blocks of len (2-D copies), where the
//     host collective runs in place; a slot is refilled only after its previous piece was copied out.
Status CudaProxy::runStaged(Op& op, const Comm::DeviceCall::RunHost& runHost) {
  if (Status placed = placeStaging(op); !placed.ok()) return placed;
  const CollArgs& a = op.dev;
  const std::size_t n = static_cast<std::size_t>(comm_.nranks()), r = static_cast<std::size_t>(comm_.rank());
  const std::size_t es = dataTypeSize(a.dtype);
  const bool blocks = op.slots[0] != nullptr;
  const bool gather = a.kind == CollKind::kAllGather;
  auto in = static_cast<cudaStream_t>(stream_), out = static_cast<cudaStream_t>(outStream_);
  const cudaEvent_t evIn[2] = {static_cast<cudaEvent_t>(events_[0]), static_cast<cudaEvent_t>(events_[1])};
  const cudaEvent_t evOut[2] = {static_cast<cudaEvent_t>(events_[2]), static_cast<cudaEvent_t>(events_[3])};
  const double wait = comm_.timeoutSec();
  const auto* sendDev = static_cast<const std::byte*>(op.sendDev);
  auto* recvDev = static_cast<std::byte*>(op.recvDev);

  auto copyIn = [&](std::size_t k) -> Status {
    const Range p = split(a.count, op.pieces, k);
    Status s;
    if (!blocks) {
      const std::size_t bytes = op.pieces == 1 ? op.sendBytes : p.len * es;  // one piece: the whole buffer, n blocks or not
      if (op.sendBytes) s = copyRows(op.sendHost + p.off * es, 0, sendDev + p.off * es, 0, bytes, 1, maxPitch_, in, "cudaMemcpyAsync (device to pinned host)");
    } else {
      if (k >= 2) {
        cudaError_t e = cudaStreamWaitEvent(in, evOut[k % 2], 0);  // the slot's last piece is out
        if (e != cudaSuccess) return failed("cudaStreamWaitEvent (staging slot)", e);
      }
      std::byte* slot = op.slots[k % 2];
      if (gather) s = copyRows(slot + r * p.len * es, 0, sendDev + p.off * es, 0, p.len * es, 1, maxPitch_, in, "cudaMemcpyAsync (device to pinned host)");
      else s = copyRows(slot, p.len * es, sendDev + p.off * es, a.count * es, p.len * es, n, maxPitch_, in, "cudaMemcpy2DAsync (device to pinned host)");
    }
    if (!s.ok()) return s;
    cudaError_t e = cudaEventRecord(evIn[k % 2], in);
    return e == cudaSuccess ? Status::Ok() : failed("cudaEventRecord (staging)", e);
  };
  auto copyOut = [&](std::size_t k) -> Status {
    const Range p = split(a.count, op.pieces, k);
    Status s;
    if (!blocks) {
      const std::size_t bytes = op.pieces == 1 ? op.recvBytes : p.len * es;
      if (op.recvBytes) s = copyRows(recvDev + p.off * es, 0, op.recvHost + p.off * es, 0, bytes, 1, maxPitch_, out, "cudaMemcpyAsync (pinned host to device)");
    } else {
      std::byte* slot = op.slots[k % 2];
      if (gather) s = copyRows(recvDev + p.off * es, a.count * es, slot, p.len * es, p.len * es, n, maxPitch_, out, "cudaMemcpy2DAsync (pinned host to device)");
      else s = copyRows(recvDev + p.off * es, 0, slot + r * p.len * es, 0, p.len * es, 1, maxPitch_, out, "cudaMemcpyAsync (pinned host to device)");
    }
    if (!s.ok()) return s;
    cudaError_t e = cudaEventRecord(evOut[k % 2], out);
    return e == cudaSuccess ? Status::Ok() : failed("cudaEventRecord (staging)", e);
  };
  auto pieceArgs = [&](std::size_t k) {
    const Range p = split(a.count, op.pieces, k);
    CollArgs h = op.host;
    h.count = p.len;
    if (!blocks) {
      if (h.send) h.send = static_cast<const std::byte*>(h.send) + p.off * es;
      if (h.recv) h.recv = static_cast<std::byte*>(h.recv) + p.off * es;
    } else {
      std::byte* slot = op.slots[k % 2];
      h.send = gather ? slot + r * p.len * es : slot;
      h.recv = gather ? slot : slot + r * p.len * es;
    }
    return h;
  };

  Status s = copyIn(0);
  for (std::size_t k = 0; s.ok() && k < op.pieces; ++k) {
    if (k + 1 < op.pieces) s = copyIn(k + 1);
    if (s.ok()) s = cuda::waitForEvent(evIn[k % 2], wait, "a staging copy to pinned memory");
    if (s.ok()) s = runHost(pieceArgs(k));
    if (s.ok()) {
      std::lock_guard<std::mutex> g(op.mu);
      if (op.abandoned) s = Status::Timeout("the stream stopped waiting for the result");
    }
    if (s.ok()) s = copyOut(k);
  }
  // Nothing may still write pinned memory or the user's buffers once the call is over.
  Status drained = cuda::waitForStream(in, wait, "the staging copies to pinned memory");
  if (drained.ok()) drained = cuda::waitForStream(out, wait, "the staging copies from pinned memory");
  return s.ok() ? drained : s;
}

// Waits until the caller's stream has reached the call (or the communicator failed), at most
// BRAID_TIMEOUT. A CUDA context that failed (a kernel hit an illegal address, say) never runs host
// functions or completes events, but shows its error on any CUDA call: every slice asks.
Status CudaProxy::waitReady(Op& op) {
  const double wait = comm_.timeoutSec();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
  cuda::PollPause pause;
  for (unsigned polls = 0;; ++polls) {
    if (op.readyEvent) {
      cudaError_t e = cuda::polled(cudaEventQuery(static_cast<cudaEvent_t>(op.readyEvent)));
      if (e == cudaSuccess) {
        op.readyEventDone = true;
        return Status::Ok();
      }
      if (e != cudaErrorNotReady) return failed("cudaEventQuery (waiting for the caller's stream)", e);
    } else {
      std::unique_lock<std::mutex> g(op.mu);
      if (op.ready || op.cv.wait_for(g, std::chrono::milliseconds(50), [&] { return op.ready; })) return Status::Ok();
    }
    if (comm_.failedFast()) return Status::Ok();  // the caller reports the failure
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Timeout("the stream did not reach the call within " + std::to_string(static_cast<long>(wait)) +
                             " s (work queued before it on the stream is still running; raise BRAID_TIMEOUT if it is only slow)");
    if (op.readyEvent) pause();  // (host functions: the wait above was the pause)
    if (op.readyEvent ? polls % 256 == 255 : true) {
      cudaError_t e = cuda::polled(cudaStreamQuery(static_cast<cudaStream_t>(stream_)));
      if (e != cudaSuccess && e != cudaErrorNotReady) return failed("waiting for the caller's stream: the CUDA context failed", e);
    }
  }
}

void CudaProxy::process(Op& op) {
  const std::string what = std::string(collName(op.host.kind)) + " on CUDA buffers (rank " + std::to_string(comm_.rank()) + ")";
  Status ready = waitReady(op);  // (its event goes back to spareEvents_ in loop(), after the call)
  if (!ready.ok()) {
    ready = ready.withContext(what);
    comm_.fail(ready, true);
    op.finish(ready);
    return;
  }
  Status s = comm_.failure();
  if (!s.ok()) {
    op.finish(s.withContext(what + " on a failed communicator"));
    return;
  }
  Comm::DeviceCall call;
  call.stream = stream_;
  call.staged = [&](const Comm::DeviceCall::RunHost& runHost) { return runStaged(op, runHost); };
  s = comm_.runDevice(op.dev, call);
  if (!s.ok()) {
    s = s.withContext(what);
    // A graph's call has no handle to report to: the communicator fails, and its next call says why.
    if (s.code() == Code::kCudaError || s.code() == Code::kTimeout || op.captured) comm_.fail(s, true);
    comm_.setLastError(s);
  }
  op.finish(s);
}

}  // namespace braid
