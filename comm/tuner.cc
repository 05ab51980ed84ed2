// Cost model (alpha: per-message latency, beta: bytes per microsecond of one link):
//   ring all-reduce    2(n-1) alpha + 2 (n-1)/n S / beta
//   tree all-reduce    2 ceil(log2 n) alpha + 2 S / beta      (pipelined up then down)
//   chain bcast/reduce (n-1) alpha + S / beta
//   tree bcast/reduce  ceil(log2 n) alpha + 2 S / beta        (an inner node feeds two children)
//   one-shot all-reduce  alpha + (n-1) S / beta + (n-1) S / gamma   (one round; every rank sends n-1
//                        copies and reduces all n inputs), against the ring's reduction (n-1)/n S / gamma
//   hier all-reduce    H hosts of L ranks: 2(L-1) alpha_l + 2 (L-1)/L S / beta_l     (within hosts)
//                                        + 2(H-1) alpha + 2 (H-1)/H S / beta     (across: a host's L
//                      columns share its link), against the flat ring whose every host crossing
//                      carries 2 (n-1)/n S. Hosts of L to M ranks: L columns, and each base rank
//                      takes in and returns up to F = ceil(M/L) - 1 extras' inputs one after another
//                      (comm/algorithms/hier.cc): + 2 F (alpha_l + S / beta_l)
//   hier all-gather    (L-1) alpha_l + (L-1)/L S / beta_l + (H-1) alpha + (H-1)/H S / beta, against
//                      the flat ring's (n-1) alpha + (n-1)/n S / beta over every host crossing; the
//                      hierarchical reduce-scatter (its mirror) the same. Hosts of L to M ranks: +
//                      F (alpha_l + S / beta_l), the whole array between each base rank and its F
//                      extras (the result to them, or their inputs from them)
//   bruck all-gather   ceil(log2 n) alpha + X (n-1)/n S / beta, the reduce-scatter the same: the ring's
//                      bytes in log2 n steps, but with most of a step's pairs across hosts, a host's
//                      X = M ranks (the largest host) share its link at once (X = 1 on one host).
//                      A candidate below 256 KiB only where every pair is connected at creation (as
//                      the one-shot is); BRAID_ALGO=bruck forces it, its 2 log2 n peers connected on
//                      first use
// alpha and beta come from the slowest link's class (Transport::linkClass: rough figures for this
// machine class, good enough to place the crossovers).
#include "comm/tuner.h"

#include <algorithm>
#include <cmath>

