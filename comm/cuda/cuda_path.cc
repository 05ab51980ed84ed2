// Host or device? The API's calls come through here (see cuda_path.h). Memory types come from the
// CUDA driver, found with dlopen(RTLD_NOLOAD): only a process that has already loaded libcuda can
// hold device pointers, so a host-only program never starts CUDA because of Braid, and a build
// without CUDA still recognizes device pointers and refuses them instead of reading them.
#include "comm/cuda/cuda_path.h"

#include <dlfcn.h>
#include <link.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <chrono>
#include <string>

#include "braid_build_config.h"
#include "comm/communicator.h"
#include "base/log.h"
#if BRAID_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/cuda/cuda_proxy.h"
#include "comm/cuda/cuda_util.h"
#endif

namespace braid {
namespace cuda {
namespace {

// The two driver entry points Braid needs, with the driver API's types spelled as plain C types
// (CUresult = int, CUdeviceptr = unsigned long long, CUcontext = void*, CUdevice = int).
using PointerGetAttributeFn = int (*)(void* data, int attribute, unsigned long long ptr);
using CtxGetCurrentFn = int (*)(void** ctx);
using CtxGetDeviceFn = int (*)(int* device);
constexpr int kPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeDevice = 2, kMemoryTypeUnified = 4;  // CU_MEMORYTYPE_*
constexpr int kErrorInvalidValue = 1;                                // CUDA_ERROR_INVALID_VALUE

struct Driver {
  PointerGetAttributeFn pointerGetAttribute = nullptr;
  CtxGetCurrentFn ctxGetCurrent = nullptr;
  CtxGetDeviceFn ctxGetDevice = nullptr;
};

int readLoadCount(struct dl_phdr_info* info, std::size_t size, void* out) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
    *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // the first object is enough: the counter is global
}

// A clock for "at most once a millisecond": the TSC where there is one (a few ns to read; 10^6
// ticks are at most 1 ms at any TSC rate of 1 GHz or more), else steady_clock in nanoseconds.
constexpr std::int64_t kOneMillisecond = 1000000;
#if defined(__x86_64__)
std::int64_t coarseNow() { return static_cast<std::int64_t>(__rdtsc()); }
#else
std::int64_t coarseNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#endif

// Once libcuda is loaded it stays loaded (Braid keeps its own reference), so a positive answer is
// cached. A negative one stays valid until the process loads another shared object: the loader's
// load counter guards it, because dlopen(RTLD_NOLOAD) itself costs ~18 us. Reading the counter
// (dl_iterate_phdr) takes the loader's lock, about a third of a small collective's bookkeeping, so
// it is read at most once a millisecond: a device pointer needs the driver loaded and a context
// created, which takes far longer than that, so a "no driver" seen less than 1 ms ago still holds
// for every pointer that exists now.
const Driver* driver() {
  static std::atomic<const Driver*> cached{nullptr};
  static std::atomic<unsigned long long> checkedAt{~0ull};
  static std::atomic<std::int64_t> validUntilNs{0};  // in coarseNow() units
  if (const Driver* d = cached.load(std::memory_order_acquire)) return d;
  const std::int64_t now = coarseNow();
  if (now < validUntilNs.load(std::memory_order_relaxed)) return nullptr;
  unsigned long long loads = 0;
  dl_iterate_phdr(readLoadCount, &loads);
  if (loads != 0 && checkedAt.load(std::memory_order_relaxed) == loads) {
    validUntilNs.store(now + kOneMillisecond, std::memory_order_relaxed);
    return nullptr;
  }
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    checkedAt.store(loads, std::memory_order_relaxed);
    validUntilNs.store(now + kOneMillisecond, std::memory_order_relaxed);
    return nullptr;
  }
  auto* d = new Driver;  // lives for the process, like the driver itself
  d->pointerGetAttribute = reinterpret_cast<PointerGetAttributeFn>(dlsym(h, "cuPointerGetAttribute"));
  d->ctxGetCurrent = reinterpret_cast<CtxGetCurrentFn>(dlsym(h, "cuCtxGetCurrent"));
  d->ctxGetDevice = reinterpret_cast<CtxGetDeviceFn>(dlsym(h, "cuCtxGetDevice"));
  if (!d->pointerGetAttribute || !d->ctxGetCurrent || !d->ctxGetDevice) {
    delete d;
    dlclose(h);
    return nullptr;
  }
  const Driver* expected = nullptr;
  if (!cached.compare_exchange_strong(expected, d)) {
    delete d;
    dlclose(h);
    return expected;
  }
  return d;
}

#if BRAID_HAVE_CUDA
// One rank alone: the result is the input, copied on the stream (no proxy, no thread).
Status runAlone(Comm& comm, const CollArgs& a, void* stream) {
  if (a.kind == CollKind::kBarrier || a.send == a.recv || !a.send || !a.recv || a.count == 0) return Status::Ok();
  (void)comm;
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  cudaError_t e = cudaMemcpyAsync(a.recv, a.send, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return cuda::failed("cudaMemcpyAsync (single-rank collective)", e);
  return Status::Ok();
}
#endif

// A stream can only be real if the process has loaded the CUDA driver; anything else is a bad
// argument, refused before CUDA is asked about it.
Status checkStream(void* stream) {
  if (stream && !driver())
    return Status::InvalidArgument("a CUDA stream was given, but this process has not initialized CUDA "
                                   "(pass NULL with host buffers)");
  return Status::Ok();
}

// Host calls must not overtake device calls still queued on the proxy: every rank runs calls in
// call order, whatever memory they use.
Status waitForProxy(Comm& comm) {
#if BRAID_HAVE_CUDA
  if (auto p = comm.cudaProxy(false)) return p->drain(3 * comm.timeoutSec() + 60);
#else
  (void)comm;
#endif
  return Status::Ok();
}

Status enqueueDevice(Comm& comm, const CollArgs& a, void* stream, std::shared_ptr<WorkState> work) {
#if BRAID_HAVE_CUDA
  Status f = comm.failure();
  if (!f.ok()) return f.withContext(std::string(collName(a.kind)) + " on a failed communicator");
  if (comm.nranks() == 1) {
    Status s = runAlone(comm, a, stream);
    if (work) work->finish(s);
    return s;
  }
  auto p = comm.cudaProxy(true);
  if (!p) return Status::CudaError("rank " + std::to_string(comm.rank()) + ": the CUDA proxy could not start: " + comm.lastError());
  // A stream being captured into a CUDA graph gets one host-function node that queues the call each
  // time the graph runs it (CudaProxy::enqueueCaptured): the call is made at replay, not now.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone) {
    Status s = p->enqueueCaptured(a, stream);
    if (work) work->finish(s);  // the handle stands for the capture: the replays report through the communicator
    return s;
  }
  return p->enqueue(a, stream, std::move(work));
#else
  (void)comm, (void)a, (void)stream, (void)work;
  return Status::Internal("device path without CUDA");
#endif
}

}  // namespace

