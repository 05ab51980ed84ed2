// Collectives on CUDA device buffers between ranks of one host, through CUDA IPC: kernels and copies
// read the peers' memory directly (cudaIpcOpenMemHandle). Synchronization is host barriers between kernels,
// never flags that kernels spin on (ranks sharing a GPU run in time-sliced contexts).
//
// Setup, once, at the first such call: every rank allocates a scratch buffer of two one-shot slots,
// exports it and opens every peer's (the opening is the test of "can this rank map that one's
// memory"); the ranks then agree whether all of that worked, or use the staged path from then on.
//
// All-reduce up to kOneShotMaxBytes, "one-shot", through the scratch slots:
//   1. copy the input into this rank's slot (the slots alternate between calls)
//   2. barrier                                      (every slot is filled)
//   3. fold all n slots, in rank order (the same bits on every rank), into the receive buffer
// No barrier at the end: a rank refills a slot two calls later, after the next call's barrier,
// which every rank reaches only after finishing this call's fold.
//
// Larger all-reduces, on the user's buffers (exported and mapped per allocation, cached):
//   1. exchange buffer descriptors                  (also the entry barrier: every input is ready)
//   2. rank r folds block r of all n send buffers and writes it into block r of every receive buffer
//      (up to 8 ranks: each rank's input read once, its output written once, the least traffic);
//      beyond 8 ranks into its own receive buffer, then a barrier, then every rank copies the other
//      blocks from their ranks ("two-shot")
//   3. barrier                                      (nobody reads anyone's buffers any more)
// All-gather, reduce-scatter, broadcast and reduce take the same steps with their own step 2.
// A buffer some rank cannot export (memory from cudaMallocAsync pools or cuMemCreate) or that lives
// on another GPU than the communicator's makes every rank stage that call, decided alike from the
// exchanged descriptors.
//
// Send/recv from BRAID_BUFFSIZE up, every rank on shm (Comm::cudaIpcOffers; a smaller send may
// complete before its receive, through the ring, and stays staged), between the two ranks only:
//   1. the sender offers its buffer: a descriptor, on channel 0 where the data would have gone
//   2. the receiver maps it, copies it into its receive buffer and waits for the copy, or cannot
//   3. the receiver answers "copied" or "stage it" in the sender's shm mailbox word; on "stage it"
//      both stage the call (an offer of a buffer that cannot be shared gets no answer: both stage)
// The answer stays out of the rings: they are FIFO, and whatever the receiver sent the sender
// before this receive (an eager send, the messages of a collective that it could finish alone, as
// a reduce's leaf does) may still wait there unread. A rank has one offer out at a time, so the
// word names the call (per-pair sequence number) and the answering rank.
//
// Every kernel and copy runs on the CUDA proxy's stream and is waited for (bounded) before the next
// barrier, so a barrier always means "my part is in memory". The barriers and the exchange are small
// plans on the ordinary channels: they carry the call's fingerprint, so mismatched calls are still
// caught, and a rank that dies is still noticed.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "comm/cuda/cuda_util.h"
#include "base/log.h"
#include "kernels/reduce_cuda.h"
#include "transport/mailbox.h"

