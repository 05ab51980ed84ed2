// All-reduce on CUDA device buffers between ranks of one host, through CUDA IPC: every rank maps its
// peers' buffers (cudaIpcOpenMemHandle) and a kernel reads them directly. The shape is the host
// zero-copy all-reduce's (comm/algorithms/direct.cc), with the GPU doing the work:
//
//   1. exchange buffer descriptors (IPC handles)   (also the entry barrier: every stream has reached
//                                                    the call, so every input is ready)
//   small (up to kOneShotMaxBytes), "one-shot":
//   2. every rank folds all n send buffers, in rank order, into its receive buffer (into a private
//      buffer first when in place: the peers still read this rank's input)
//   3. barrier                                      (nobody reads anyone's buffers any more)
//   larger, "two-shot":
//   2. rank r folds block r of all n send buffers into block r of its receive buffer, its own
//      first so that an in-place block is read before it is overwritten
//   3. barrier                                      (every block is final)
//   4. rank r copies every other block q from rank q's receive buffer
//   5. barrier                                      (nobody reads anyone's buffers any more)
//
// Every kernel and copy runs on the CUDA proxy's stream and is waited for (bounded) before the next
// barrier, so a barrier always means "my part is in memory". The barriers and the exchange are small
// plans on the ordinary channels: they carry the call's fingerprint, so mismatched calls are still
// caught, and a rank that dies is still noticed. The ranks agree once, at their first such call,
// whether every rank can map every other's memory; after that, a call whose buffers some rank cannot
// export (memory from cudaMallocAsync pools or cuMemCreate) is staged through pinned host memory
// instead, decided by every rank alike from the exchanged descriptors.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "comm/communicator.h"
#include "comm/cuda_util.h"
#include "comm/log.h"
#include "kernels/reduce_cuda.h"

namespace braid {

namespace {

// At or below this many bytes every rank reduces the whole buffer itself (one kernel, one barrier
// fewer); above it, each rank reduces 1/n and copies the rest. A first guess, to be measured on a GPU.
constexpr std::size_t kOneShotMaxBytes = 256 << 10;
// Peers' allocations kept mapped per communicator; the map starts over when a call might not fit.
constexpr std::size_t kMaxMapped = 64;

// cuPointerGetAttributes, with the driver API's types as plain C types.
using PointerGetAttributesFn = int (*)(unsigned count, int* attributes, void** data, unsigned long long ptr);
constexpr int kAttrBufferId = 7;        // CU_POINTER_ATTRIBUTE_BUFFER_ID (unique per allocation)
constexpr int kAttrIpcCapable = 10;     // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kAttrRangeStart = 11;     // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR

// Round 1 of the agreement: who and where each rank is.
struct RankInfo {
  std::int32_t pid;
  std::int32_t ready;  // the driver entry point was found and the device is known
  unsigned char uuid[16];
};

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

}  // namespace

struct CudaIpc {
  bool agreed = false;  // the first call's agreement ran
  bool usable = false;  // every rank can map every other rank's device memory
  PointerGetAttributesFn pointerGetAttributes = nullptr;
  std::vector<std::int32_t> pids;  // by rank
  void* temp = nullptr;            // one-shot in place: the result before it replaces the input
  std::map<std::uint64_t, cudaIpcMemHandle_t> exported;          // this rank's allocations, by id
  std::map<std::pair<int, std::uint64_t>, void*> mapped;         // (peer, allocation id) -> base here

  ~CudaIpc() {
    closeMapped();
    if (temp) cudaFree(temp);
  }
  void closeMapped() {
    for (auto& [key, base] : mapped) cudaIpcCloseMemHandle(base);
    mapped.clear();
  }

