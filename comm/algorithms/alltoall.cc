// All-to-all (equal blocks) and all-to-allv (per-pair counts and displacements). Every rank has a
// message for every peer and one from each, so the plan holds them all at once: the engine
// progresses every peer's send and receive queues together, which no order of blocking calls
// could (each rank sending to everyone first deadlocks once the messages outgrow the transports'
// buffers). Peers are taken in staggered order (rank r sends to r+1, r+2, ... and receives from
// r-1, r-2, ...), so that the ranks do not all start on rank 0. A block of 256 KiB or more is cut
// into one piece per channel. Every message carries the call's fingerprint and its size, so a
// mismatch (other counts, another call) is named at the first header.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "kernels/copy.h"

namespace braid {

std::size_t AllToAllvCounts::sendExtent() const {
  std::size_t extent = 0;
  for (std::size_t p = 0; p < sendCounts.size(); ++p)
    if (sendCounts[p]) extent = std::max(extent, sendDispls[p] + sendCounts[p]);
  return extent;
}

std::size_t AllToAllvCounts::recvExtent() const {
  std::size_t extent = 0;
  for (std::size_t p = 0; p < recvCounts.size(); ++p)
    if (recvCounts[p]) extent = std::max(extent, recvDispls[p] + recvCounts[p]);
  return extent;
}

void buildAllToAll(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const std::size_t es = dataTypeSize(a.dtype);
  const int n = ws.nranks(), me = ws.rank();
  const bool v = a.kind == CollKind::kAllToAllv;
  auto sendOff = [&](int p) { return (v ? a.v->sendDispls[static_cast<std::size_t>(p)] : a.count * static_cast<std::size_t>(p)) * es; };
  auto sendLen = [&](int p) { return (v ? a.v->sendCounts[static_cast<std::size_t>(p)] : a.count) * es; };
  auto recvOff = [&](int p) { return (v ? a.v->recvDispls[static_cast<std::size_t>(p)] : a.count * static_cast<std::size_t>(p)) * es; };
  auto recvLen = [&](int p) { return (v ? a.v->recvCounts[static_cast<std::size_t>(p)] : a.count) * es; };
  const auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  if (a.send == a.recv) {
    // In place: a block received may land where a block still to be sent lies. Send from a copy.
    const std::size_t extent = (v ? a.v->sendExtent() : a.count * static_cast<std::size_t>(n)) * es;
    std::byte* copy = ws.scratch(extent);
    if (extent) kernels::plainCopy(copy, send, extent);
    send = copy;
  }
  // All-to-allv: every message carries its pair's count, so that the receiver checks it at the
  // first header even where the two ends would cut the block differently. One message per queue
  // (peer, channel, direction), so each is message 0 of its queue.
  auto withCount = [&](std::size_t elems) {
    Fingerprint f = plan.fingerprint();
    f.count = elems;
    return f;
  };
  constexpr std::size_t kPieceMin = 256u << 10;
  auto pieces = [&](std::size_t bytes) {
    return bytes >= kPieceMin ? static_cast<std::size_t>(std::max(1, channels)) : std::size_t{1};
  };
  for (int i = 1; i < n; ++i) {
    const int to = (me + i) % n, from = (me - i + n) % n;
    // Zero-byte blocks still send a header: the fingerprint check runs for every pair.
    const std::size_t outBytes = sendLen(to), inBytes = recvLen(from);
    const std::size_t outParts = pieces(outBytes), inParts = pieces(inBytes);
    for (std::size_t c = 0; c < outParts; ++c) {
      const Range r = split(outBytes, outParts, c);
      const int op = plan.send(to, static_cast<int>(c), send + sendOff(to) + r.off, r.len);
      if (v) plan.setFingerprint(op, withCount(outBytes / es));
    }
    for (std::size_t c = 0; c < inParts; ++c) {
      const Range r = split(inBytes, inParts, c);
      const int op = plan.recvCopy(from, static_cast<int>(c), recv + recvOff(from) + r.off, r.len);
      if (v) plan.setFingerprint(op, withCount(inBytes / es));
    }
  }
  if (callBytes(a, n) >= largeCopyBytes()) plan.streamCopies();
  // This rank's own block (already in place when it is the same bytes of the same buffer).
  const bool inPlaceOwn = static_cast<const std::byte*>(a.send) + sendOff(me) == recv + recvOff(me);
  if (sendLen(me) && !inPlaceOwn) plan.localCopy(recv + recvOff(me), send + sendOff(me), sendLen(me));
}

}  // namespace braid
