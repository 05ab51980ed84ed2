// The CUDA proxy (see cuda_proxy.h for the protocol). Why a blocking host function on the caller's
// stream and not cuStreamWaitValue32: it needs nothing but the runtime API, it works on every device
// and driver the runtime supports, and the stream is released by ordinary host code. Its costs are
// written down in docs/ARCHITECTURE.md ("CUDA buffers"): the host function holds a CUDA callback
// thread for the length of the collective, and a stream waits for the whole call (no overlap of
// the copies with the wire yet).
#include "comm/cuda_proxy.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <string>

#include "comm/communicator.h"
#include "comm/log.h"

namespace braid {
namespace {

Status cudaFailed(const char* call, cudaError_t e) {
  return Status::CudaError(std::string(call) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace

struct CudaProxy::Pinned {
  std::byte* data = nullptr;
  std::size_t size = 0;
  ~Pinned() {
    if (data) cudaFreeHost(data);
  }
};

struct CudaProxy::Op {
  CollArgs host{};          // the call, pointing into pinned memory
  const void* sendDev = nullptr;
  void* recvDev = nullptr;
  std::byte* sendHost = nullptr;  // where sendDev's bytes go (may lie inside recvHost's range)
  std::byte* recvHost = nullptr;
  std::size_t sendBytes = 0, recvBytes = 0;  // 0: nothing to copy that way
  // No reference to the pinned buffer: the op may outlive its call inside the host function, and the
  // last reference must never be dropped there (freeing pinned memory is a CUDA call). The proxy keeps
  // every buffer an op may use alive until it is idle.
  std::shared_ptr<WorkState> work;
  double holdSec = 0;  // how long the host function may hold the stream

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
  int previous = 0;
  cudaError_t e = cudaGetDevice(&previous);
  if (e != cudaSuccess) return cudaFailed("cudaGetDevice", e);
  if ((e = cudaSetDevice(device)) != cudaSuccess) return cudaFailed("cudaSetDevice", e);
  cudaStream_t s = nullptr;
  e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaSetDevice(previous);
  if (e != cudaSuccess) return cudaFailed("cudaStreamCreateWithFlags", e);
  p->stream_ = s;
  p->pinned_ = std::make_shared<Pinned>();
  p->thread_ = std::thread([raw = p.get()] { raw->loop(); });
  BRAID_LOG(kInfo, kInit, "rank %d: CUDA proxy started on device %d", comm.rank(), device);
  return p;
}

CudaProxy::~CudaProxy() {
  stop(true);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status CudaProxy::enqueue(const CollArgs& a, void* stream, std::shared_ptr<WorkState> work) {
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
  op->work = std::move(work);
  op->host = a;
  op->holdSec = 3 * comm_.timeoutSec() + 60;  // the proxy gives up after ~2 timeouts; this is the backstop
  const auto* s = static_cast<const std::byte*>(a.send);
  auto* r = static_cast<std::byte*>(a.recv);
  // The pinned layout keeps in-place calls in place: a send range inside the recv range (all-gather,
  // all-reduce with send == recv) or a recv range inside the send range (reduce-scatter) keeps its offset.
  std::size_t total = 0, sendOff = 0, recvOff = 0;
  if (needSend && needRecv && s >= r && s + sendBytes <= r + recvBytes) {
    total = recvBytes;
    sendOff = static_cast<std::size_t>(s - r);
  } else if (needSend && needRecv && r >= s && r + recvBytes <= s + sendBytes) {
    total = sendBytes;
    recvOff = static_cast<std::size_t>(r - s);
  } else {
    recvOff = 0;
    sendOff = needRecv ? (recvBytes + 255) / 256 * 256 : 0;
    total = sendOff + (needSend ? sendBytes : 0);
  }

  std::unique_lock<std::mutex> g(mu_);
  if (stopping_) return Status::InvalidUsage("the communicator was destroyed or aborted");
  if (!busy_ && queue_.empty()) retired_.clear();  // no stream is held: outgrown buffers may go now
  if (pinned_->size < total) {
    auto bigger = std::make_shared<Pinned>();
    std::size_t want = std::max(total, pinned_->size * 2);
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
    if (e != cudaSuccess) return cudaFailed("cudaHostAlloc (staging for device buffers)", e);
    bigger->data = static_cast<std::byte*>(p);
    bigger->size = want;
    retired_.push_back(std::move(pinned_));
    pinned_ = std::move(bigger);
  }
  std::byte* base = pinned_->data;
  const bool recvInSend = needSend && needRecv && r >= s && r + recvBytes <= s + sendBytes && !(s >= r && s + sendBytes <= r + recvBytes);
  if (recvInSend) {
    op->sendHost = base;
    op->recvHost = base + recvOff;
  } else {
    op->recvHost = base;
    op->sendHost = base + sendOff;
  }
  op->sendDev = needSend ? a.send : nullptr;
  op->recvDev = needRecv ? a.recv : nullptr;
  op->sendBytes = needSend ? sendBytes : 0;
  op->recvBytes = needRecv ? recvBytes : 0;
  op->host.send = a.send ? op->sendHost : nullptr;
  op->host.recv = a.recv ? op->recvHost : nullptr;

  auto* holder = new std::shared_ptr<Op>(op);
  cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), releaseWhenDone, holder);
  if (e != cudaSuccess) {
    delete holder;
    return cudaFailed("cudaLaunchHostFunc (ordering the call with the stream)", e);
  }
  queue_.push_back(op);
  cv_.notify_all();
  return Status::Ok();
}

Status CudaProxy::drain(double seconds) {
  std::unique_lock<std::mutex> g(mu_);
  if (!cv_.wait_for(g, std::chrono::duration<double>(seconds), [&] { return queue_.empty() && !busy_; }))
    return Status::Timeout("calls on CUDA streams did not finish within " + std::to_string(static_cast<long>(seconds)) +
                           " s (a stream blocked before a Braid call?)");
  return Status::Ok();
}

void CudaProxy::stop(bool abortive) {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    abortive_ = abortive_ || abortive;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> g(mu_);
  for (auto& op : queue_) op->finish(Status::Aborted("the communicator was destroyed or aborted before this call ran"));
  queue_.clear();
}

void CudaProxy::loop() {
  if (cudaSetDevice(device_) != cudaSuccess) {
    // Every call will fail in stage() with the error named.
  }
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
    cv_.notify_all();
  }
}

Status CudaProxy::stage(Op& op, bool in) {
  auto s = static_cast<cudaStream_t>(stream_);
  cudaError_t e = cudaSuccess;
  if (in && op.sendBytes) e = cudaMemcpyAsync(op.sendHost, op.sendDev, op.sendBytes, cudaMemcpyDefault, s);
  if (!in && op.recvBytes) e = cudaMemcpyAsync(op.recvDev, op.recvHost, op.recvBytes, cudaMemcpyDefault, s);
  if (e != cudaSuccess) return cudaFailed(in ? "cudaMemcpyAsync (device to pinned host)" : "cudaMemcpyAsync (pinned host to device)", e);
  // Bounded wait: copies finish, but a wedged device must not hang the proxy.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(comm_.timeoutSec());
  for (;;) {
    e = cudaStreamQuery(s);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return cudaFailed("cudaStreamQuery (staging copy)", e);
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Timeout("a staging copy did not finish within BRAID_TIMEOUT");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void CudaProxy::process(Op& op) {
  const std::string what = std::string(collName(op.host.kind)) + " on CUDA buffers (rank " + std::to_string(comm_.rank()) + ")";
  {
    // Waits for the stream to reach the call, in slices: a CUDA context that failed (a kernel hit an
    // illegal address, say) never runs host functions, but shows its error on any CUDA call.
    const double wait = comm_.timeoutSec();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
    Status s;
    std::unique_lock<std::mutex> g(op.mu);
    while (!op.ready && !comm_.failedFast()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        s = Status::Timeout(what + ": the stream did not reach the call within " + std::to_string(static_cast<long>(wait)) +
                            " s (work queued before it on the stream is still running; raise BRAID_TIMEOUT if it is only slow)");
        break;
      }
      op.cv.wait_for(g, std::chrono::milliseconds(100));
      g.unlock();
      cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream_));
      g.lock();
      if (e != cudaSuccess && e != cudaErrorNotReady) {
        s = cudaFailed("waiting for the caller's stream: the CUDA context failed", e);
        break;
      }
    }
    if (!s.ok()) {
      g.unlock();
      s = s.withContext(what);
      comm_.fail(s, true);
      op.finish(s);
      return;
    }
  }
  Status s = comm_.failure();
  if (!s.ok()) {
    op.finish(s.withContext(what + " on a failed communicator"));
    return;
  }
  s = stage(op, true);
  if (s.ok()) s = comm_.runBlocking(op.host);
  if (s.ok()) {
    std::lock_guard<std::mutex> g(op.mu);
    if (op.abandoned) s = Status::Timeout(what + ": the stream stopped waiting for the result");
  }
  if (s.ok()) s = stage(op, false);
  if (!s.ok()) {
    s = s.withContext(what);
    if (s.code() == Code::kCudaError || s.code() == Code::kTimeout) comm_.fail(s, true);
    comm_.setLastError(s);
  }
  op.finish(s);
}

}  // namespace braid
