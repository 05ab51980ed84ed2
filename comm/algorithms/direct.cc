// Zero-copy all-reduce for buffers from braidMemAlloc, between ranks of one host. Every rank maps
// its peers' buffers and works on them directly, so each byte crosses memory the fewest times:
//
//   1. exchange buffer descriptors with every peer   (also the entry barrier: all inputs are ready)
//   2. rank r reduces block r of all n send buffers into its own receive buffer, starting with its
//      own block so that an in-place buffer is read before it is overwritten
//   3. barrier                                        (every block is final)
//   4. rank r copies every other block q from rank q's receive buffer
//   5. barrier                                        (nobody still reads anyone's buffers)
//
// Steps 1, 3 and 5 are small plans on the ordinary channels, so they carry the call's fingerprint
// and mismatches are still caught. If any rank's buffers are not Braid memory, every rank learns it
// in step 1 and all of them fall back to the staged algorithms.
#include <algorithm>
#include <cstring>

#include "comm/communicator.h"
#include "base/log.h"
#include "comm/memory.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace braid {

namespace {
struct BufferDesc {
  std::int32_t pid;
  std::int32_t registered;
  std::int32_t soft;  // staging memory (see tryZeroCopyAllReduce)
  std::int32_t pad;
  mem::RegionDesc send, recv;
};
}  // namespace

Result<bool> Comm::tryZeroCopyAllReduce(const CollArgs& a, const Fingerprint& fp, bool soft) {
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  const std::size_t n = static_cast<std::size_t>(nranks_), r = static_cast<std::size_t>(rank_);
  BufferDesc mine{};
  mine.pid = pids_[r];
  mine.send = mem::describe(a.send, bytes);
  mine.recv = mem::describe(a.recv, bytes);
  mine.registered = mine.send.fd >= 0 && mine.recv.fd >= 0;
  mine.soft = soft;
  std::vector<BufferDesc> all(n);
  Status s = allGatherSmall(&mine, all.data(), sizeof(mine), fp);
  if (!s.ok()) return s;
  // Everyone sees the same descriptors, so everyone decides alike from here on. Staging memory on
  // some ranks and the user's on others (host memory on one rank, device memory on another: not
  // supported) falls back, as does memory that is not Braid's. Staging memory that is not Braid's
  // (cudaHostAlloc, where braidMemAlloc was refused) stays so: staged calls stop trying.
  for (const BufferDesc& d : all) {
    if (d.soft != mine.soft) return false;
    if (d.registered) continue;
    if (soft) stagedZeroCopy_ = false;
    return false;
  }

  peerMemory_.makeRoom(2 * (n - 1));
  std::vector<const std::byte*> sends;
  std::vector<std::byte*> recvs;
  s = peerBuffers(a, [&](int q, bool send) { return peerMemory_.map(all[q].pid, send ? all[q].send : all[q].recv); },
                  sends, recvs);
  if (soft) {
    // Every rank hashes the same descriptors: all of them agree, or none, on these buffers.
    std::uint64_t ids = 0;
    for (const BufferDesc& d : all) ids = (ids ^ d.send.id ^ (d.recv.id * 0x9e3779b97f4a7c15ull)) * 0x100000001b3ull;
    if (ids != stagedZeroCopyAgreed_) {
      const std::int32_t mapped = s.ok();
      std::vector<std::int32_t> oks(n);
      Status agreed = allGatherSmall(&mapped, oks.data(), sizeof(mapped), fp);
      if (!agreed.ok()) return agreed;
      if (std::find(oks.begin(), oks.end(), 0) != oks.end()) {
        stagedZeroCopy_ = false;
        BRAID_LOG(kInfo, kTune, "rank %d: staged all-reduces take the rings from now on: a rank cannot map another's "
                  "staging memory%s", rank_, s.ok() ? "" : (" (here: " + s.message() + ")").c_str());
        return false;
      }
      stagedZeroCopyAgreed_ = ids;
    }
  }
  if (!s.ok()) return s;
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
    if (b.len) kernels::plainCopy(recvs[r] + b.off * es, recvs[q] + b.off * es, b.len * es);
  }
  s = barrier(fp);
  if (!s.ok()) return s;
  return true;
}

Status Comm::peerBuffers(const CollArgs& a, const std::function<Result<std::byte*>(int peer, bool send)>& map,
                         std::vector<const std::byte*>& sends, std::vector<std::byte*>& recvs) const {
  sends.assign(static_cast<std::size_t>(nranks_), nullptr);
  recvs.assign(static_cast<std::size_t>(nranks_), nullptr);
  for (int q = 0; q < nranks_; ++q) {
    const auto i = static_cast<std::size_t>(q);
    if (q == rank_) {
      sends[i] = static_cast<const std::byte*>(a.send);
      recvs[i] = static_cast<std::byte*>(a.recv);
      continue;
    }
    auto ps = map(q, true);
    if (!ps.ok()) return ps.status();
    auto pr = map(q, false);
    if (!pr.ok()) return pr.status();
    sends[i] = *ps;
    recvs[i] = *pr;
  }
  return Status::Ok();
}

Status Comm::allGatherSmall(const void* mine, void* all, std::size_t bytes, const Fingerprint& fp) {
  auto* out = static_cast<std::byte*>(all);
  std::memcpy(out + static_cast<std::size_t>(rank_) * bytes, mine, bytes);
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    plan_.send(p, 0, mine, bytes);
    plan_.recvCopy(p, 0, out + static_cast<std::size_t>(p) * bytes, bytes);
  }
  return runPlan();
}

Status Comm::barrier(const Fingerprint& fp) {
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  CollArgs zero{CollKind::kBarrier, nullptr, nullptr, 0, DataType::kInt8, ReduceOp::kSum};
  buildRingAllReduce(zero, *this, 1, plan_);
  return runPlan();
}

}  // namespace braid