namespace braid {

namespace {

// At or below this many bytes every rank reduces the whole buffer itself (one kernel, one barrier
// fewer); above it, each rank reduces 1/n and copies the rest. A first guess, to be measured on a GPU.
constexpr std::size_t kOneShotMaxBytes = 256 << 10;
// Peers' allocations kept mapped per communicator; beyond this many, all are closed when the proxy is
// next idle (Comm::trimCudaIpc).
constexpr std::size_t kMaxMapped = 64;

// cuPointerGetAttributes, with the driver API's types as plain C types.
using PointerGetAttributesFn = int (*)(unsigned count, int* attributes, void** data, unsigned long long ptr);
constexpr int kAttrBufferId = 7;        // CU_POINTER_ATTRIBUTE_BUFFER_ID (unique per allocation)
constexpr int kAttrDeviceOrdinal = 9;   // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttrIpcCapable = 10;     // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kAttrRangeStart = 11;     // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR

// Round 1 of the agreement: who each rank is, and its scratch.
struct RankInfo {
  std::uint64_t process;  // processToken(): equal only for threads of one process
  std::int32_t ready;     // the driver entry point was found and the scratch exported
  std::int32_t pad;
  unsigned char uuid[16];  // the GPU
  std::uint64_t scratchPointer;  // for threads of the same process
  cudaIpcMemHandle_t scratch;    // for other processes
};

// Equal only for threads of one process: random per process image (ranks in different PID
// namespaces may have equal pids) and mixed with the pid at each use (a child forked after the token
// was drawn shares it, not its pid).
std::uint64_t processToken() {
  static const std::uint64_t random = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return random ^ (static_cast<std::uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull);
}

// One buffer of one call, as the other ranks need it.
struct BufferDesc {
  std::uint64_t id = 0;      // the allocation (CU_POINTER_ATTRIBUTE_BUFFER_ID)
  std::uint64_t offset = 0;  // of the buffer in its allocation
  std::uint64_t pointer = 0; // as this process sees it (for ranks that are threads of one process)
  cudaIpcMemHandle_t handle{};
};
struct CallDesc {
  std::int32_t ok = 0;  // both buffers can be shared
  std::int32_t pad = 0;
  BufferDesc send, recv;
};

// Send/recv: the sender's offer (on channel 0) and the receiver's answer (in the sender's shm
// mailbox word: the call's per-pair sequence number, the answering rank, copied or not).
struct Offer {
  std::int32_t ok = 0;  // the send buffer can be shared
  std::int32_t pad = 0;
  std::uint64_t process = 0;  // the sender's processToken()
  BufferDesc buffer;
};
std::uint64_t answerWord(std::uint64_t seq, int from, bool copied) {
  return seq << 32 | static_cast<std::uint64_t>(static_cast<std::uint32_t>(from)) << 1 | (copied ? 1u : 0u);
}

}  // namespace

struct CudaIpc {
  bool agreed = false;  // the first call's agreement ran
  int device = -1;      // the communicator's GPU (the proxy's)
  PointerGetAttributesFn pointerGetAttributes = nullptr;
  std::vector<std::uint64_t> processes;  // by rank: processToken()
  // Two one-shot slots of kOneShotMaxBytes that the peers read, and a third for a one-shot result
  // whose receive buffer is on another GPU; allocated by Comm::prepareCudaIpc before any stream is
  // held (a device allocation may synchronize with other streams).
  void* scratch = nullptr;
  // Every rank can map every other rank's device memory (written once by the agreement on the proxy
  // thread; read there and by CudaProxy::enqueue on the callers' threads).
  std::atomic<bool> usable{false};
  bool trimWanted = false;               // more than kMaxMapped peers' allocations are open
  bool closeWanted = false;              // the agreement said no: every peer's scratch is to be unmapped
  std::vector<std::byte*> peerScratch;   // by rank, as this process sees it
  std::uint64_t oneShotCalls = 0;        // which slot is next
  std::map<std::uint64_t, cudaIpcMemHandle_t> exported;   // this rank's allocations, by id
  std::map<std::pair<int, std::uint64_t>, void*> mapped;  // (peer, allocation id) -> base here

  ~CudaIpc() {
    cuda::DeviceScope on(device);  // mappings and scratch belong to the communicator's device
    closeAll();
    if (scratch) cudaFree(scratch);
  }
  bool sameProcess(std::size_t a, std::size_t b) const { return processes[a] == processes[b]; }
  void closeMapped() {
    for (auto& [key, base] : mapped) cudaIpcCloseMemHandle(base);
    mapped.clear();
  }
  // Unmaps every peer's memory (Comm::releaseCudaIpc, before destroy's farewell: once every rank
  // has said farewell, nobody maps anybody's scratch and it may be freed).
  void closeAll() {
    closeMapped();
    for (std::size_t q = 0; q < peerScratch.size(); ++q)
      if (peerScratch[q] && !sameProcess(q, static_cast<std::size_t>(self))) cudaIpcCloseMemHandle(peerScratch[q]);
    peerScratch.clear();
  }
  int self = 0;

