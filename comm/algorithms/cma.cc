// Single-copy all-gather and broadcast between the ranks of one host, on ordinary buffers: ranks
// copy straight between each other's buffers with process_vm_readv and process_vm_writev
// (cross-memory attach: the kernel copies from one process's pages into the other's), so every
// byte is copied once instead of twice through a shared-memory ring. Open MPI's shared-memory
// transport reads the same way for large messages. Used when every rank is on this host and each
// could read and write every other at setup (same user, ptrace rules permitting; nothing is
// loosened to make it so), no rank is oversubscribed, and the call is large enough (cmaFits
// below). BRAID_CMA=0 turns it off.
//
//   all-gather: 1. exchange the send buffers' addresses (small messages that carry the call's
//                  fingerprint, so mismatches are still caught)
//               2. read every peer's block into place; copy this rank's own block
//               3. barrier: nobody returns, and reuses its send buffer, while a peer still reads it
//   broadcast:  1. the root and every other rank exchange their buffers' addresses
//               2. the copying is shared: the buffer is cut into pieces, and the root writes
//                  piece r into rank r's buffer (process_vm_writev) while rank r reads the other
//                  pieces from the root's; at 2 ranks both cores copy at once instead of one
//                  copying while the other waits
//               3. each rank tells the root it has read, and the root tells each rank it has
//                  written: nobody returns while a peer still copies from or into its buffer
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "comm/communicator.h"
#include "topology/topology.h"
#include "base/socket.h"