  // Fills `d` for the buffer at `p`; false if its memory cannot be shared through legacy IPC.
  bool describe(const void* p, BufferDesc* d) {
    d->pointer = reinterpret_cast<std::uint64_t>(p);
    unsigned long long id = 0, capable = 0, start = 0;
    int attrs[3] = {kAttrBufferId, kAttrIpcCapable, kAttrRangeStart};
    void* data[3] = {&id, &capable, &start};
    if (pointerGetAttributes(3, attrs, data, reinterpret_cast<unsigned long long>(p)) != 0 || !capable || !start)
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

  // Where `peer`'s buffer `d` is in this process.
  Result<std::byte*> map(int peer, int me, const BufferDesc& d) {
    if (pids[static_cast<std::size_t>(peer)] == pids[static_cast<std::size_t>(me)])
      return reinterpret_cast<std::byte*>(d.pointer);  // a thread of this process: same address space
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

// Whether this process can map the memory of the rank described by `peer`: another thread of this
// process (peer access enabled if it uses another device), the same GPU, or a GPU visible here with
// peer access from ours.
bool canReach(const RankInfo& self, const RankInfo& peer, int device) {
  if (std::memcmp(self.uuid, peer.uuid, sizeof(self.uuid)) == 0) return true;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return false;
  for (int j = 0; j < count; ++j) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, j) != cudaSuccess) continue;
    if (std::memcmp(prop.uuid.bytes, peer.uuid, sizeof(peer.uuid)) != 0) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, j) != cudaSuccess || !can) return false;
    if (self.pid != peer.pid) return true;  // cudaIpcMemLazyEnablePeerAccess does the rest
    cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    return e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
  }
  cudaGetLastError();
  return false;  // the peer's GPU is not visible in this process (CUDA_VISIBLE_DEVICES)
}

}  // namespace

