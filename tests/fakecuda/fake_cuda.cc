// An emulation of the CUDA runtime and driver calls that Braid and its gpu tests make, built as a
// library with the driver's name (libcuda.so.1) so that the gpu-collectives program can run on a
// machine without a GPU. It exists to test Braid's own logic around CUDA (the proxy's stream holds,
// the staged pipeline's pieces and slots, the IPC all-reduce's protocol), not CUDA:
//   - a stream is a thread that runs its operations in order; events and cuStreamWaitValue32 are
//     operations that record or wait; kernels are host functions on the stream (Braid's own code
//     compiled for the CPU, simt.h; the test's, fake_kernels.cc), and loading one (its first launch,
//     or cudaFuncGetAttributes) waits for the whole context as CUDA's lazy loading may;
//   - freeing, unregistering and unmapping memory wait for every stream, as the real calls may; a
//     wait that cannot end (a stream held by work that waits for the caller) aborts after 60 s;
//   - device memory is shared memory (memfd), so an IPC handle is (pid, fd) and opening it maps
//     /proc/PID/fd/FD, as braidMemAlloc's peers do; pinned memory is ordinary memory;
//   - one device, 0, and no peer access.
// Semantics it does not model: the legacy default stream's implicit synchronization with other
// streams (synchronous calls wait for the default stream only), concurrency between copies and
// kernels on one stream, and every error CUDA could return.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---- streams -------------------------------------------------------------------------------------

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  std::uint64_t pushed = 0, done = 0;
  bool capturing = false;  // between cudaStreamBeginCapture and cudaStreamEndCapture: push() records
  std::vector<std::function<void()>> captured;  // the operations recorded, for the graph
  bool stopping = false;
  std::thread thread;

  Stream() { thread = std::thread([this] { loop(); }); }
  // Ends the thread. The object itself is never deleted (cudaStreamDestroy): a synchronization of
  // every stream may still hold its address.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu);
      stopping = true;
      cv.notify_all();
    }
    thread.join();
  }
  void loop() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return !ops.empty() || stopping; });
        if (ops.empty()) return;
        op = std::move(ops.front());
        ops.pop_front();
      }
      op();
      std::lock_guard<std::mutex> g(mu);
      ++done;
      cv.notify_all();
    }
  }
  void push(std::function<void()> op) {
    std::lock_guard<std::mutex> g(mu);
    if (capturing) {  // recorded into the graph, not run
      captured.push_back(std::move(op));
      return;
    }
    ops.push_back(std::move(op));
    ++pushed;
    cv.notify_all();
  }
  bool idle() {
    std::lock_guard<std::mutex> g(mu);
    return done == pushed;
  }
  void sync() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return done == pushed; });
  }
  // Waits until what was queued before the call has run; false if that takes past `deadline`.
  bool syncUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> g(mu);
    const std::uint64_t target = pushed;
    return cv.wait_until(g, deadline, [&] { return done >= target; });
  }
};

std::mutex registryMu;
std::set<Stream*>& streams() {
  static auto* s = new std::set<Stream*>;  // never destroyed: stream threads may outlive static destruction
  return *s;
}

Stream* legacyStream() {
  static Stream* s = [] {
    auto* created = new Stream;
    std::lock_guard<std::mutex> g(registryMu);
    streams().insert(created);
    return created;
  }();
  return s;
}

Stream* streamOf(cudaStream_t s) { return s ? reinterpret_cast<Stream*>(s) : legacyStream(); }

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, completed = 0;  // generations
};

// ---- memory --------------------------------------------------------------------------------------

struct Range {
  std::size_t size;
  int fd;               // memfd (device memory), -1 for pinned host memory and pool memory
  std::uint64_t id;     // CU_POINTER_ATTRIBUTE_BUFFER_ID
  bool device;
  bool imported;        // device: mapped from another process's handle; host: registered, not allocated here
};
std::map<std::uintptr_t, Range>& ranges() {
  static auto* r = new std::map<std::uintptr_t, Range>;
  return *r;
}
std::atomic<std::uint64_t> nextId{1};

