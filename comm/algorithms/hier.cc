// Hierarchical all-reduce, for ranks on several hosts (Workspace::hosts): H hosts of L ranks,
// rank (host h, local index l). Where hosts hold different numbers of ranks, L is the smallest
// host's: a rank whose local index e is L or more is an extra, which
//
//   0. sends its whole input to the rank of local index e mod L on its host (its base), which
//      reduces it into its own before step 1 (several extras of one base one after another),
//
// and gets the result back from its base once step 3 has finished each piece. Only hosts' own
// links carry the extras' bytes (hosts of 7 to 9 ranks: 7 columns, up to two extras a host).
//
//   1. within each host, a ring reduce-scatter over its L ranks: local index l ends with block
//      b = l + 1 (of L) reduced over the host;
//   2. across hosts, a ring all-reduce of block b among the H ranks of local index l (one per host,
//      the "column"), with the block's H sub-blocks as the ring's blocks (the last reduction applies avg);
//   3. within each host, a ring all-gather of the L blocks.
//
// Only step 2 crosses hosts, and a host's L columns together send 2(H-1)/H of the data over its
// link, where a flat ring over all n = H L ranks sends 2(n-1)/n of it (2 hosts x 2 ranks: S against
// 1.5 S). Steps 1 and 3 move every block as H messages, one per sub-block, so that each message of
// step 2 depends on exactly the message of step 1 that produced its bytes, and each message of step
// 3 on the one of step 2 (a message may depend on one other, byte for byte: engine.h). All of it is
// one plan: the steps pipeline, chunk by chunk, like the ring's.
//
// Hierarchical all-gather, the same shape without the reductions (on hosts of unequal size each
// base rank carries its extras' blocks along with its own, and sends every block to each extra
// at the end):
//
//   1. across hosts, a ring all-gather among each column: rank (h, l) ends with the blocks of
//      every rank (h', l);
//   2. within each host, a ring all-gather of the columns: each step passes one column's H blocks,
//      as H messages, each depending on the message that brought its block.
//
// A host's link then carries each other host's blocks once, (H-1)/H S inbound, where the flat ring
// carries (n-1)/n S over every host crossing (2 hosts x 2 ranks: S/2 against 3/4 S).
//
// Hierarchical reduce-scatter, the all-gather's mirror: S is the whole send array, n blocks, block
// q for rank q (on hosts of unequal size each extra first sends its whole input to its base, which
// adds it into its own, carries the extras' blocks along with its own, and sends each extra its
// block at the end).
//
//   1. within each host, a ring reduce-scatter of the columns: local index l ends with the H blocks
//      of column l (the ranks (h', l)) summed over its host; each step passes one column as H
//      messages, each depending on the message that brought that block's partial sum;
//   2. across hosts, a ring reduce-scatter among each column of those H blocks: rank (h, l) ends
//      with its own block summed over every host (the last reduction applies avg).
//
// A host's link carries (H-1)/H S outbound, where the flat ring carries (n-1)/n S over every host
// crossing. Partial sums live in scratch laid out like the send buffer.
#include <algorithm>

#include "comm/algorithms/algorithms.h"
#include "comm/tuner.h"