namespace braid {

HostShape hostShape(const std::vector<std::vector<int>>& hosts) {
  HostShape shape;
  shape.hosts = static_cast<int>(hosts.size());
  for (const auto& h : hosts) {
    const int size = static_cast<int>(h.size());
    shape.perHost = shape.perHost == 0 ? size : std::min(shape.perHost, size);
    shape.maxPerHost = std::max(shape.maxPerHost, size);
  }
  return shape;
}

namespace {
constexpr double kGamma = 6000.0;  // the reduction's speed, bytes per microsecond
constexpr std::size_t kManyChannelsBytes = 256u << 10;  // calls from this size on use every channel

// The model's time of the algorithm chosen, with its reduction work: what the choice was made on.
double predictedUs(const TunerChoice& c, CollKind kind, double n, double S, double alpha, double beta) {
  const double gamma = kGamma;
  const bool reduces = kind == CollKind::kAllReduce || kind == CollKind::kBarrier;
  switch (c.algo) {
    case Algo::kRing:
      if (kind == CollKind::kAllGather || kind == CollKind::kReduceScatter) return (n - 1) * alpha + (n - 1) / n * S / beta;
      if (reduces || kind == CollKind::kBroadcast || kind == CollKind::kReduce) return c.ringUs + (reduces ? (n - 1) / n * S / gamma : 0);
      return 0;  // all-to-all and send/recv: not modelled
    case Algo::kTree: return c.treeUs + (reduces ? S / gamma : 0);
    case Algo::kOneShot: return c.oneShotUs;
    case Algo::kHier: return c.hierUs;
    case Algo::kBruck: return c.bruckUs;
  }
  return 0;
}
}  // namespace

TunerChoice tune(const TunerInput& in, const Config& config) {
  const double alpha = in.link.latencyUs;
  const double beta = in.link.bytesPerUs;
  const double n = in.nranks, S = static_cast<double>(in.bytes);
  const double logn = std::ceil(std::log2(std::max(2.0, n)));
  TunerChoice c{};
  bool rooted = in.kind == CollKind::kBroadcast || in.kind == CollKind::kReduce;
  if (rooted) {
    c.ringUs = (n - 1) * alpha + S / beta;
    c.treeUs = logn * alpha + 2 * S / beta;
  } else {
    c.ringUs = 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / beta;
    c.treeUs = 2 * logn * alpha + 2 * S / beta;
  }
  bool treeCapable = rooted || in.kind == CollKind::kAllReduce || in.kind == CollKind::kBarrier;
  c.algo = treeCapable && c.treeUs < c.ringUs ? Algo::kTree : Algo::kRing;
  if (in.kind == CollKind::kAllReduce || in.kind == CollKind::kBarrier) {
    const double gamma = kGamma;
    double best = std::min(c.ringUs + (n - 1) / n * S / gamma, c.treeUs + S / gamma);
    if (in.allPairs) {
      c.oneShotUs = alpha + (n - 1) * S / beta + (n - 1) * S / gamma;
      if (c.oneShotUs < best) c.algo = Algo::kOneShot;
      best = std::min(best, c.oneShotUs);
    }
    const HostShape& h = in.shape;
    if (h.hosts > 1 && h.maxPerHost > 1 && in.kind == CollKind::kAllReduce) {
      const double L = h.perHost, H = h.hosts;
      const double F = std::ceil(static_cast<double>(h.maxPerHost) / L) - 1;  // folds: extras a base rank serves
      c.hierUs = 2 * (L - 1) * h.local.latencyUs + 2 * (L - 1) / L * S / h.local.bytesPerUs + 2 * (H - 1) * alpha +
                 2 * (H - 1) / H * S / beta + (L - 1) / L * S / gamma +
                 2 * F * (h.local.latencyUs + S / h.local.bytesPerUs) + F * S / gamma;
      if (c.hierUs < best) c.algo = Algo::kHier;
    }
  }
  const HostShape& shape = in.shape;
  if (shape.hosts > 1 && shape.maxPerHost > 1 && (in.kind == CollKind::kAllGather || in.kind == CollKind::kReduceScatter)) {
    const double L = shape.perHost, H = shape.hosts;
    const double F = std::ceil(static_cast<double>(shape.maxPerHost) / L) - 1;  // extras a base rank serves
    const double flatUs = (n - 1) * alpha + (n - 1) / n * S / beta;
    c.hierUs = (L - 1) * shape.local.latencyUs + (L - 1) / L * S / shape.local.bytesPerUs + (H - 1) * alpha +
               (H - 1) / H * S / beta + F * (shape.local.latencyUs + S / shape.local.bytesPerUs);
    if (c.hierUs < flatUs) c.algo = Algo::kHier;
  }
  const bool gathers = in.kind == CollKind::kAllGather || in.kind == CollKind::kReduceScatter;
  if (gathers) {
    const double X = shape.hosts > 1 ? shape.maxPerHost : 1;
    c.bruckUs = logn * alpha + X * (n - 1) / n * S / beta;
    const double best = c.algo == Algo::kHier ? c.hierUs : (n - 1) * alpha + (n - 1) / n * S / beta;
    // A candidate below 256 KiB, where every algorithm runs on one channel: the model does not
    // price the ring's channels and pipelining, with which it moves large calls better than whole
    // steps one after another. Not where BRAID_ALGO names another algorithm.
    const bool forcedElse = config.algo != "auto" && config.algo != "bruck";
    if (in.allPairs && in.nranks > 2 && in.bytes < kManyChannelsBytes && !forcedElse && c.bruckUs < best) c.algo = Algo::kBruck;
  }
  if (config.algo == "ring") c.algo = Algo::kRing;
  if (config.algo == "tree" && treeCapable) c.algo = Algo::kTree;
  if (config.algo == "oneshot" && (in.kind == CollKind::kAllReduce || in.kind == CollKind::kBarrier))
    c.algo = Algo::kOneShot;
  if (config.algo == "hier" && c.hierUs > 0) c.algo = Algo::kHier;
  if (config.algo == "hier" && c.algo != Algo::kHier && in.kind == CollKind::kAllReduce) c.algo = Algo::kRing;
  if (config.algo == "bruck" && gathers) c.algo = Algo::kBruck;
  // Small messages on one channel (fewer headers); large ones on all of them. The double tree
  // needs two channels to use both trees.
  c.channels = in.bytes >= kManyChannelsBytes && c.algo != Algo::kOneShot && c.algo != Algo::kBruck ? in.maxChannels : 1;
  if (c.algo == Algo::kTree && !rooted) c.channels = std::max(c.channels, std::min(2, in.maxChannels));
  // Chunk: small enough that a pipeline of n steps fills quickly, big enough to amortize a pass.
  std::size_t perStep = in.bytes / static_cast<std::size_t>(std::max(1, in.nranks * c.channels));
  const std::size_t hi = std::min<std::size_t>(config.buffSize / 2, 512u << 10);
  // The link's smallest worthwhile piece (over tcp each piece is a system call on both ends).
  const std::size_t lo = in.link.minPiece;
  c.chunk = std::clamp<std::size_t>(perStep / 4, std::min(lo, hi), hi);
  // A send/recv forwards nothing, so nothing waits on its pieces: over a network link the largest
  // piece does best (one RDMA write per piece over ib: docs/PERFORMANCE.md). Not over shared
  // memory, where the receiver's copy of one piece overlaps the sender's copy of the next.
  if (in.kind == CollKind::kSendRecv && !in.link.sharedMemory) c.chunk = std::max(hi, in.link.maxPiece);
  // A link where one stream does best (tcp on loopback under reno): one socket, and pieces as large
  // as the staging ring. The kernel's copies and TCP stack are the cost there, per system call and
  // per stream; a second socket only paid while bbr held each connection's window down
  // (docs/PERFORMANCE.md: 2 ranks, 2 MiB 358 against 480 us, 128 MiB 45 against 61 ms). Rings
  // only: the double tree keeps its two channels.
  if (in.link.oneStreamBest && (c.algo == Algo::kRing || c.algo == Algo::kHier)) {
    c.channels = 1;
    c.chunk = config.buffSize;
  }
  if (config.chunkSize) c.chunk = config.chunkSize;
  c.chunk = std::max<std::size_t>(c.chunk & ~std::size_t{63}, 64);  // whole elements of every type
  c.predictedUs = predictedUs(c, in.kind, n, S, alpha, beta);
  return c;
}

}  // namespace braid