// The range that contains p (a copy: another thread may unmap it meanwhile), and its start.
bool find(const void* p, Range* out, std::uintptr_t* base) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().upper_bound(u);
  if (it == ranges().begin()) return false;
  --it;
  if (u >= it->first + it->second.size) return false;
  *out = it->second;
  if (base) *base = it->first;
  return true;
}

struct IpcHandle {  // inside cudaIpcMemHandle_t (64 bytes)
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::int32_t pad;
  std::uint64_t size;
};
constexpr std::uint32_t kIpcMagic = 0x46414b45;  // "FAKE"

thread_local cudaError_t lastError = cudaSuccess;
thread_local bool contextCurrent = false;
thread_local int currentDevice = 0;

cudaError_t fail(cudaError_t e) {
  lastError = e;
  return e;
}
void touch() { contextCurrent = true; }

std::size_t roundToPage(std::size_t n) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return n == 0 ? page : (n + page - 1) / page * page;
}

// Memory no other process can map (no fd): pinned host memory, or pool device memory.
cudaError_t allocatePrivate(void** p, std::size_t size, bool device) {
  touch();
  const std::size_t bytes = roundToPage(size);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(registryMu);
  ranges()[reinterpret_cast<std::uintptr_t>(m)] = Range{bytes, -1, nextId++, device, false};
  *p = m;
  return cudaSuccess;
}

void copy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width, std::size_t rows) {
  for (std::size_t i = 0; i < rows; ++i)
    std::memmove(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch, width);
}

// ---- driver entry points -------------------------------------------------------------------------

constexpr int kCuSuccess = 0, kCuInvalidValue = 1;

int fakeStreamWaitValue32(void* stream, unsigned long long addr, unsigned value, unsigned flags) {
  if (flags != 0) return kCuInvalidValue;  // only GEQ is emulated
  streamOf(static_cast<cudaStream_t>(stream))->push([addr, value] {
    auto* word = reinterpret_cast<unsigned*>(addr);
    while (static_cast<int>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) < 0)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return kCuSuccess;
}

std::atomic<int> ipcOpensToFail{0};  // (fakecudaFailIpcOpens)

// Waits until every stream of this process has run what was queued before the call; false if that
// takes more than `seconds`.
constexpr double kForever = 1e9;  // seconds (about 31 years; still a steady_clock time point)
bool synchronizeWithin(double seconds) {
  std::set<Stream*> all;
  {
    std::lock_guard<std::mutex> g(registryMu);
    all = streams();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(seconds));
  for (Stream* s : all)
    if (!s->syncUntil(deadline)) return false;
  return true;
}

std::mutex loadedMu;
std::set<const void*>& loadedKernels() {
  static auto* k = new std::set<const void*>;
  return *k;
}

// The device-wide synchronization that freeing memory and loading a kernel may need. Where it cannot
// end because the unfinished work waits for the caller (a stream held until this thread says
// "done"), a real GPU hangs for good; here the process aborts after 60 s, naming what waited and
// the rule it broke.
void synchronizeOrAbort(const std::string& what, const char* rule) {
  if (synchronizeWithin(60)) return;
  std::fprintf(stderr, "fakecuda: %s waited 60 s for the device to synchronize: a stream is held by work that waits for "
               "this thread, which hangs on a GPU (%s)\n", what.c_str(), rule);
  std::abort();
}
void synchronizeForFree(const char* call) { synchronizeOrAbort(call, "free memory only while no stream is held"); }

}  // namespace

