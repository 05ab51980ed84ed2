// Tree algorithms, pipelined through the engine's byte-level dependencies.
//
// reduce up, at a node with children c0, c1 and parent p (dst: the node's accumulator):
//   dst  = local (+) recv(c0)          dst = dst (+) recv(c1)          send(p, dst)
// each gated on the one before, so a chunk moves up as soon as both children delivered it.
// broadcast down: recv(p) into buf, then send(c0, buf), send(c1, buf), gated on the receive.
//
// All-reduce runs a double binary tree: channel c uses tree c % 2, where tree 0 is the binary heap
// over ranks (root 0) and tree 1 is the same heap over mirrored ranks n-1-r (root n-1). Most ranks
// that are inner nodes in one tree are leaves in the other, so the two halves of the data load
// different links. Each tree keeps its own channel, so its up and down streams never queue behind
// the other tree's. Across hosts (some holding several ranks) both trees are built over hosts
// first (hostTreeNode), as broadcast and reduce are.
// Broadcast and reduce use one tree rooted at `root`, built over hosts first: a binary heap (kTree)
// or a chain (kRing) of the hosts' leaders (the root for its host, each other host's first rank),
// and under each leader the same shape over its host's ranks. So the data crosses into each host
// once, over its leader's link, whatever the ranks' numbering (one host: the rank-order tree).
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace braid {
namespace {

struct Node {
  int parent = -1;
  int children[4] = {-1, -1, -1, -1};  // (a leader: up to two hosts' leaders, then up to two of its host)
  int nchildren = 0;
};

// Node of virtual rank v in a tree over n virtual ranks; `toRank` maps virtual ranks back.
template <typename ToRank>
Node treeNode(int v, int n, Algo shape, ToRank toRank) {
  Node node;
  if (shape == Algo::kTree) {
    if (v > 0) node.parent = toRank((v - 1) / 2);
    for (int c = 2 * v + 1; c <= 2 * v + 2 && c < n; ++c) node.children[node.nchildren++] = toRank(c);
  } else {
    if (v > 0) node.parent = toRank(v - 1);
    if (v + 1 < n) node.children[node.nchildren++] = toRank(v + 1);
  }
  return node;
}

// Reduces children's data into `acc` (first from `local`), sends it up; returns the op whose
// progress says how much of `acc` is final, or -1 for a leaf.
int reduceUp(Plan& plan, const Node& node, int ch, const std::byte* local, std::byte* acc, std::size_t bytes,
             bool divideAtRoot) {
  int last = -1;
  for (int k = 0; k < node.nchildren; ++k) {
    bool final = divideAtRoot && node.parent < 0 && k == node.nchildren - 1;
    last = plan.recvReduce(node.children[k], ch, acc, k == 0 ? local : acc, bytes, last, final);
  }
  if (node.parent >= 0) plan.send(node.parent, ch, node.nchildren ? acc : local, bytes, last);
  return last;
}

// Receives from the parent into buf (the root already has it, as `rootDep` says) and forwards.
void broadcastDown(Plan& plan, const Node& node, int ch, const std::byte* rootSrc, std::byte* buf, std::size_t bytes,
                   int rootDep) {
  int have = rootDep;
  const std::byte* src = rootSrc;
  if (node.parent >= 0) {
    have = plan.recvCopy(node.parent, ch, buf, bytes);
    src = buf;
  }
  for (int k = 0; k < node.nchildren; ++k) plan.send(node.children[k], ch, src, bytes, have);
}

// This rank's node in the rooted call's tree over hosts, then within each host (above).
Node rootedNode(const Workspace& ws, int root, Algo shape) {
  const auto& hosts = ws.hosts();
  const int H = static_cast<int>(hosts.size());
  const int hr = ws.hostIndex(root), hm = ws.hostIndex(ws.rank());
  const auto leader = [&](int h) { return h == hr ? root : hosts[static_cast<std::size_t>(h)][0]; };
  // This host's ranks from its leader on, wrapping: the within-host tree's order.
  const std::vector<int>& mine = hosts[static_cast<std::size_t>(hm)];
  const int L = static_cast<int>(mine.size());
  const int first = static_cast<int>(std::find(mine.begin(), mine.end(), leader(hm)) - mine.begin());
  const int j = static_cast<int>(std::find(mine.begin(), mine.end(), ws.rank()) - mine.begin());
  Node local = treeNode((j - first + L) % L, L, shape, [&](int v) { return mine[static_cast<std::size_t>((v + first) % L)]; });
  if (j != first) return local;
  Node node = treeNode((hm - hr + H) % H, H, shape, [&](int v) { return leader((v + hr) % H); });
  for (int k = 0; k < local.nchildren; ++k) node.children[node.nchildren++] = local.children[k];
  return node;
}

// This rank's node in one of the all-reduce's two trees across hosts: a heap over the hosts whose
// nodes are the hosts' leaders, and under each leader a heap over its host's ranks. Tree 0 takes
// the hosts and each host's ranks in order (leader: the first rank); tree 1 mirrored (the last
// host first, leader: the last rank), so the hosts and ranks that are inner nodes in one tree are
// mostly leaves in the other. Each tree's data then crosses a host's link at most three times
// (up to its parent host, down to two child hosts), where a heap over all ranks crossed it on
// most of its edges (the simulator counted about L times the data leaving each host of L ranks).
Node hostTreeNode(const Workspace& ws, bool mirror) {
  const auto& hosts = ws.hosts();
  const int H = static_cast<int>(hosts.size()), hm = ws.hostIndex(ws.rank());
  const std::vector<int>& mine = hosts[static_cast<std::size_t>(hm)];
  const int L = static_cast<int>(mine.size());
  const int j = static_cast<int>(std::find(mine.begin(), mine.end(), ws.rank()) - mine.begin());
  const auto flip = [&](int v, int size) { return mirror ? size - 1 - v : v; };
  Node local = treeNode(flip(j, L), L, Algo::kTree, [&](int v) { return mine[static_cast<std::size_t>(flip(v, L))]; });
  if (flip(j, L) != 0) return local;
  const auto leader = [&](int h) {
    const std::vector<int>& theirs = hosts[static_cast<std::size_t>(h)];
    return mirror ? theirs.back() : theirs.front();
  };
  Node node = treeNode(flip(hm, H), H, Algo::kTree, [&](int v) { return leader(flip(v, H)); });
  for (int k = 0; k < local.nchildren; ++k) node.children[node.nchildren++] = local.children[k];
  return node;
}

}  // namespace

RootedLinks rootedLinks(const Workspace& ws, int root, Algo shape) {
  const Node node = rootedNode(ws, root, shape);
  return {node.parent, std::vector<int>(node.children, node.children + node.nchildren)};
}

void buildTreeAllReduce(const CollArgs& a, Workspace& ws, int channels, Plan& plan) {
  const int n = ws.nranks(), r = ws.rank();
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  for (int c = 0; c < channels; ++c) {
    Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    const std::size_t off = part.off * es, bytes = part.len * es;
    const bool mirror = c % 2 == 1;
    auto toRank = [&](int v) { return mirror ? n - 1 - v : v; };
    const int H = static_cast<int>(ws.hosts().size());
    Node node = H > 1 && H < n ? hostTreeNode(ws, mirror) : treeNode(mirror ? n - 1 - r : r, n, Algo::kTree, toRank);
    int reduced = reduceUp(plan, node, c, send + off, recv + off, bytes, a.op == ReduceOp::kAvg);
    broadcastDown(plan, node, c, recv + off, recv + off, bytes, reduced);
  }
}

void buildRooted(const CollArgs& a, Workspace& ws, Algo shape, int channels, Plan& plan) {
  const int r = ws.rank();
  const std::size_t es = dataTypeSize(a.dtype);
  auto* send = static_cast<const std::byte*>(a.send);
  auto* recv = static_cast<std::byte*>(a.recv);
  const Node node = rootedNode(ws, a.root, shape);
  const bool isRoot = r == a.root;
  const std::size_t total = a.count * es;
  if (a.kind == CollKind::kBroadcast && isRoot) plan.localCopy(recv, send, total);  // the root sends from `send`
  std::byte* acc = recv;
  if (a.kind == CollKind::kReduce && !isRoot && node.nchildren) acc = ws.scratch(total);
  for (int c = 0; c < channels; ++c) {
    Range part = split(a.count, static_cast<std::size_t>(channels), static_cast<std::size_t>(c));
    const std::size_t off = part.off * es, bytes = part.len * es;
    if (a.kind == CollKind::kBroadcast)
      broadcastDown(plan, node, c, send + off, recv + off, bytes, -1);
    else
      reduceUp(plan, node, c, send + off, acc + off, bytes, a.op == ReduceOp::kAvg);
  }
}

void buildSendRecv(const CollArgs& a, Plan& plan) {
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  if (a.isSend)
    plan.send(a.peer, 0, a.send, bytes);
  else
    plan.recvCopy(a.peer, 0, a.recv, bytes);
}

}  // namespace braid