  // Looks up cuPointerGetAttributes (describe and onDevice need it); false if the driver lacks it.
  bool loadDriver() {
    if (pointerGetAttributes) return true;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !fn) {
      cudaGetLastError();
      return false;
    }
    pointerGetAttributes = reinterpret_cast<PointerGetAttributesFn>(fn);
    return true;
  }

  // Fills `d` for the buffer at `p`; false if its memory cannot be shared through legacy IPC or lives
  // on another GPU than the communicator's.
  bool describe(const void* p, BufferDesc* d) {
    d->pointer = reinterpret_cast<std::uint64_t>(p);
    // Each attribute writes at most 8 bytes; zeroed 8-byte words read right whatever the width.
    unsigned long long id = 0, capable = 0, start = 0, ordinal = 0;
    int attrs[4] = {kAttrBufferId, kAttrIpcCapable, kAttrRangeStart, kAttrDeviceOrdinal};
    void* data[4] = {&id, &capable, &start, &ordinal};
    if (pointerGetAttributes(4, attrs, data, reinterpret_cast<unsigned long long>(p)) != 0 || !capable || !start ||
        static_cast<int>(ordinal & 0xffffffffu) != device)
      return false;
    d->id = id;
    d->offset = reinterpret_cast<std::uint64_t>(p) - start;
    auto it = exported.find(id);
    if (it == exported.end()) {
      cudaIpcMemHandle_t h{};
      if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(start)) != cudaSuccess) {
        cudaGetLastError();  // not sticky; clear it so that no later call reports it
        return false;
      }
      if (exported.size() >= 4096) exported.clear();  // ids are never reused: old ones are only stale
      it = exported.emplace(id, h).first;
    }
    d->handle = it->second;
    return true;
  }

  // Whether `p` is memory of the communicator's GPU (a fold kernel may write it directly).
  bool onDevice(const void* p) const {
    unsigned long long ordinal = 0;
    int attr = kAttrDeviceOrdinal;
    void* data = &ordinal;
    return pointerGetAttributes(1, &attr, &data, reinterpret_cast<unsigned long long>(p)) == 0 &&
           static_cast<int>(ordinal & 0xffffffffu) == device;
  }

  // Where `peer`'s buffer `d` is in this process (`local`: the peer is a thread of this process).
  Result<std::byte*> map(int peer, const BufferDesc& d, bool local) {
    if (local) return reinterpret_cast<std::byte*>(d.pointer);  // the same address space
    auto key = std::make_pair(peer, d.id);
    auto it = mapped.find(key);
    if (it == mapped.end()) {
      void* base = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&base, d.handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        return cuda::failed(("cudaIpcOpenMemHandle (rank " + std::to_string(peer) + "'s buffer)").c_str(), e);
      it = mapped.emplace(key, base).first;
    }
    return static_cast<std::byte*>(it->second) + d.offset;
  }
};

namespace {

// Whether this process can use the memory of `peer`, another thread of this process: on the same
// GPU, or on another one with peer access (enabled here). Other processes are tried by opening their
// scratch instead.
bool threadCanReach(const RankInfo& self, const RankInfo& peer, int device) {
  if (std::memcmp(self.uuid, peer.uuid, sizeof(self.uuid)) == 0) return true;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return false;
  for (int j = 0; j < count; ++j) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, j) != cudaSuccess) continue;
    if (std::memcmp(prop.uuid.bytes, peer.uuid, sizeof(peer.uuid)) != 0) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, j) != cudaSuccess || !can) return false;
    cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
    cudaGetLastError();  // "already enabled" is an error that must not linger
    return e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
  }
  return false;
}

}  // namespace

void Comm::releaseCudaIpc() {
  if (!cudaIpc_) return;
  cuda::DeviceScope on(cudaIpc_->device);
  cudaIpc_->closeAll();
}