extern "C" {

// Present only in the emulation: the gpu tests look it up (dlsym) to leave out what only a real GPU
// can hold in reasonable time and memory.
int fakecudaEmulation() { return 1; }

// A test hook of the emulation: the next `n` cudaIpcOpenMemHandle calls of this process fail, as a
// mapping the driver refuses would (the path that ends in "stage it" rather than an error).
void fakecudaFailIpcOpens(int n) { ipcOpensToFail = n; }

// Lazy loading as CUDA does it by default (since 12.2): loading a kernel, at its first launch or when
// cudaFuncGetAttributes asks for it (kernels::gpu::preload), may wait for every stream of the process.
// Where that wait cannot end because the unfinished work waits for the loading thread (a stream held
// until that thread says "done"), a real GPU hangs for good; here the process aborts after 60 s,
// naming `what`. `kernel` is the key: the kernel's address (simt.h launches) or its name's.
void fakecudaLoadKernel(const void* kernel, const char* what) {
  {
    std::lock_guard<std::mutex> g(loadedMu);  // not held while waiting: launching a loaded kernel waits for nothing
    if (loadedKernels().count(kernel)) return;
  }
  synchronizeOrAbort(std::string("loading ") + what,
                     "CUDA loads kernels lazily; load kernels before holding streams: kernels::gpu::preload");
  std::lock_guard<std::mutex> g(loadedMu);
  loadedKernels().insert(kernel);
}

// The driver API (the names Braid looks up with dlsym or cudaGetDriverEntryPointByVersion), with its
// types as plain C types.
int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  Range r{};
  if (!find(reinterpret_cast<const void*>(ptr), &r, nullptr) || attribute != 2) return kCuInvalidValue;  // 2: MEMORY_TYPE
  *static_cast<unsigned*>(data) = r.device ? 2u : 1u;  // CU_MEMORYTYPE_DEVICE / _HOST
  return kCuSuccess;
}

int cuPointerGetAttributes(unsigned count, int* attributes, void** data, unsigned long long ptr) {
  std::uintptr_t base = 0;
  Range r{};
  const bool known = find(reinterpret_cast<const void*>(ptr), &r, &base);
  for (unsigned i = 0; i < count; ++i) {
    switch (attributes[i]) {
      case 7: *static_cast<unsigned long long*>(data[i]) = known ? r.id : 0; break;    // BUFFER_ID
      case 9: *static_cast<int*>(data[i]) = 0; break;                                 // DEVICE_ORDINAL
      case 10: *static_cast<unsigned char*>(data[i]) = known && r.device && !r.imported && r.fd >= 0; break;  // LEGACY_IPC_CAPABLE
      case 11: *static_cast<unsigned long long*>(data[i]) = known ? base : 0; break;   // RANGE_START_ADDR
      default: return kCuInvalidValue;
    }
  }
  return kCuSuccess;
}

int cuCtxGetCurrent(void** ctx) {
  *ctx = contextCurrent ? reinterpret_cast<void*>(0x1) : nullptr;
  return kCuSuccess;
}

int cuCtxGetDevice(int* device) {
  *device = currentDevice;
  return kCuSuccess;
}

// ---- the runtime API -----------------------------------------------------------------------------