namespace {
// memoryOf with the driver already looked up (classify asks once for both buffers).
Memory memoryWith(const Driver* d, const void* p) {
  if (!p) return Memory::kNone;
  if (!d) return Memory::kHost;
  unsigned type = 0;
  const int rc = d->pointerGetAttribute(&type, kPointerAttributeMemoryType, reinterpret_cast<unsigned long long>(p));
  if (rc == 0) return type == kMemoryTypeDevice || type == kMemoryTypeUnified ? Memory::kDevice : Memory::kHost;
  if (rc == kErrorInvalidValue) return Memory::kHost;  // unknown to CUDA: ordinary host memory
#if BRAID_HAVE_CUDA
  // Another answer (e.g. no context current on this thread): ask the runtime, which makes the
  // primary context current first. The driver is loaded, so the program uses CUDA anyway.
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so that it does not surface elsewhere
    return Memory::kHost;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? Memory::kDevice : Memory::kHost;
#else
  return Memory::kHost;
#endif
}
}  // namespace

Memory memoryOf(const void* p) { return p ? memoryWith(driver(), p) : Memory::kNone; }

int chosenDevice() {
  const Driver* d = driver();
  if (!d) return -1;
  void* ctx = nullptr;
  if (d->ctxGetCurrent(&ctx) != 0 || !ctx) return -1;
  int dev = -1;
  if (d->ctxGetDevice(&dev) != 0) return -1;
  return dev;
}

Result<Memory> classify(const Comm& comm, const CollArgs& a) {
  const bool v = a.kind == CollKind::kAllToAllv;  // its count is 0: the arrays say what it moves
  if (a.kind == CollKind::kBarrier || (a.count == 0 && !v)) return Memory::kNone;
  const int me = comm.rank();
  bool needSend = a.kind != CollKind::kSendRecv || a.isSend;
  bool needRecv = a.kind == CollKind::kSendRecv ? !a.isSend : (a.kind != CollKind::kReduce || a.root == me);
  if (a.kind == CollKind::kBroadcast) needSend = a.root == me;
  if (v) {
    auto any = [](const std::vector<std::size_t>& counts) {
      return std::any_of(counts.begin(), counts.end(), [](std::size_t c) { return c > 0; });
    };
    needSend = a.v && any(a.v->sendCounts);
    needRecv = a.v && any(a.v->recvCounts);
  }
  const Driver* d = needSend || needRecv ? driver() : nullptr;
  const Memory s = needSend ? memoryWith(d, a.send) : Memory::kNone;
  const Memory r = needRecv ? memoryWith(d, a.recv) : Memory::kNone;
  if (s != Memory::kNone && r != Memory::kNone && s != r)
    return Status::InvalidArgument(std::string(collName(a.kind)) + ": the send buffer is " +
                                   (s == Memory::kDevice ? "CUDA device" : "host") + " memory but the receive buffer is " +
                                   (r == Memory::kDevice ? "CUDA device" : "host") + " memory; both must be the same kind");
  const Memory m = s != Memory::kNone ? s : r;
  if (m == Memory::kDevice && (a.kind == CollKind::kAllToAll || a.kind == CollKind::kAllToAllv))
    return Status::InvalidArgument(std::string(collName(a.kind)) +
                                   ": CUDA device buffers are not supported for all-to-all yet (host buffers are)");
#if !BRAID_HAVE_CUDA
  if (m == Memory::kDevice)
    return Status::InvalidArgument(std::string(collName(a.kind)) +
                                   ": CUDA device buffers, but this build of Braid has no CUDA support (configure with -Dcuda=enabled)");
#endif
  return m;
}

