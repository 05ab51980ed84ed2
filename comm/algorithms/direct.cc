// All-reduce that reads the peers' buffers directly, between ranks of one host, so that each byte
// crosses memory the fewest times. Two ways to reach a peer's buffer:
//   - mapped: buffers from braidMemAlloc are mapped into every peer (comm/memory.h), and read in place;
//   - cma: ordinary buffers are read with process_vm_readv (cross-memory attach: one kernel copy,
//     no staging ring), in chunks small enough that the copy and the reduction stay in cache.
//
//   1. exchange buffer descriptors with every peer   (also the entry barrier: all inputs are ready)
//   2. rank r reduces block r of all n send buffers into its own receive buffer, starting with its
//      own block so that an in-place buffer is read before it is overwritten
//   3. barrier                                        (every block is final)
//   4. rank r copies every other block q from rank q's receive buffer
//   5. barrier                                        (nobody still reads anyone's buffers)
//
// Steps 1, 3 and 5 are small plans on the ordinary channels, so they carry the call's fingerprint
// and mismatches are still caught. Every rank sees every descriptor, so all ranks pick the same way
// (or all fall back to the staged algorithms). Whether process_vm_readv is allowed (ptrace rules,
// seccomp) is probed on the first call that could use it and agreed in one more exchange.
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "comm/communicator.h"
#include "comm/log.h"
#include "comm/memory.h"
#include "comm/tuner.h"
#include "kernels/reduce.h"

namespace braid {

namespace {
struct BufferDesc {
  std::int32_t pid;
  std::int32_t registered;  // both buffers are braidMemAlloc memory
  std::int32_t cma;         // this rank allows process_vm_readv and has not found it blocked
  std::int32_t pad;
  std::uint64_t sendAddr, recvAddr;
  mem::RegionDesc send, recv;
};

constexpr std::size_t kCmaChunk = 256u << 10;  // the copy and its reduction stay in L2

// Copies [remote, remote + n) of process `pid` into `local`.
Status readPeer(int pid, int rank, std::uint64_t remote, void* local, std::size_t n) {
  auto* out = static_cast<std::byte*>(local);
  while (n > 0) {
    iovec l{out, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return Status::RemoteError("process_vm_readv from rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                                 ") failed: " + (k < 0 ? std::strerror(errno) : "no bytes") +
                                 " (BRAID_CMA=0 stages through shared memory instead)");
    out += k;
    remote += static_cast<std::uint64_t>(k);
    n -= static_cast<std::size_t>(k);
  }
  return Status::Ok();
}
}  // namespace

Result<bool> Comm::tryZeroCopyAllReduce(const CollArgs& a, const Fingerprint& fp) {
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  const std::size_t n = static_cast<std::size_t>(nranks_), r = static_cast<std::size_t>(rank_);
  BufferDesc mine{};
  mine.pid = pids_[r];
  mine.send = mem::describe(a.send, bytes);
  mine.recv = mem::describe(a.recv, bytes);
  mine.registered = mine.send.fd >= 0 && mine.recv.fd >= 0;
  mine.cma = config_.cma && cma_ != CmaState::kBlocked;
  mine.sendAddr = reinterpret_cast<std::uint64_t>(a.send);
  mine.recvAddr = reinterpret_cast<std::uint64_t>(a.recv);
  std::vector<BufferDesc> all(n);
  all[r] = mine;
  Status s = exchange(fp, &mine, all.data(), sizeof(BufferDesc));
  if (!s.ok()) return s;
  bool registered = true, cma = bytes >= kCmaMinBytes && nranks_ >= kCmaMinRanks;
  for (const BufferDesc& d : all) {
    registered &= d.registered != 0;
    cma &= d.cma != 0;
  }
  if (!registered) {  // everyone sees the same descriptors: everyone decides the same
    if (!cma) return false;
    if (cma_ == CmaState::kUnknown) {
      auto usable = probeCma(fp, [&](std::size_t q) { return std::make_pair(all[q].pid, all[q].sendAddr); });
      if (!usable.ok()) return usable.status();
      if (!*usable) return false;
    }
    s = cmaAllReduce(a, fp, [&](std::size_t q) { return std::make_tuple(all[q].pid, all[q].sendAddr, all[q].recvAddr); });
    if (!s.ok()) return s;
    ++cmaCalls_;
    return true;
  }

  peerMemory_.makeRoom(2 * (n - 1));
  std::vector<const std::byte*> sends(n);
  std::vector<std::byte*> recvs(n);
  for (std::size_t q = 0; q < n; ++q) {
    if (q == r) {
      sends[q] = static_cast<const std::byte*>(a.send);
      recvs[q] = static_cast<std::byte*>(a.recv);
      continue;
    }
    auto ps = peerMemory_.map(all[q].pid, all[q].send);
    auto pr = peerMemory_.map(all[q].pid, all[q].recv);
    if (!ps.ok()) return ps.status();
    if (!pr.ok()) return pr.status();
    sends[q] = *ps;
    recvs[q] = *pr;
  }
  const std::size_t es = dataTypeSize(a.dtype);
  Range mineBlk = split(a.count, n, r);
  std::byte* dst = recvs[r] + mineBlk.off * es;
  const std::size_t off = mineBlk.off * es;
  if (mineBlk.len) {
    kernels::reduce(dst, sends[r] + off, sends[(r + 1) % n] + off, mineBlk.len, a.dtype, a.op);
    for (std::size_t k = 2; k < n; ++k) kernels::reduce(dst, dst, sends[(r + k) % n] + off, mineBlk.len, a.dtype, a.op);
    if (a.op == ReduceOp::kAvg) kernels::divide(dst, mineBlk.len, a.dtype, nranks_);
  }
  s = barrier(fp);
  if (!s.ok()) return s;
  for (std::size_t q = 0; q < n; ++q) {
    if (q == r) continue;
    Range b = split(a.count, n, q);
    if (b.len) std::memcpy(recvs[r] + b.off * es, recvs[q] + b.off * es, b.len * es);
  }
  s = barrier(fp);
  if (!s.ok()) return s;
  return true;
}

Status Comm::exchange(const Fingerprint& fp, const void* mine, void* all, std::size_t bytes) {
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    plan_.send(p, 0, mine, bytes);
    plan_.recvCopy(p, 0, static_cast<std::byte*>(all) + static_cast<std::size_t>(p) * bytes, bytes);
  }
  return runPlan();
}