namespace braid {
namespace {
std::size_t mod(long long a, long long n) { return static_cast<std::size_t>(((a % n) + n) % n); }
}  // namespace

int Workspace::smallestHost() const { return hostShape(hosts()).perHost; }
int Workspace::largestHost() const { return hostShape(hosts()).maxPerHost; }

bool hierApplies(const Workspace& ws) { return ws.hosts().size() > 1 && ws.largestHost() > 1; }

namespace {
// This rank's place among the hosts, its neighbours in its host's ring and its column's ring, and
// its extras (or, for an extra, its base: `base`, and l >= L).
struct HierPlace {
  int H, L, h, l = 0;
  int localRight, localLeft, hostRight, hostLeft;
  std::vector<int> extras;
  const std::vector<std::vector<int>>& hosts;
  HierPlace(const Workspace& ws)
      : H(static_cast<int>(ws.hosts().size())), L(ws.smallestHost()), h(ws.hostIndex(ws.rank())),
        hosts(ws.hosts()) {
    const auto& mine = hosts[static_cast<std::size_t>(h)];
    l = static_cast<int>(std::find(mine.begin(), mine.end(), ws.rank()) - mine.begin());
    localRight = at(h, l + 1), localLeft = at(h, l - 1), hostRight = at(h + 1, l), hostLeft = at(h - 1, l);
    if (l < L)
      for (std::size_t e = static_cast<std::size_t>(l + L); e < mine.size(); e += static_cast<std::size_t>(L)) extras.push_back(mine[e]);
  }
  int at(long long host, long long local) const { return hosts[mod(host, H)][mod(local, L)]; }
  bool isExtra() const { return l >= L; }
  int base() const { return at(h, l); }
  // f(rank) for each rank whose block the base rank (host, column) carries: its own, then its
  // extras' (the all-gather and reduce-scatter).
  template <class F>
  void carried(long long host, long long column, const F& f) const {
    const auto& ranks = hosts[mod(host, H)];
    for (std::size_t e = mod(column, L); e < ranks.size(); e += static_cast<std::size_t>(L)) f(ranks[e]);
  }
};
}  // namespace

void buildHierAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const HierPlace p(ws);
  const int H = p.H, L = p.L, h = p.h, l = p.l;
  const int localRight = p.localRight, localLeft = p.localLeft, hostRight = p.hostRight, hostLeft = p.hostLeft;
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  const bool avg = a.op == ReduceOp::kAvg;
  const auto HH = static_cast<std::size_t>(H);
  // This rank's own input, which steps 1 and 2 read: the user's, or the extras' sum (step 0) in recv.
  const std::byte* own = p.extras.empty() ? send : recv;
  // `held`: where this rank's partial sums live once steps 0 and 1 wrote them (recv), or its own
  // input on a host of one column without extras (no step wrote them).
  const std::byte* held = L > 1 || !p.extras.empty() ? recv : send;
  // Below L H elements a channel, most pieces are empty: skipped at both ends, as the ring's, and
  // not even built (sub-block k of every block is empty from k = ceil(part / L) on).
  const bool skipping = a.count > 0;
  if (skipping) plan.skipEmptyMessages();
  std::vector<int> prev(HH), done(HH), folded(static_cast<std::size_t>(L) * HH), fin(folded.size());
  for (int c = 0; c < channels; ++c) {
    const Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    // Bytes of sub-block k of block b of this channel's part.
    auto sub = [&](std::size_t b, std::size_t k) {
      const Range blk = split(part.len, static_cast<std::size_t>(L), b);
      const Range s = split(blk.len, HH, k);
      return Range{(part.off + blk.off + s.off) * es, s.len * es};
    };
    auto piece = [&](std::size_t b, std::size_t k) { return b * HH + k; };
    const std::size_t busy = skipping ? std::min(HH, (part.len + static_cast<std::size_t>(L) - 1) / static_cast<std::size_t>(L)) : HH;
    const int busyH = static_cast<int>(busy);
    if (p.isExtra()) {  // steps 0 and 4, piece by piece in the base's order
      for (std::size_t b = 0; b < static_cast<std::size_t>(L); ++b)
        for (std::size_t k = 0; k < busy; ++k) plan.send(p.base(), c, send + sub(b, k).off, sub(b, k).len);
      for (std::size_t b = 0; b < static_cast<std::size_t>(L); ++b)
        for (std::size_t k = 0; k < busy; ++k) plan.recvCopy(p.base(), c, recv + sub(b, k).off, sub(b, k).len);
      continue;
    }
    // 0. The extras' inputs, summed into recv piece by piece; folded[piece]: the message that
    // finished it (-1: nothing to wait for).
    std::fill(folded.begin(), folded.end(), -1);
    for (std::size_t e = 0; e < p.extras.size(); ++e)
      for (std::size_t b = 0; b < static_cast<std::size_t>(L); ++b)
        for (std::size_t k = 0; k < busy; ++k) {
          const Range r = sub(b, k);
          int& f = folded[piece(b, k)];
          f = plan.recvReduce(p.extras[e], c, recv + r.off, (e == 0 ? send : recv) + r.off, r.len, f);
        }
    // 1. Reduce-scatter within the host.
    for (int k = 0; k < H; ++k) prev[static_cast<std::size_t>(k)] = folded[piece(mod(l, L), static_cast<std::size_t>(k))];
    for (int s = 0; s < L - 1; ++s)
      for (int k = 0; k < busyH; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        const std::size_t rblock = mod(l - s - 1, L);
        const Range sb = sub(mod(l - s, L), kk), rb = sub(rblock, kk);
        plan.send(localRight, c, (s == 0 ? own : recv) + sb.off, sb.len, prev[kk]);
        prev[kk] = plan.recvReduce(localLeft, c, recv + rb.off, own + rb.off, rb.len, folded[piece(rblock, kk)]);
      }
    const std::size_t mine = mod(l + 1, L);  // the block this rank now holds, reduced over the host
    // 2. All-reduce of that block across hosts; its sub-blocks are the ring's blocks. done[k]: the
    // message that finished sub-block k on this rank.
    done = prev;
    int last = -1;
    const std::size_t mineLen = split(part.len, static_cast<std::size_t>(L), mine).len;
    forBusySteps(H, h, 0, mineLen, skipping, [&](int s) {
      const std::size_t ks = mod(h - s, H), kr = mod(h - s - 1, H);
      const Range sb = sub(mine, ks), rb = sub(mine, kr);
      plan.send(hostRight, c, (s == 0 ? held : recv) + sb.off, sb.len, s == 0 ? done[ks] : last);
      // The local operand is this rank's own sum of sub-block kr, which steps 0 and 1 finished.
      last = plan.recvReduce(hostLeft, c, recv + rb.off, held + rb.off, rb.len, done[kr], avg && s == H - 2);
    });
    done[mod(h + 1, H)] = last;
    forBusySteps(H, h, 1, mineLen, skipping, [&](int s) {
      const std::size_t ks = mod(h + 1 - s, H), kr = mod(h - s, H);
      const Range sb = sub(mine, ks), rb = sub(mine, kr);
      plan.send(hostRight, c, recv + sb.off, sb.len, last);
      last = done[kr] = plan.recvCopy(hostLeft, c, recv + rb.off, rb.len);
    });
    for (std::size_t k = 0; k < HH; ++k) fin[piece(mine, k)] = done[k];
    // 3. All-gather within the host, block `mine` first.
    prev = done;
    for (int s = 0; s < L - 1; ++s)
      for (int k = 0; k < busyH; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        const std::size_t rblock = mod(static_cast<long long>(mine) - s - 1, L);
        const Range sb = sub(mod(static_cast<long long>(mine) - s, L), kk), rb = sub(rblock, kk);
        plan.send(localRight, c, recv + sb.off, sb.len, prev[kk]);
        prev[kk] = fin[piece(rblock, kk)] = plan.recvCopy(localLeft, c, recv + rb.off, rb.len);
      }
    // 4. The result to each extra, each piece once it is final here.
    for (int extra : p.extras)
      for (std::size_t b = 0; b < static_cast<std::size_t>(L); ++b)
        for (std::size_t k = 0; k < busy; ++k) plan.send(extra, c, recv + sub(b, k).off, sub(b, k).len, fin[piece(b, k)]);
  }
}