void Comm::prepareCudaIpc(int device) {
  if (cudaIpc_ || !config_.cudaIpc || nranks_ < 2 || !oneHost_) return;
  auto ipc = std::make_shared<CudaIpc>();
  ipc->device = device;
  {
    cuda::DeviceScope on(device);
    if (cudaMalloc(&ipc->scratch, 3 * kOneShotMaxBytes) != cudaSuccess) {
      ipc->scratch = nullptr;  // the first call's agreement then turns IPC off, on every rank
      cudaGetLastError();
    }
  }
  cudaIpc_ = std::move(ipc);
}

bool Comm::cudaIpcTakes(const CollArgs& a) const {
  return cudaIpc_ && cudaIpc_->usable.load(std::memory_order_acquire) && cudaIpcApplies(a.kind);
}

void Comm::trimCudaIpc() {
  if (!cudaIpc_) return;
  if (cudaIpc_->closeWanted) {
    cudaIpc_->closeAll();
    cudaIpc_->closeWanted = false;
  } else if (cudaIpc_->trimWanted) {
    cudaIpc_->closeMapped();
  }
  cudaIpc_->trimWanted = false;
}

Result<bool> Comm::cudaIpcCollective(const CollArgs& a, const Fingerprint& fp, void* streamArg) {
  auto stream = static_cast<cudaStream_t>(streamArg);
  const std::size_t n = static_cast<std::size_t>(nranks_), r = static_cast<std::size_t>(rank_);
  // prepareCudaIpc made it when the proxy started, under the same conditions that lead here; an
  // empty one (no scratch) still takes part in the agreement, which then says no on every rank.
  if (!cudaIpc_) cudaIpc_ = std::make_shared<CudaIpc>();
  CudaIpc& ipc = *cudaIpc_;

  if (!ipc.agreed) {
    // The first call: can every rank map every other's memory? Two small rounds, once.
    ipc.agreed = true;
    ipc.self = rank_;
    RankInfo self{};
    self.process = processToken();
    cudaDeviceProp prop{};
    if (ipc.scratch && cudaGetDeviceProperties(&prop, ipc.device) == cudaSuccess && ipc.loadDriver() &&
        cudaIpcGetMemHandle(&self.scratch, ipc.scratch) == cudaSuccess) {
      self.ready = 1;
      self.scratchPointer = reinterpret_cast<std::uint64_t>(ipc.scratch);
      std::memcpy(self.uuid, prop.uuid.bytes, sizeof(self.uuid));
    }
    cudaGetLastError();  // whatever failed above only turns IPC off
    std::vector<RankInfo> infos(n);
    Status s = allGatherSmall(&self, infos.data(), sizeof(RankInfo), fp);
    if (!s.ok()) return s;
    for (const RankInfo& i : infos) ipc.processes.push_back(i.process);
    // Open every peer's scratch: the test that its memory can be mapped here at all.
    std::int32_t ok = self.ready;
    ipc.peerScratch.assign(n, nullptr);
    for (std::size_t q = 0; q < n && ok; ++q) {
      if (!infos[q].ready) {
        ok = 0;
      } else if (q == r) {
        ipc.peerScratch[q] = static_cast<std::byte*>(ipc.scratch);
      } else if (infos[q].process == self.process) {
        // Another thread of this process: its scratch address is valid here as it is.
        ok = threadCanReach(self, infos[q], ipc.device);
        ipc.peerScratch[q] = reinterpret_cast<std::byte*>(infos[q].scratchPointer);
      } else {
        void* theirs = nullptr;
        cudaError_t e = cudaIpcOpenMemHandle(&theirs, infos[q].scratch, cudaIpcMemLazyEnablePeerAccess);
        if (e == cudaSuccess) ipc.peerScratch[q] = static_cast<std::byte*>(theirs);
        else ok = 0;
      }
    }
    cudaGetLastError();
    std::vector<std::int32_t> oks(n);
    s = allGatherSmall(&ok, oks.data(), sizeof(ok), fp);
    if (!s.ok()) return s;
    const bool usable = std::all_of(oks.begin(), oks.end(), [](std::int32_t v) { return v != 0; });
    ipc.usable.store(usable, std::memory_order_release);
    // The scratch this rank did map is unmapped when the proxy is next idle (trimCudaIpc), not now:
    // unmapping may synchronize the device, and the caller's stream is held until this call is done.
    if (!usable) ipc.closeWanted = true;
    BRAID_LOG(kInfo, kInit, "rank %d: CUDA IPC between the ranks' device buffers: %s", rank_,
              usable ? "on" : "off (some rank cannot map another's GPU memory; device calls are staged through host memory)");
  }
  if (!ipc.usable.load(std::memory_order_relaxed)) return false;  // (this thread wrote it)

  const std::size_t es = dataTypeSize(a.dtype), bytes = a.count * es;
  const double wait = config_.timeoutSec;
  const bool allReduce = a.kind == CollKind::kAllReduce;
  const bool oneShot = allReduce && bytes <= kOneShotMaxBytes;
  BRAID_LOG(kInfo, kTune, "%s #%llu: CUDA IPC%s", fp.describe().c_str(), static_cast<unsigned long long>(fp.seq),
            !allReduce ? "" : oneShot ? " one-shot" : " two-shot");
  // Rank order where the fold allows it, so that the result's bits (NaN payloads included) do not
  // depend on which rank folded an element. Beyond kMaxFoldSources ranks the fold starts with `first`,
  // the rank whose send buffer may be the destination (in place), which must be among the first 8.
  const auto order = [&](std::size_t k, std::size_t first) { return n <= kernels::gpu::kMaxFoldSources ? k : (first + k) % n; };
  // Folds the n sources source(q), with kAvg's division, into each of `dsts`, and waits for it.
  const auto fold = [&](std::vector<void*> dsts, std::size_t count, std::size_t first, auto source) -> Status {
    if (!count) return Status::Ok();
    std::vector<const void*> srcs(n);
    for (std::size_t k = 0; k < n; ++k) srcs[k] = source(order(k, first));
    const int divisor = a.op == ReduceOp::kAvg ? nranks_ : 0;
    Status st = kernels::gpu::reduceMany(dsts.data(), static_cast<int>(dsts.size()), srcs.data(), static_cast<int>(n),
                                         count, a.dtype, a.op, divisor, stream);
    if (st.ok()) st = cuda::waitForStream(stream, wait, "the fold of the ranks' buffers");
    return st;
  };
  const auto copy = [&](void* dst, const void* src, std::size_t n2, const char* what) -> Status {
    if (!n2 || dst == src) return Status::Ok();
    cudaError_t e = cudaMemcpyAsync(dst, src, n2, cudaMemcpyDeviceToDevice, stream);
    return e == cudaSuccess ? Status::Ok() : cuda::failed(what, e);
  };

  if (oneShot) {
    const std::size_t slot = (ipc.oneShotCalls++ % 2) * kOneShotMaxBytes;
    Status s = copy(ipc.peerScratch[r] + slot, a.send, bytes, "cudaMemcpyAsync (one-shot input into the scratch slot)");
    if (s.ok()) s = cuda::waitForStream(stream, wait, "the one-shot input copy");
    if (s.ok()) s = barrier(fp);
    // Every rank folds in rank order (n <= 8 or not: the slots are never the destination).
    // A receive buffer on another GPU is not written by the kernel: the third region, then a copy.
    const bool direct = ipc.onDevice(a.recv);
    void* result = direct ? a.recv : ipc.peerScratch[r] + 2 * kOneShotMaxBytes;
    if (s.ok()) s = fold({result}, a.count, 0, [&](std::size_t q) { return ipc.peerScratch[q] + slot; });
    if (s.ok() && !direct) s = copy(a.recv, result, bytes, "cudaMemcpyAsync (one-shot result to another GPU)");
    if (s.ok() && !direct) s = cuda::waitForStream(stream, wait, "the one-shot result copy");
    if (!s.ok()) return s;
    return true;
  }

  // The buffers the peers read: every send buffer (broadcast: the root's only), and for all-reduce
  // the receive buffers too.
  const auto sendShared = [&](std::size_t q) { return a.kind != CollKind::kBroadcast || static_cast<int>(q) == a.root; };
  CallDesc mine;
  // A fold kernel writes the receive buffer of reduce-scatter and of reduce's root directly: it must
  // be on this GPU (copies, as in all-gather and broadcast, reach any GPU).
  const bool foldsIntoRecv = a.kind == CollKind::kReduceScatter || (a.kind == CollKind::kReduce && rank_ == a.root);
  mine.ok = (!sendShared(r) || ipc.describe(a.send, &mine.send)) && (!allReduce || ipc.describe(a.recv, &mine.recv)) &&
            (!foldsIntoRecv || ipc.onDevice(a.recv));
  std::vector<CallDesc> all(n);
  Status s = allGatherSmall(&mine, all.data(), sizeof(CallDesc), fp);
  if (!s.ok()) return s;
  for (const CallDesc& d : all)
    if (!d.ok) return false;  // everyone sees the same descriptors: everyone stages this call

  // Only what this rank reads is mapped: rooted collectives read only on the root (reduce) or only
  // the root's buffer (broadcast).
  const auto reads = [&](std::size_t q, bool send) {
    if (!send) return allReduce;
    if (a.kind == CollKind::kBroadcast) return static_cast<int>(q) == a.root;
    if (a.kind == CollKind::kReduce) return rank_ == a.root;
    return true;
  };
  std::vector<const std::byte*> sends;
  std::vector<std::byte*> recvs;
  s = peerBuffers(a, [&](int q, bool send) -> Result<std::byte*> {
    if (!reads(static_cast<std::size_t>(q), send)) return static_cast<std::byte*>(nullptr);
    return ipc.map(q, send ? all[q].send : all[q].recv, ipc.sameProcess(static_cast<std::size_t>(q), r));
  }, sends, recvs);
  if (!s.ok()) return s;

  switch (a.kind) {
    case CollKind::kAllGather:  // block q of the receive buffer is rank q's send buffer
      for (std::size_t q = 0; q < n && s.ok(); ++q)
        s = copy(static_cast<std::byte*>(a.recv) + q * bytes, sends[q], bytes, "cudaMemcpyAsync (all-gather block)");
      if (s.ok()) s = cuda::waitForStream(stream, wait, "the all-gather copies");
      break;
    case CollKind::kBroadcast:
      s = copy(a.recv, sends[static_cast<std::size_t>(a.root)], bytes, "cudaMemcpyAsync (broadcast from the root's buffer)");
      if (s.ok()) s = cuda::waitForStream(stream, wait, "the broadcast copy");
      break;
    case CollKind::kReduceScatter:  // block r of every send buffer, folded into the receive buffer
      s = fold({a.recv}, a.count, r, [&](std::size_t q) { return sends[q] + r * bytes; });
      break;
    case CollKind::kReduce:
      if (rank_ == a.root) s = fold({a.recv}, a.count, r, [&](std::size_t q) { return sends[q]; });
      break;
    default: {  // all-reduce: rank r folds block r of every send buffer
      const Range blk = split(a.count, n, r);
      const auto block = [&](std::size_t q) { return sends[q] + blk.off * es; };
      if (n <= static_cast<std::size_t>(kernels::gpu::kMaxFoldSources)) {
        // ... and writes it into block r of every receive buffer: each rank's input is read once and
        // its output written once, the least memory traffic there is.
        std::vector<void*> dsts(n);
        for (std::size_t q = 0; q < n; ++q) dsts[q] = recvs[q] + blk.off * es;
        s = fold(dsts, blk.len, r, block);
        break;
      }
      // Beyond 8 ranks, into its own receive buffer; then every rank copies the other blocks.
      s = fold({recvs[r] + blk.off * es}, blk.len, r, block);
      if (s.ok()) s = barrier(fp);  // every block is final
      for (std::size_t q = 0; q < n && s.ok(); ++q) {
        const Range b = split(a.count, n, q);
        if (q != r) s = copy(recvs[r] + b.off * es, recvs[q] + b.off * es, b.len * es, "cudaMemcpyAsync (all-reduce block)");
      }
      if (s.ok()) s = cuda::waitForStream(stream, wait, "the two-shot block copies");
    }
  }
  // Closing mappings may synchronize the device, so it waits for a moment when no stream is held
  // (Comm::trimCudaIpc, called by the proxy when it is idle).
  ipc.trimWanted = ipc.mapped.size() > kMaxMapped;
  // Nobody reads anyone's buffers after this: the callers' streams may go on.
  if (s.ok()) s = barrier(fp);
  if (!s.ok()) return s;
  return true;
}

