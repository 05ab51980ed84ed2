// Single-copy all-gather and broadcast between the ranks of one host, on ordinary buffers: each
// rank reads its peers' buffers with process_vm_readv (cross-memory attach: the kernel copies
// straight from the peer's pages into this rank's buffer), so every byte is copied once instead of
// twice through a shared-memory ring. Open MPI's shared-memory transport does the same for large
// messages. Used when every rank is on this host and each could read every other at setup (same
// user, ptrace rules permitting; nothing is loosened to make it so), and the call is large enough
// (cmaFits below). BRAID_CMA=0 turns it off.
//
//   all-gather: 1. exchange the send buffers' addresses (small messages that carry the call's
//                  fingerprint, so mismatches are still caught)
//               2. read every peer's block into place; copy this rank's own block
//               3. barrier: nobody returns, and reuses its send buffer, while a peer still reads it
//   broadcast:  1. the root sends its buffer's address to every rank
//               2. every other rank reads the root's buffer into its own
//               3. every other rank tells the root it is done; the root returns after all have
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/communicator.h"
#include "topology/topology.h"
#include "transport/socket.h"

namespace braid {
namespace {

// What a peer reads at setup to learn whether process_vm_readv reaches this process.
const volatile std::uint8_t kCmaProbeByte = 0x5a;

}  // namespace

std::uint64_t cmaProbeAddress() { return reinterpret_cast<std::uint64_t>(&kCmaProbeByte); }

Status cmaProbe(int pid, std::uint64_t probeAddress) {
  if (!probeAddress) return Status::Internal("no probe address");
  std::uint8_t byte = 0;
  Status s = cmaRead(pid, probeAddress, &byte, 1);
  if (s.ok() && byte != kCmaProbeByte) return Status::Internal("read the wrong byte");
  return s;
}

Status cmaRead(int pid, std::uint64_t remote, void* local, std::size_t n) {
  auto* out = static_cast<std::byte*>(local);
  while (n > 0) {
    iovec l{out, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    const ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return Status::RemoteError("process_vm_readv from pid " + std::to_string(pid) + " failed: " +
                                 (k < 0 ? net::errnoText(errno) : std::string("no bytes")) +
                                 " (BRAID_CMA=0 copies through shared memory instead)");
    out += k;
    remote += static_cast<std::uint64_t>(k);
    n -= static_cast<std::size_t>(k);
  }
  return Status::Ok();
}

// Where one copy beats two (docs/PERFORMANCE.md has the measurements behind these numbers). The
// kernel pins every page it copies, which costs more than the ring's second copy while the ring
// and both ranks' buffers stay in the last-level cache. With more than two ranks the ring's copies
// multiply (all-gather: n - 1 hops; broadcast: a chain), and CMA wins early. At two ranks it wins
// once the buffers (about four times the size, over both ranks) no longer fit in the L3 cache.
// Every rank computes the same thresholds: all of them run on this host.
bool Comm::cmaFits(const CollArgs& a, std::size_t total) const {
  if (!cmaUsable_ || (a.kind != CollKind::kAllGather && a.kind != CollKind::kBroadcast)) return false;
  if (nranks_ > 2) return total >= (a.kind == CollKind::kAllGather ? 512u << 10 : 128u << 10);
  const std::size_t l3 = topology::summary().l3Bytes ? topology::summary().l3Bytes : 32u << 20;
  return total >= std::max<std::size_t>(1u << 20, l3 / 4);
}

Status Comm::cmaCollective(const CollArgs& a, const Fingerprint& fp) {
  Status s = a.kind == CollKind::kAllGather ? cmaAllGather(a, fp) : cmaBroadcast(a, fp);
  cmaCalls_ += s.ok();
  return s;
}

// A read from `peer` failed (usually: the peer is gone). As the engine does for a closed connection,
// give the store's notice a moment so that the error names the root cause (the rank that died),
// then end the communicator; either way the error names the call and this rank.
Status Comm::cmaReadFailed(const Fingerprint& fp, int peer, const Status& s) {
  waitForNotice(*this);
  if (failed_) return failure().withContext(failedOn(fp, rank_));
  Status mine = s.withContext("rank " + std::to_string(peer) + " (shm, cross-memory attach)");
  fail(mine, true);
  return mine.withContext(failedOn(fp, rank_));
}

Status Comm::cmaAllGather(const CollArgs& a, const Fingerprint& fp) {
  const std::size_t block = a.count * dataTypeSize(a.dtype);
  const auto n = static_cast<std::size_t>(nranks_), me = static_cast<std::size_t>(rank_);
  auto* recv = static_cast<std::byte*>(a.recv);
  std::vector<std::uint64_t>& addr = cmaAddrs_;
  addr.assign(n, 0);
  addr[me] = reinterpret_cast<std::uint64_t>(a.send);
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    plan_.send(p, 0, &addr[me], sizeof(std::uint64_t));
    plan_.recvCopy(p, 0, &addr[static_cast<std::size_t>(p)], sizeof(std::uint64_t));
  }
  Status s = runPlan();
  if (!s.ok()) return s;
  // Start with the next rank up, so that the ranks do not all read rank 0 first.
  for (std::size_t i = 1; i < n; ++i) {
    const std::size_t q = (me + i) % n;
    s = cmaRead(pids_[q], addr[q], recv + q * block, block);
    if (!s.ok()) return cmaReadFailed(fp, static_cast<int>(q), s);
    trace_.peerBytes(static_cast<int>(q), block, block);
  }
  if (recv + me * block != a.send) std::memcpy(recv + me * block, a.send, block);
  return barrier(fp);
}

Status Comm::cmaBroadcast(const CollArgs& a, const Fingerprint& fp) {
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  const int root = a.root;
  std::uint64_t rootAddr = reinterpret_cast<std::uint64_t>(a.send);
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  if (rank_ == root) {
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_) plan_.send(p, 0, &rootAddr, sizeof(rootAddr));
  } else {
    plan_.recvCopy(root, 0, &rootAddr, sizeof(rootAddr));
  }
  Status s = runPlan();
  if (!s.ok()) return s;
  plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
  if (rank_ == root) {
    if (a.recv != a.send) std::memcpy(a.recv, a.send, bytes);
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_) plan_.recvCopy(p, 0, nullptr, 0);  // "done reading"
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_) trace_.peerBytes(p, bytes, 0);
  } else {
    s = cmaRead(pids_[static_cast<std::size_t>(root)], rootAddr, a.recv, bytes);
    if (!s.ok()) return cmaReadFailed(fp, root, s);
    trace_.peerBytes(root, 0, bytes);
    plan_.send(root, 0, nullptr, 0);
  }
  return runPlan();
}

}  // namespace braid