void buildHierAllGather(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const HierPlace p(ws);
  const int n = ws.nranks(), me = ws.rank();
  const std::size_t es = dataTypeSize(a.dtype), blockBytes = a.count * es;
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  if (blockBytes * static_cast<std::size_t>(n) >= largeCopyBytes()) plan.streamCopies();
  plan.localCopy(recv + static_cast<std::size_t>(me) * blockBytes, send, blockBytes);  // own block
  std::vector<int> have(static_cast<std::size_t>(n));  // by block: the message that brought it (-1: none)
  for (int c = 0; c < channels; ++c) {
    const Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    auto blk = [&](int rank) { return Range{static_cast<std::size_t>(rank) * blockBytes + part.off * es, part.len * es}; };
    // The own block is sent from `send` (the local copy is no message's dependency).
    auto source = [&](int rank) { return rank == me ? send + part.off * es : recv + blk(rank).off; };
    if (p.isExtra()) {  // its block to its base; every other block back from it, in rank order
      plan.send(p.base(), c, source(me), blk(me).len);
      for (int b = 0; b < n; ++b)
        if (b != me) plan.recvCopy(p.base(), c, recv + blk(b).off, blk(b).len);
      continue;
    }
    std::fill(have.begin(), have.end(), -1);
    // 0. The extras' blocks.
    for (int e : p.extras) have[static_cast<std::size_t>(e)] = plan.recvCopy(e, c, recv + blk(e).off, blk(e).len);
    auto pass = [&](int to, int b) { plan.send(to, c, source(b), blk(b).len, have[static_cast<std::size_t>(b)]); };
    auto take = [&](int from, int b) { have[static_cast<std::size_t>(b)] = plan.recvCopy(from, c, recv + blk(b).off, blk(b).len); };
    // 1. Across hosts, within the column: the blocks each host's base carries.
    for (int s = 0; s < p.H - 1; ++s) {
      p.carried(p.h - s, p.l, [&](int b) { pass(p.hostRight, b); });
      p.carried(p.h - s - 1, p.l, [&](int b) { take(p.hostLeft, b); });
    }
    // 2. Within the host, column by column, starting with this rank's own.
    for (int s = 0; s < p.L - 1; ++s)
      for (int k = 0; k < p.H; ++k) {
        p.carried(k, p.l - s, [&](int b) { pass(p.localRight, b); });
        p.carried(k, p.l - s - 1, [&](int b) { take(p.localLeft, b); });
      }
    // 3. Every block but its own to each extra, in rank order.
    for (int e : p.extras)
      for (int b = 0; b < n; ++b)
        if (b != e) pass(e, b);
  }
}