Result<bool> Comm::probeCma(const Fingerprint& fp, const std::function<std::pair<int, std::uint64_t>(std::size_t)>& peer) {
  // Read one byte of every peer's send buffer; then agree: usable only if it worked everywhere.
  std::int32_t ok = 1;
  std::string why;
  for (int q = 0; q < nranks_ && ok; ++q) {
    if (q == rank_) continue;
    auto [pid, addr] = peer(static_cast<std::size_t>(q));
    std::byte one;
    Status s = readPeer(pid, q, addr, &one, 1);
    if (!s.ok()) {
      ok = 0;
      why = s.message();
    }
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(nranks_));
  all[static_cast<std::size_t>(rank_)] = ok;
  Status s = exchange(fp, &ok, all.data(), sizeof(ok));
  if (!s.ok()) return s;
  bool everywhere = true;
  for (std::int32_t v : all) everywhere &= v != 0;
  cma_ = everywhere ? CmaState::kUsable : CmaState::kBlocked;
  if (!ok)
    BRAID_LOG(kWarn, kInit, "rank %d: cross-memory attach is not allowed here (%s); large all-reduces on ordinary "
              "buffers stage through shared memory", rank_, why.c_str());
  return everywhere;
}

Status Comm::cmaAllReduce(const CollArgs& a, const Fingerprint& fp,
                          const std::function<std::tuple<int, std::uint64_t, std::uint64_t>(std::size_t)>& peer) {
  const std::size_t n = static_cast<std::size_t>(nranks_), r = static_cast<std::size_t>(rank_);
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  Range mineBlk = split(a.count, n, r);
  const std::size_t off = mineBlk.off * es, len = mineBlk.len * es;
  const std::size_t chunk = kCmaChunk / es * es;
  std::byte* tmp = scratch(chunk);
  // Step 2, chunk by chunk: dst = own (op) rank r+1's (op) rank r+2's ...
  for (std::size_t c = 0; c < len; c += chunk) {
    const std::size_t k = std::min(chunk, len - c);
    std::byte* dst = recv + off + c;
    for (std::size_t j = 1; j < n; ++j) {
      std::size_t q = (r + j) % n;
      auto [pid, sendAddr, recvAddr] = peer(q);
      (void)recvAddr;
      Status s = readPeer(pid, static_cast<int>(q), sendAddr + off + c, tmp, k);
      if (!s.ok()) return s;
      kernels::reduce(dst, j == 1 ? send + off + c : dst, tmp, k / es, a.dtype, a.op);
    }
    if (a.op == ReduceOp::kAvg) kernels::divide(dst, k / es, a.dtype, nranks_);
  }
  Status s = barrier(fp);
  if (!s.ok()) return s;
  for (std::size_t q = 0; q < n; ++q) {  // step 4: the other blocks, straight into recv
    if (q == r) continue;
    Range b = split(a.count, n, q);
    auto [pid, sendAddr, recvAddr] = peer(q);
    (void)sendAddr;
    if (b.len) s = readPeer(pid, static_cast<int>(q), recvAddr + b.off * es, recv + b.off * es, b.len * es);
    if (!s.ok()) return s;
  }
  return barrier(fp);
}

Status Comm::barrier(const Fingerprint& fp) {
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  CollArgs zero{CollKind::kBarrier, nullptr, nullptr, 0, DataType::kInt8, ReduceOp::kSum};
  buildRingAllReduce(zero, *this, 1, plan_);
  return runPlan();
}

}  // namespace braid
