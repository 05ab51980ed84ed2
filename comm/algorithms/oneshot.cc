// One-shot all-reduce for small arrays: every rank sends its whole input to every other rank and
// reduces the n inputs itself. One message latency instead of the ring's 2(n-1) or the tree's
// 2 log n, for (n-1) times the ring's bytes, which is the right trade while latency dominates (the
// tuner decides where). A zero-byte one-shot is a barrier: nobody leaves before everyone came.
//
// Every rank reduces the inputs in rank order 0, 1, ..., n-1, so all ranks compute the same
// floating-point operations in the same order and get bitwise identical results, as with the ring.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/reduce.h"

namespace braid {

void buildOneShotAllReduce(const CollArgs& a, Workspace& ws, Plan& plan) {
  const int n = ws.nranks(), r = ws.rank();
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  std::byte* slots = ws.scratch(bytes * static_cast<std::size_t>(n));
  // Receives are posted before sends, peers in the order r+1, r+2, ...: every rank then starts
  // with a different peer, so no rank is everybody's first.
  for (int i = 1; i < n; ++i) {
    int q = (r + i) % n;
    plan.recvCopy(q, 0, slots + static_cast<std::size_t>(q) * bytes, bytes);
  }
  for (int i = 1; i < n; ++i) plan.send((r + n - i) % n, 0, a.send, bytes);
}

void finishOneShotAllReduce(const CollArgs& a, Workspace& ws) {
  const int n = ws.nranks(), r = ws.rank();
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  if (bytes == 0) return;
  std::byte* slots = ws.scratch(bytes * static_cast<std::size_t>(n));
  auto* recv = static_cast<std::byte*>(a.recv);
  // Rank r's own input is read in place unless the result overwrites it before its turn.
  const bool ownIsOverwritten = a.send == a.recv && r >= 2;
  if (ownIsOverwritten) std::memcpy(slots + static_cast<std::size_t>(r) * bytes, a.send, bytes);
  auto input = [&](int q) -> const std::byte* {
    if (q == r && !ownIsOverwritten) return static_cast<const std::byte*>(a.send);
    return slots + static_cast<std::size_t>(q) * bytes;
  };
  kernels::reduce(recv, input(0), input(1), a.count, a.dtype, a.op);
  for (int q = 2; q < n; ++q) kernels::reduce(recv, recv, input(q), a.count, a.dtype, a.op);
  if (a.op == ReduceOp::kAvg) kernels::divide(recv, a.count, a.dtype, n);
}

}  // namespace braid
