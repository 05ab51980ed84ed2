// Log-step all-gather and reduce-scatter (Bruck et al., 1997; the reduce-scatter is its mirror):
// ceil(log2 n) steps where the ring takes n-1, for small calls on many ranks. Every rank sends
// the same n-1 blocks in all as in the ring, but the messages of a step go to a rank 2^k away,
// across a host boundary for most ranks at once, so the tuner takes it only where latency
// dominates (comm/tuner.cc).
//
// all-gather, rank r, step k = 0, 1, ... while d = 2^k < n, m = min(d, n - d) blocks:
//   rank r holds the blocks r, r+1, ..., r+d-1 (mod n); it sends the first m of them to r - d and
//   receives the m blocks r+d, ..., r+d+m-1 from r + d, straight into their places in the output.
//   After the last step it holds all n.
// reduce-scatter, the same steps in reverse order (k from the last down to 0):
//   rank r is responsible for the partial sums of the blocks r, ..., r+d+m-1; it sends those of
//   r+d, ..., r+d+m-1 to r + d, which is responsible for them from then on, and adds those of r,
//   ..., r+m-1 that r - d sends it into its own. After step 0 it holds its own block, summed over
//   every rank (the last reduction applies avg).
//
// Each step sends what several earlier steps received, so a step starts once the steps before it
// are complete (Plan::fence), not byte by byte as the ring's forwarding does. A step's blocks are
// contiguous in rank order but may wrap past rank n-1 and may come partly from the send buffer
// (the own block; partial sums not yet begun), so a step is up to four messages, cut where both
// ends can compute (bruckPieces). One channel: the calls it is chosen for are small.
#include <algorithm>

#include "comm/algorithms/algorithms.h"

namespace braid {
namespace {

struct Piece {
  long long off;  // blocks from the step's first block
  long long len;
};

// The step's blocks first, first + 1, ..., first + m - 1 (mod n), cut at the given offsets from
// `first` (those outside (0, m) ignored) and where they wrap past block n-1.
std::vector<Piece> bruckPieces(long long first, long long m, long long n, std::initializer_list<long long> cuts) {
  std::vector<long long> at{0, m};
  for (long long c : cuts)
    if (c > 0 && c < m) at.push_back(c);
  if (n - first > 0 && n - first < m) at.push_back(n - first);
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i + 1 < at.size(); ++i) pieces.push_back({at[i], at[i + 1] - at[i]});
  return pieces;
}

long long mod(long long a, long long n) { return ((a % n) + n) % n; }

}  // namespace

void buildBruckAllGather(const CollArgs& a, Workspace& ws, Plan& plan) {
  const long long n = ws.nranks(), r = ws.rank();
  const std::size_t bb = a.count * dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  auto at = [&](long long block) { return recv + static_cast<std::size_t>(block) * bb; };
  plan.localCopy(at(r), send, bb);
  for (long long d = 1; d < n; d *= 2) {
    const long long m = std::min(d, n - d), to = mod(r - d, n), from = mod(r + d, n);
    plan.fence();
    // The sender's own block (offset 0) leaves from its send buffer: the local copy into the
    // output is no message's dependency.
    for (const Piece& p : bruckPieces(r, m, n, {1})) {
      const long long block = mod(r + p.off, n);
      plan.send(static_cast<int>(to), 0, p.off == 0 ? send : at(block), static_cast<std::size_t>(p.len) * bb);
    }
    for (const Piece& p : bruckPieces(from, m, n, {1}))
      plan.recvCopy(static_cast<int>(from), 0, at(mod(from + p.off, n)), static_cast<std::size_t>(p.len) * bb);
  }
}

void buildBruckReduceScatter(const CollArgs& a, Workspace& ws, Plan& plan) {
  const long long n = ws.nranks(), r = ws.rank();
  const std::size_t es = dataTypeSize(a.dtype), bb = a.count * es;
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  if (n == 1) {
    plan.localCopy(recv, send, bb);
    return;
  }
  std::byte* scratch = ws.scratch(bb * static_cast<std::size_t>(n));
  const bool avg = a.op == ReduceOp::kAvg;
  auto off = [&](long long block) { return static_cast<std::size_t>(mod(block, n)) * bb; };
  std::vector<long long> steps;
  for (long long d = 1; d < n; d *= 2) steps.push_back(d);
  // Each rank's partial sums of the blocks r, ..., r+acc-1 are in scratch (the same for every rank
  // before a given step); the rest are still only its input.
  long long acc = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const long long d = *it, m = std::min(d, n - d), to = mod(r + d, n), from = mod(r - d, n);
    const bool last = d == 1;
    plan.fence();
    // Cut where the sender's partial sums end (offset acc - d of the receiver's blocks) and where
    // the receiver's do (offset acc).
    for (const Piece& p : bruckPieces(to, m, n, {acc - d, acc})) {
      const long long block = to + p.off;
      plan.send(static_cast<int>(to), 0, (p.off + d < acc ? scratch : send) + off(block), static_cast<std::size_t>(p.len) * bb);
    }
    for (const Piece& p : bruckPieces(r, m, n, {acc - d, acc})) {
      const long long block = r + p.off;
      const std::byte* local = (p.off < acc ? scratch : send) + off(block);
      std::byte* dst = last ? recv : scratch + off(block);
      plan.recvReduce(static_cast<int>(from), 0, dst, local, static_cast<std::size_t>(p.len) * bb, -1, avg && last);
    }
    acc = std::max(acc, m);
  }
}

}  // namespace braid