Result<bool> Comm::cudaIpcAllReduce(const CollArgs& a, const Fingerprint& fp, void* streamArg) {
  auto stream = static_cast<cudaStream_t>(streamArg);
  const std::size_t n = static_cast<std::size_t>(nranks_), r = static_cast<std::size_t>(rank_);
  if (!cudaIpc_) cudaIpc_ = std::make_shared<CudaIpc>();
  CudaIpc& ipc = *cudaIpc_;

  if (!ipc.agreed) {
    // The first call: can every rank map every other's memory? Two small rounds, once.
    ipc.agreed = true;
    RankInfo self{};
    self.pid = static_cast<std::int32_t>(getpid());
    int device = -1;
    cudaDeviceProp prop{};
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess && fn) {
      self.ready = 1;
      std::memcpy(self.uuid, prop.uuid.bytes, sizeof(self.uuid));
      ipc.pointerGetAttributes = reinterpret_cast<PointerGetAttributesFn>(fn);
    }
    cudaGetLastError();
    std::vector<RankInfo> infos(n);
    Status s = allGatherSmall(&self, infos.data(), sizeof(RankInfo), fp);
    if (!s.ok()) return s;
    std::int32_t ok = self.ready;
    for (std::size_t q = 0; q < n && ok; ++q) ok = infos[q].ready && (q == r || canReach(self, infos[q], device));
    std::vector<std::int32_t> oks(n);
    s = allGatherSmall(&ok, oks.data(), sizeof(ok), fp);
    if (!s.ok()) return s;
    ipc.usable = std::all_of(oks.begin(), oks.end(), [](std::int32_t v) { return v != 0; });
    for (const RankInfo& i : infos) ipc.pids.push_back(i.pid);
    if (ipc.usable) {
      cudaError_t e = cudaMalloc(&ipc.temp, kOneShotMaxBytes);
      if (e != cudaSuccess) return cuda::failed("cudaMalloc (CUDA IPC all-reduce scratch)", e);
    }
    BRAID_LOG(kInfo, kInit, "rank %d: CUDA IPC between the ranks' device buffers: %s", rank_,
              ipc.usable ? "on" : "off (some rank cannot map another's GPU memory; all-reduce is staged through host memory)");
  }
  if (!ipc.usable) return false;

  const std::size_t es = dataTypeSize(a.dtype), bytes = a.count * es;
  CallDesc mine;
  mine.ok = ipc.describe(a.send, &mine.send) && ipc.describe(a.recv, &mine.recv);
  std::vector<CallDesc> all(n);
  Status s = allGatherSmall(&mine, all.data(), sizeof(CallDesc), fp);
  if (!s.ok()) return s;
  for (const CallDesc& d : all)
    if (!d.ok) return false;  // everyone sees the same descriptors: everyone stages this call

  if (ipc.mapped.size() + 2 * n > kMaxMapped) ipc.closeMapped();  // nothing is in flight between calls
  std::vector<const std::byte*> sends;
  std::vector<std::byte*> recvs;
  s = peerBuffers(a, [&](int q, bool send) { return ipc.map(q, rank_, send ? all[q].send : all[q].recv); }, sends, recvs);
  if (!s.ok()) return s;
  const double wait = config_.timeoutSec;
  const bool oneShot = bytes <= kOneShotMaxBytes;
  BRAID_LOG(kInfo, kTune, "%s #%llu: CUDA IPC %s", fp.describe().c_str(), static_cast<unsigned long long>(fp.seq),
            oneShot ? "one-shot" : "two-shot");

  if (oneShot) {
    // Rank order on every rank, so that every rank gets the same bits.
    std::vector<const void*> srcs(sends.begin(), sends.end());
    const auto* rb = static_cast<const std::byte*>(a.recv);
    const auto* sb = static_cast<const std::byte*>(a.send);
    const bool overlap = rb < sb + bytes && sb < rb + bytes;
    void* dst = overlap ? ipc.temp : a.recv;
    s = kernels::gpu::reduceMany(dst, srcs.data(), static_cast<int>(n), a.count, a.dtype, a.op, stream);
    if (s.ok() && a.op == ReduceOp::kAvg) s = kernels::gpu::divide(dst, a.count, a.dtype, nranks_, stream);
    if (s.ok()) s = cuda::waitForStream(stream, wait, "the one-shot fold");
    if (s.ok()) s = barrier(fp);
    if (!s.ok()) return s;
    if (!overlap) return true;
    cudaError_t e = cudaMemcpyAsync(a.recv, ipc.temp, bytes, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return cuda::failed("cudaMemcpyAsync (one-shot result into the in-place buffer)", e);
    s = cuda::waitForStream(stream, wait, "the one-shot result copy");
    if (!s.ok()) return s;
    return true;
  }

  const Range blk = split(a.count, n, r);
  if (blk.len) {
    std::vector<const void*> srcs(n);
    for (std::size_t k = 0; k < n; ++k) srcs[k] = sends[(r + k) % n] + blk.off * es;
    std::byte* dst = recvs[r] + blk.off * es;
    s = kernels::gpu::reduceMany(dst, srcs.data(), static_cast<int>(n), blk.len, a.dtype, a.op, stream);
    if (s.ok() && a.op == ReduceOp::kAvg) s = kernels::gpu::divide(dst, blk.len, a.dtype, nranks_, stream);
    if (s.ok()) s = cuda::waitForStream(stream, wait, "the two-shot fold");
    if (!s.ok()) return s;
  }
  s = barrier(fp);
  if (!s.ok()) return s;
  for (std::size_t q = 0; q < n; ++q) {
    const Range b = split(a.count, n, q);
    if (q == r || !b.len) continue;
    cudaError_t e = cudaMemcpyAsync(recvs[r] + b.off * es, recvs[q] + b.off * es, b.len * es, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return cuda::failed(("cudaMemcpyAsync (block of rank " + std::to_string(q) + ")").c_str(), e);
  }
  s = cuda::waitForStream(stream, wait, "the two-shot block copies");
  if (s.ok()) s = barrier(fp);
  if (!s.ok()) return s;
  return true;
}

}  // namespace braid