namespace braid {
namespace {

// What a peer reads, and writes back unchanged, at setup to learn whether process_vm_readv and
// process_vm_writev reach this process. Writable: a write into read-only pages fails.
constexpr std::uint8_t kCmaProbeValue = 0x5a;
volatile std::uint8_t cmaProbeByte = kCmaProbeValue;

}  // namespace

std::uint64_t cmaProbeAddress() { return reinterpret_cast<std::uint64_t>(&cmaProbeByte); }

Status cmaProbe(int pid, std::uint64_t probeAddress) {
  if (!probeAddress) return Status::Internal("no probe address");
  std::uint8_t byte = 0;
  Status s = cmaCopy(pid, probeAddress, &byte, 1, CmaDirection::kRead);
  if (s.ok() && byte != kCmaProbeValue) return Status::Internal("read the wrong byte");
  if (s.ok()) s = cmaCopy(pid, probeAddress, &byte, 1, CmaDirection::kWrite);
  return s;
}

Status cmaCopy(int pid, std::uint64_t remote, void* local, std::size_t n, CmaDirection direction) {
  const bool reading = direction == CmaDirection::kRead;
  auto* mine = static_cast<std::byte*>(local);
  while (n > 0) {
    iovec l{mine, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    const ssize_t k = reading ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return Status::RemoteError(std::string(reading ? "process_vm_readv from" : "process_vm_writev to") + " pid " +
                                 std::to_string(pid) + " failed: " + (k < 0 ? net::errnoText(errno) : std::string("no bytes")) +
                                 " (BRAID_CMA=0 copies through shared memory instead)");
    mine += k;
    remote += static_cast<std::uint64_t>(k);
    n -= static_cast<std::size_t>(k);
  }
  return Status::Ok();
}

// Where one copy beats two (docs/PERFORMANCE.md has the measurements behind these numbers). The
// kernel pins every page it copies, so its copy costs several times the CPU time per byte of a
// user-space copy: the rings' two copies (the receiving one past the cache for large messages)
// cost less CPU in all. So cross-memory attach is left out where the CPU is the limit: when ranks
// outnumber the cores, and for the 2-rank all-gather, where both ranks copy all the time anyway.
// It pays where it lets otherwise idle cores copy at once: the broadcast's root and readers share
// the copy (2 ranks: once the buffers, about four times the size over both ranks, no longer fit
// in the L3 cache), and with more ranks every rank reads the others' blocks directly instead of
// forwarding them along the ring (all-gather from 512 KiB, broadcast from 128 KiB).
std::size_t cmaMinBytes(CollKind kind, int nranks, std::size_t l3Bytes) {
  constexpr std::size_t kNever = SIZE_MAX;
  if (kind == CollKind::kAllGather) return nranks > 2 ? std::size_t{512} << 10 : kNever;
  if (kind != CollKind::kBroadcast) return kNever;
  if (nranks > 2) return std::size_t{128} << 10;
  return std::max<std::size_t>(std::size_t{1} << 20, l3Bytes / 4);
}

// Every rank computes the same answer: all of them run on this host and agreed at setup on
// cmaUsable_, oversubscribed_ and cmaCacheBytes_.
bool Comm::cmaFits(const CollArgs& a, std::size_t total) const {
  if (!cmaUsable_ || oversubscribed_) return false;
  return total >= cmaMinBytes(a.kind);
}

Status Comm::cmaCollective(const CollArgs& a, const Fingerprint& fp) {
  Status s = a.kind == CollKind::kAllGather ? cmaAllGather(a, fp) : cmaBroadcast(a, fp);
  cmaCalls_ += s.ok();
  return s;
}

// A read from or a write to `peer` failed (usually: the peer is gone). As the engine does for a
// closed connection, give the store's notice a moment so that the error names the root cause (the
// rank that died), then end the communicator; either way the error names the call and this rank.
Status Comm::cmaCopyFailed(const Fingerprint& fp, int peer, const Status& s) {
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
    s = cmaCopy(pids_[q], addr[q], recv + q * block, block, CmaDirection::kRead);
    if (!s.ok()) return cmaCopyFailed(fp, static_cast<int>(q), s);
    peerBytes(static_cast<int>(q), block, block);
  }
  if (recv + me * block != a.send) copyLocal(recv + me * block, a.send, block);
  return barrier(fp);
}

Status Comm::cmaBroadcast(const CollArgs& a, const Fingerprint& fp) {
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  const auto n = static_cast<std::size_t>(nranks_), me = static_cast<std::size_t>(rank_);
  const int root = a.root;
  const auto rootIdx = static_cast<std::size_t>(root);
  const bool isRoot = rank_ == root;
  // The root and each rank exchange {buffer address, parts}; the root's `parts` cuts the buffer
  // into pieces on 64-byte lines, and the root writes piece r into rank r. In place, parts = n: the
  // root and every rank copy (n-1)/n of the bytes. Out of place the root also copies its own
  // buffer, so it takes a smaller share: parts = n + 1 (the last piece, like the root's own, is
  // read by every rank).
  std::vector<std::uint64_t>& msg = cmaAddrs_;
  msg.assign(2 * n, 0);
  msg[2 * me] = reinterpret_cast<std::uint64_t>(isRoot ? a.send : a.recv);
  msg[2 * me + 1] = a.send == a.recv ? n : n + 1;
  // Root <-> every rank, both ways: `payload` out, the peer's into its slot of msg (or nothing).
  auto exchange = [&](void* payload, std::size_t size) {
    plan_.reset(fp, commTag_, rank_, nranks_, 1 << 16);
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_ || (!isRoot && p != root)) continue;
      plan_.send(p, 0, payload, size);
      plan_.recvCopy(p, 0, payload ? &msg[2 * static_cast<std::size_t>(p)] : nullptr, size);
    }
    return runPlan();
  };
  Status s = exchange(&msg[2 * me], 2 * sizeof(std::uint64_t));
  if (!s.ok()) return s;
  const std::size_t parts = std::max<std::uint64_t>(msg[2 * rootIdx + 1], n);
  auto pieceStart = [&](std::size_t r) { return r >= parts ? bytes : (bytes / parts * r) & ~std::size_t{63}; };
  const auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  if (isRoot) {
    for (std::size_t i = 1; i < n; ++i) {
      const std::size_t r = (me + i) % n, from = pieceStart(r), len = pieceStart(r + 1) - from;
      s = cmaCopy(pids_[r], msg[2 * r] + from, const_cast<std::byte*>(send + from), len, CmaDirection::kWrite);
      if (!s.ok()) return cmaCopyFailed(fp, static_cast<int>(r), s);
    }
    if (recv != send) copyLocal(recv, send, bytes);
    for (int p = 0; p < nranks_; ++p)
      if (p != rank_) peerBytes(p, bytes, 0);
  } else {
    const std::size_t from = pieceStart(me), to = pieceStart(me + 1);
    const int rootPid = pids_[rootIdx];
    s = cmaCopy(rootPid, msg[2 * rootIdx] + to, recv + to, bytes - to, CmaDirection::kRead);
    if (s.ok()) s = cmaCopy(rootPid, msg[2 * rootIdx], recv, from, CmaDirection::kRead);
    if (!s.ok()) return cmaCopyFailed(fp, root, s);
    peerBytes(root, 0, bytes);
  }
  // Every rank tells the root it has read what it needs, and the root tells each rank it has written.
  return exchange(nullptr, 0);
}

}  // namespace braid