cudaError_t cudaGetLastError() {
  cudaError_t e = lastError;
  lastError = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return lastError; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorPeerAccessUnsupported: return "cudaErrorPeerAccessUnsupported";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  touch();
  *device = currentDevice;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  touch();
  currentDevice = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "emulated CUDA device (tests/fakecuda)");
  std::memcpy(prop->uuid.bytes, "fakecuda-device0", 16);
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *value = attr == cudaDevAttrMaxPitch ? (1 << 22) : attr == cudaDevAttrMultiProcessorCount ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned) { return fail(cudaErrorPeerAccessUnsupported); }
cudaError_t cudaDeviceSynchronize() {
  synchronizeWithin(kForever);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  const std::string name = symbol;
  *fn = name == "cuStreamWaitValue32"     ? reinterpret_cast<void*>(&fakeStreamWaitValue32)
        : name == "cuPointerGetAttributes" ? reinterpret_cast<void*>(&cuPointerGetAttributes)
                                           : nullptr;
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// Kernel attributes (kernels::gpu::preload asks for them, which loads the kernel) and handles.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* fn) {
  if (!fn) return fail(cudaErrorInvalidDeviceFunction);
  fakecudaLoadKernel(fn, "a kernel (cudaFuncGetAttributes)");
  std::memset(attr, 0, sizeof(*attr));
  return cudaSuccess;
}
cudaError_t cudaGetFuncBySymbol(cudaFunction_t* f, const void* fn) {
  if (!fn) return fail(cudaErrorInvalidDeviceFunction);
  *f = reinterpret_cast<cudaFunction_t>(const_cast<void*>(fn));
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  touch();
  auto* created = new Stream;
  std::lock_guard<std::mutex> g(registryMu);
  streams().insert(created);
  *s = reinterpret_cast<cudaStream_t>(created);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  Stream* st = streamOf(s);
  st->sync();
  {
    std::lock_guard<std::mutex> g(registryMu);
    streams().erase(st);
  }
  st->stop();  // (not deleted: see Stream::stop)
  return cudaSuccess;
}
// Graph capture: the operations pushed on a capturing stream are recorded, in order, as the graph;
// an instantiated graph is a copy of them, and a launch pushes them on the stream it is given (one
// stream: no branches, which a capture of one stream does not make either).
struct FakeGraph {
  std::vector<std::function<void()>> ops;
};
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  Stream* st = streamOf(s);
  std::lock_guard<std::mutex> g(st->mu);
  if (st->capturing) return fail(cudaErrorIllegalState);
  st->capturing = true;
  st->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  Stream* st = streamOf(s);
  std::lock_guard<std::mutex> g(st->mu);
  if (!st->capturing) return fail(cudaErrorIllegalState);
  st->capturing = false;
  *graph = reinterpret_cast<cudaGraph_t>(new FakeGraph{std::move(st->captured)});
  st->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  Stream* st = streamOf(s);
  std::lock_guard<std::mutex> g(st->mu);
  *status = st->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<FakeGraph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return fail(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(new FakeGraph(*reinterpret_cast<FakeGraph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return fail(cudaErrorInvalidValue);
  for (const auto& op : reinterpret_cast<FakeGraph*>(exec)->ops) streamOf(s)->push(op);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<FakeGraph*>(exec);
  return cudaSuccess;
}
// "Not ready" is kept as the thread's last error, as the real runtime does.
cudaError_t cudaStreamQuery(cudaStream_t s) { return streamOf(s)->idle() ? cudaSuccess : fail(cudaErrorNotReady); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  streamOf(s)->sync();
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  streamOf(s)->push([fn, data] { fn(data); });
  return cudaSuccess;
}

// A cudaEvent_t is a box holding a shared Event: operations still queued keep the Event alive after
// cudaEventDestroy, which CUDA allows while a record is pending.
using EventBox = std::shared_ptr<Event>;
std::shared_ptr<Event> eventOf(cudaEvent_t ev) { return *reinterpret_cast<EventBox*>(ev); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned) {
  *ev = reinterpret_cast<cudaEvent_t>(new EventBox(std::make_shared<Event>()));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  delete reinterpret_cast<EventBox*>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  auto e = eventOf(ev);
  std::uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> g(e->mu);
    gen = ++e->recorded;
  }
  streamOf(s)->push([e, gen] {
    std::lock_guard<std::mutex> g(e->mu);
    if (e->completed < gen) e->completed = gen;
    e->cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  auto e = eventOf(ev);
  std::lock_guard<std::mutex> g(e->mu);
  return e->completed >= e->recorded ? cudaSuccess : fail(cudaErrorNotReady);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned) {
  auto e = eventOf(ev);
  std::uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> g(e->mu);
    gen = e->recorded;  // the most recent record at the time of the call
  }
  streamOf(s)->push([e, gen] {
    std::unique_lock<std::mutex> g(e->mu);
    e->cv.wait(g, [&] { return e->completed >= gen; });
  });
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t size) {
  touch();
  const std::size_t bytes = roundToPage(size);
  const int fd = memfd_create("fakecuda", 0);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> g(registryMu);
  ranges()[reinterpret_cast<std::uintptr_t>(m)] = Range{bytes, fd, nextId++, true, false};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  touch();
  if (!p) return cudaSuccess;  // "create the context"
  synchronizeForFree("cudaFree");  // as CUDA's cudaFree does
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges().end() || !it->second.device || it->second.imported) return fail(cudaErrorInvalidValue);
  munmap(p, it->second.size);
  if (it->second.fd >= 0) close(it->second.fd);
  ranges().erase(it);
  return cudaSuccess;
}
// Stream-ordered allocation from the default pool: device memory that legacy IPC cannot export
// (private memory here, so no other process could map it anyway).
cudaError_t cudaMallocAsync(void** p, std::size_t size, cudaStream_t s) {
  streamOf(s)->sync();
  return allocatePrivate(p, size, true);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  streamOf(s)->sync();
  return cudaFree(p);
}
cudaError_t cudaHostAlloc(void** p, std::size_t size, unsigned) { return allocatePrivate(p, size, false); }
cudaError_t cudaFreeHost(void* p) {
  synchronizeForFree("cudaFreeHost");
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges().end() || it->second.device || it->second.imported) return fail(cudaErrorInvalidValue);
  munmap(p, it->second.size);
  ranges().erase(it);
  return cudaSuccess;
}
// Page-locking existing memory: recorded as pinned host memory (the memory stays the caller's).
cudaError_t cudaHostRegister(void* p, std::size_t size, unsigned) {
  touch();
  std::lock_guard<std::mutex> g(registryMu);
  auto& r = ranges();
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  auto it = r.lower_bound(u);
  if ((it != r.end() && it->first < u + size) || (it != r.begin() && u < std::prev(it)->first + std::prev(it)->second.size))
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  r[u] = Range{size, -1, nextId++, false, true};
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  synchronizeForFree("cudaHostUnregister");
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges().end() || it->second.device || !it->second.imported) return fail(cudaErrorHostMemoryNotRegistered);
  ranges().erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned) {
  *dev = host;
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::memset(attr, 0, sizeof(*attr));
  Range r{};
  const bool known = find(p, &r, nullptr);
  attr->type = !known ? cudaMemoryTypeUnregistered : r.device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t s) {
  streamOf(s)->push([=] { std::memmove(dst, src, n); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                              std::size_t rows, cudaMemcpyKind, cudaStream_t s) {
  int maxPitch = 0;
  cudaDeviceGetAttribute(&maxPitch, cudaDevAttrMaxPitch, 0);
  if (width > dpitch || width > spitch || dpitch > static_cast<std::size_t>(maxPitch) ||
      spitch > static_cast<std::size_t>(maxPitch))
    return fail(cudaErrorInvalidValue);
  streamOf(s)->push([=] { copy2D(dst, dpitch, src, spitch, width, rows); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) {
  legacyStream()->sync();
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, std::size_t n) {
  legacyStream()->sync();
  std::memset(p, value, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t n, cudaStream_t s) {
  streamOf(s)->push([=] { std::memset(p, value, n); });
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges().end() || !it->second.device || it->second.imported || it->second.fd < 0) return fail(cudaErrorInvalidValue);
  IpcHandle h{kIpcMagic, static_cast<std::int32_t>(getpid()), it->second.fd, 0, it->second.size};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &h, sizeof(h));
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned) {
  IpcHandle h{};
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kIpcMagic) return fail(cudaErrorInvalidValue);
  if (h.pid == getpid()) return fail(cudaErrorInvalidResourceHandle);  // CUDA refuses the exporting process too
  for (int left = ipcOpensToFail.load(); left > 0;)
    if (ipcOpensToFail.compare_exchange_weak(left, left - 1)) return fail(cudaErrorMapBufferObjectFailed);
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
  void* m = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> g(registryMu);
  ranges()[reinterpret_cast<std::uintptr_t>(m)] = Range{h.size, fd, nextId++, true, true};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  synchronizeForFree("cudaIpcCloseMemHandle");
  std::lock_guard<std::mutex> g(registryMu);
  auto it = ranges().find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges().end() || !it->second.imported) return fail(cudaErrorInvalidValue);
  munmap(p, it->second.size);
  close(it->second.fd);
  ranges().erase(it);
  return cudaSuccess;
}

}  // extern "C"