void buildHierReduceScatter(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const HierPlace p(ws);
  const int n = ws.nranks(), me = ws.rank();
  const std::size_t es = dataTypeSize(a.dtype), blockBytes = a.count * es;
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  std::byte* scratch = ws.scratch(blockBytes * static_cast<std::size_t>(n));
  const bool avg = a.op == ReduceOp::kAvg;
  // This rank's partial sums: its input, or with its extras' inputs added (step 0) in scratch.
  const std::byte* own = p.extras.empty() ? send : scratch;
  std::vector<int> made(static_cast<std::size_t>(n));  // by block: the message that made its partial sum here
  for (int c = 0; c < channels; ++c) {
    const Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    auto blk = [&](int rank) { return Range{static_cast<std::size_t>(rank) * blockBytes + part.off * es, part.len * es}; };
    if (p.isExtra()) {  // its whole input to its base; its own block back, summed
      for (int b = 0; b < n; ++b) plan.send(p.base(), c, send + blk(b).off, blk(b).len);
      plan.recvCopy(p.base(), c, recv + part.off * es, part.len * es);
      continue;
    }
    std::fill(made.begin(), made.end(), -1);
    // 0. The extras' inputs, summed into scratch block by block.
    for (std::size_t e = 0; e < p.extras.size(); ++e)
      for (int b = 0; b < n; ++b) {
        int& m = made[static_cast<std::size_t>(b)];
        m = plan.recvReduce(p.extras[e], c, scratch + blk(b).off, (e == 0 ? send : scratch) + blk(b).off, blk(b).len, m);
      }
    // 1. Within the host, column by column: local index l ends with column l's blocks summed over
    // its host. A block received is added to this rank's own partial sum of it.
    auto pass = [&](int to, int b, const std::byte* from) {
      plan.send(to, c, from + blk(b).off, blk(b).len, made[static_cast<std::size_t>(b)]);
    };
    auto add = [&](int from, int b) {
      int& m = made[static_cast<std::size_t>(b)];
      m = plan.recvReduce(from, c, scratch + blk(b).off, own + blk(b).off, blk(b).len, m);
    };
    for (int s = 0; s < p.L - 1; ++s)
      for (int k = 0; k < p.H; ++k) {
        p.carried(k, p.l - s - 1, [&](int b) { pass(p.localRight, b, s == 0 ? own : scratch); });
        p.carried(k, p.l - s - 2, [&](int b) { add(p.localLeft, b); });
      }
    // 2. Across hosts, within the column: step s passes host (h - s - 1)'s blocks and takes in host
    // (h - s - 2)'s; the last (s = H - 2) this host's, final: its own to the output, its extras'
    // to scratch.
    const std::byte* held = p.L > 1 || !p.extras.empty() ? scratch : send;  // the host's sums so far
    for (int s = 0; s < p.H - 1; ++s) {
      const bool final = s == p.H - 2;
      p.carried(p.h - s - 1, p.l, [&](int b) { pass(p.hostRight, b, s == 0 ? held : scratch); });
      p.carried(p.h - s - 2, p.l, [&](int b) {
        int& m = made[static_cast<std::size_t>(b)];
        m = plan.recvReduce(p.hostLeft, c, final && b == me ? recv + part.off * es : scratch + blk(b).off,
                            held + blk(b).off, blk(b).len, m, avg && final);
      });
    }
    // 3. Each extra's block to it.
    for (int e : p.extras) pass(e, e, scratch);
  }
}

}  // namespace braid