bool Comm::cudaIpcOffers(std::size_t bytes) const {
  return config_.cudaIpc && oneHost_ && link_.sharedMemory && mailbox_ && bytes >= config_.buffSize;
}

Result<bool> Comm::cudaIpcSendRecv(const CollArgs& a, const Fingerprint& fp, void* streamArg) {
  if (!cudaIpc_) cudaIpc_ = std::make_shared<CudaIpc>();  // (made when the proxy started; see cudaIpcCollective)
  CudaIpc& ipc = *cudaIpc_;
  Mailbox& box = *mailbox_;
  bool copied = false;
  std::string why;  // why the call is staged, for the log
  if (a.isSend) {
    Offer mine{};
    mine.process = processToken();
    // Not where the collectives' agreement found that some rank cannot map another's memory.
    const bool agreedOff = ipc.agreed && !ipc.usable.load(std::memory_order_relaxed);
    mine.ok = !agreedOff && ipc.loadDriver() && ipc.describe(a.send, &mine.buffer);
    box.clearAnswer();  // (the offer's message orders this before the receiver's answer)
    plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
    plan_.send(a.peer, 0, &mine, sizeof mine);
    Status s = runPlan();
    if (!mine.ok) why = "this buffer cannot be shared through CUDA IPC";
    if (s.ok() && mine.ok) {  // an offer of nothing needs no answer: both stage
      const std::uint64_t yes = answerWord(fp.seq, a.peer, true), no = answerWord(fp.seq, a.peer, false);
      std::uint64_t got = 0;
      const auto answered = [&] { got = box.answerReceived(); return got == yes || got == no; };
      if (!answered()) s = waitForAnswer(fp, a.peer, answered);
      copied = got == yes;
      if (!copied) why = "the receiver could not map it";
    }
    if (!s.ok()) return s;
  } else {
    Offer theirs{};
    plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
    plan_.recvCopy(a.peer, 0, &theirs, sizeof theirs);
    Status s = runPlan();
    if (!s.ok()) return s;
    auto src = theirs.ok ? ipc.map(a.peer, theirs.buffer, theirs.process == processToken())
                         : Result<std::byte*>(Status::InvalidArgument("its buffer cannot be shared through CUDA IPC"));
    if (src.ok()) {
      ipc.trimWanted = ipc.mapped.size() > kMaxMapped;
      auto stream = static_cast<cudaStream_t>(streamArg);
      const std::size_t bytes = a.count * dataTypeSize(a.dtype);
      cudaError_t e = cudaMemcpyAsync(a.recv, *src, bytes, cudaMemcpyDefault, stream);
      s = e == cudaSuccess ? cuda::waitForStream(stream, config_.timeoutSec, "the copy from the sender's buffer")
                           : cuda::failed("cudaMemcpyAsync (from the sender's buffer)", e);
      if (!s.ok()) return s;
      copied = true;
    } else {
      cudaGetLastError();  // a mapping that failed only means "stage it"
      why = src.status().message();
    }
    if (theirs.ok) box.answer(a.peer, answerWord(fp.seq, rank_, copied));  // (an offer of nothing wants none)
  }
  BRAID_LOG(kInfo, kTune, "%s #%llu: %s", fp.describe().c_str(), static_cast<unsigned long long>(fp.seq),
            copied ? "CUDA IPC (the receiver copies from the sender's buffer)"
                   : ("staged: the receiver cannot read the sender's buffer" + (why.empty() ? "" : " (" + why + ")")).c_str());
  return copied;
}

}  // namespace braid
