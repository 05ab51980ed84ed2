// Ring algorithms. The ring is Workspace::ringOrder (each host's ranks adjacent, so the ring
// crosses each host boundary once per direction); the rank at position p sends to the one at p+1
// and receives from p-1. Data is split into one part per channel and each part into n blocks, and
// every step forwards the block received in the step before, so a step's send is gated on the
// previous step's receive (byte by byte, see engine.h).
//
// all-reduce, n ranks, position p, step s:  reduce-scatter phase (s = 0..n-2)  all-gather phase (s = 0..n-2)
//   send block                               p - s                              p + 1 - s
//   receive block                            p - s - 1, reduced into recv       p - s, copied into recv
// After the reduce-scatter phase position p holds block p+1 fully reduced (the last step applies
// avg). All-gather and reduce-scatter index blocks by rank (the output's layout): the block that
// started at position q is rank order[q]'s.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace braid {
namespace {
std::size_t mod(long long a, int n) { return static_cast<std::size_t>(((a % n) + n) % n); }

}  // namespace

void buildRingAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const int n = ws.nranks(), r = ws.ringPosition(ws.rank());
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  const std::vector<int>& order = ws.ringOrder();
  const int right = order[mod(r + 1, n)], left = order[mod(r - 1, n)];
  const bool avg = a.op == ReduceOp::kAvg;
  // Below n elements a channel, most blocks are empty: both ends know which, and skip them (a
  // block's messages are all empty or all not, so each send still forwards its block's receive).
  const bool skipping = a.count > 0;
  if (skipping) plan.skipEmptyMessages();
  for (int c = 0; c < channels; ++c) {
    Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    auto blk = [&](std::size_t i) {
      Range b = split(part.len, static_cast<std::size_t>(n), i);
      return Range{(part.off + b.off) * es, b.len * es};
    };
    int prev = -1;
    forBusySteps(n, r, 0, part.len, skipping, [&](int s) {
      Range sb = blk(mod(r - s, n)), rb = blk(mod(r - s - 1, n));
      plan.send(right, c, (s == 0 ? send : recv) + sb.off, sb.len, prev);
      prev = plan.recvReduce(left, c, recv + rb.off, send + rb.off, rb.len, -1, avg && s == n - 2);
    });
    forBusySteps(n, r, 1, part.len, skipping, [&](int s) {
      Range sb = blk(mod(r + 1 - s, n)), rb = blk(mod(r - s, n));
      plan.send(right, c, recv + sb.off, sb.len, prev);
      prev = plan.recvCopy(left, c, recv + rb.off, rb.len);
    });
  }
}

// all-gather: at position p, step s sends the block of position p - s (its own first, straight
// from the send buffer) and receives that of p - s - 1.
void buildRingAllGather(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const int n = ws.nranks();
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  const std::size_t blockBytes = a.count * es;
  if (blockBytes * static_cast<std::size_t>(n) >= largeCopyBytes()) plan.streamCopies();
  plan.localCopy(recv + static_cast<std::size_t>(ws.rank()) * blockBytes, send, blockBytes);  // own block; step 0 sends from `send`
  const std::vector<int>& order = ws.ringOrder();
  const int r = ws.ringPosition(ws.rank());
  const int right = order[mod(r + 1, n)], left = order[mod(r - 1, n)];
  for (int c = 0; c < channels; ++c) {
    Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    // The block of the rank at position q.
    auto blk = [&](std::size_t q) {
      return Range{static_cast<std::size_t>(order[q]) * blockBytes + part.off * es, part.len * es};
    };
    int prev = -1;
    for (int s = 0; s < n - 1; ++s) {
      Range sb = blk(mod(r - s, n)), rb = blk(mod(r - s - 1, n));
      const std::byte* src = s == 0 ? send + part.off * es : recv + sb.off;
      plan.send(right, c, src, sb.len, prev);
      prev = plan.recvCopy(left, c, recv + rb.off, rb.len);
    }
  }
}

// reduce-scatter: at position p, step s sends the block of position p - s - 1 and receives that of
// p - s - 2, so the last step (s = n-2) receives its own rank's block and writes it to the output.
// Partial sums live in scratch laid out like the send buffer, so the send buffer is never written.
void buildRingReduceScatter(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const int n = ws.nranks(), r = ws.ringPosition(ws.rank());
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  const std::size_t blockBytes = a.count * es;
  std::byte* scratch = n > 2 ? ws.scratch(blockBytes * static_cast<std::size_t>(n)) : nullptr;
  const std::vector<int>& order = ws.ringOrder();
  const int right = order[mod(r + 1, n)], left = order[mod(r - 1, n)];
  const bool avg = a.op == ReduceOp::kAvg;
  for (int c = 0; c < channels; ++c) {
    Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    auto blk = [&](std::size_t q) {
      return Range{static_cast<std::size_t>(order[q]) * blockBytes + part.off * es, part.len * es};
    };
    int prev = -1;
    for (int s = 0; s < n - 1; ++s) {
      Range sb = blk(mod(r - s - 1, n)), rb = blk(mod(r - s - 2, n));
      plan.send(right, c, (s == 0 ? send : scratch) + sb.off, sb.len, prev);
      bool last = s == n - 2;
      std::byte* dst = last ? recv + part.off * es : scratch + rb.off;
      prev = plan.recvReduce(left, c, dst, send + rb.off, rb.len, -1, avg && last);
    }
  }
}

}  // namespace braid