namespace {
// Every entry point's first steps: the arguments, the stream, and which memory the buffers are.
Result<Memory> admit(Comm& comm, const CollArgs& a, void* stream) {
#if !BRAID_HAVE_CUDA
  if (stream)
    return Status::InvalidArgument("a CUDA stream was given, but this build of Braid has no CUDA support "
                                   "(pass NULL for host buffers, or configure with -Dcuda=enabled)");
#endif
  Status v = comm.validate(a);
  if (v.ok()) v = checkStream(stream);
  if (!v.ok()) return v;
  return classify(comm, a);
}

// Before a call on host buffers runs: device calls queued before it are done, and so is the work
// on the stream passed with it.
Status hostReady(Comm& comm, void* stream) {
  Status s = waitForProxy(comm);
  if (!s.ok()) return s;
#if BRAID_HAVE_CUDA
  if (stream) return cuda::waitForStream(static_cast<cudaStream_t>(stream), comm.timeoutSec(), "the stream passed with host buffers");
#else
  (void)stream;
#endif
  return Status::Ok();
}
}  // namespace

Status run(Comm& comm, const CollArgs& a, void* stream) {
  auto m = admit(comm, a, stream);
  if (!m.ok()) return m.status();
  if (*m == Memory::kDevice) return enqueueDevice(comm, a, stream, nullptr);
  Status s = hostReady(comm, stream);
  return s.ok() ? comm.runBlocking(a) : s;
}

Status admitToGroup(Comm& comm, const CollArgs& a, void* stream) {
  auto m = admit(comm, a, stream);
  if (!m.ok()) return m.status();
  if (*m == Memory::kDevice)
    return Status::InvalidArgument(std::string(collName(a.kind)) +
                                   " between braidGroupStart and braidGroupEnd: CUDA device buffers are not supported in "
                                   "groups yet (host buffers are; outside a group device buffers are)");
  return hostReady(comm, stream);
}

std::shared_ptr<WorkState> submit(Comm& comm, const CollArgs& a, void* stream) {
  auto m = admit(comm, a, stream);
  if (!m.ok()) return WorkState::finished(m.status());
  if (*m == Memory::kDevice) {
    auto w = std::make_shared<WorkState>();
    Status s = enqueueDevice(comm, a, stream, w);
    if (!s.ok()) return WorkState::finished(s);
    return w;
  }
  Status s = hostReady(comm, stream);
  return s.ok() ? comm.submit(a) : WorkState::finished(s);
}

}  // namespace cuda

// Comm's CUDA members live here so that communicator.cc needs no CUDA.
void Comm::noteCudaDevice() { cudaDevice_ = cuda::chosenDevice(); }

std::shared_ptr<CudaProxy> Comm::cudaProxy(bool create) {
  if (!create && !haveCudaProxy_.load(std::memory_order_acquire)) return nullptr;  // every host call asks
  std::lock_guard<std::mutex> g(cudaMu_);
#if BRAID_HAVE_CUDA
  if (cudaProxy_ || !create || closed_) return cudaProxy_;
  int device = cudaDevice_;
  if (device < 0) {
    // Not chosen at creation: LOCAL_RANK modulo the device count when a launcher set it, else the
    // calling thread's current device.
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
      setLastError(Status::CudaError(cuda::failedText("cudaGetDeviceCount", e)));
      return nullptr;
    }
    auto le = readLaunchEnv();
    if (le.ok() && le->localRank >= 0) device = le->localRank % count;
    else if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  }
  auto p = CudaProxy::start(*this, device);
  if (!p.ok()) {
    setLastError(p.status());
    return nullptr;
  }
  cudaProxy_ = *p;
  prepareCudaIpc(device);  // its device allocation happens now, before any stream is held
  haveCudaProxy_.store(true, std::memory_order_release);
  return cudaProxy_;
#else
  (void)create;
  return nullptr;
#endif
}

void Comm::stopCudaProxy(bool abortive) {
#if BRAID_HAVE_CUDA
  std::shared_ptr<CudaProxy> p;
  {
    std::lock_guard<std::mutex> g(cudaMu_);
    p = cudaProxy_;
  }
  if (p) p->stop(abortive);
  releaseCudaIpc();  // the proxy thread is gone: nothing uses the peers' memory any more
  std::lock_guard<std::mutex> g(cudaMu_);
  haveCudaProxy_.store(false, std::memory_order_release);
  cudaProxy_.reset();  // its stream and pinned memory go now, not with the last handle
#else
  (void)abortive;
#endif
}

}  // namespace braid
