#include "tools/perf_floor.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <vector>

#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace braid::tools {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// `work` (over `bytes`) again and again for a window of wall time that every rank of a host spends
// at once, so that ranks sharing a core (or the memory) share it as they do in a collective: 20 ms,
// or four of the untimed first run's duration if that is longer. GB/s of the runs completed.
double windowRate(std::size_t bytes, const std::function<void()>& work) {
  double t0 = now();
  work();
  const double window = std::max(0.02, 4 * (now() - t0));
  std::size_t runs = 0;
  t0 = now();
  double t = t0;
  while (t - t0 < window) {
    work();
    ++runs;
    t = now();
  }
  return static_cast<double>(bytes * runs) / (t - t0) / 1e9;
}

// Per host, the sum of its ranks' `mine` and how many ranks it has (an all-gather over `world`).
bool byHost(braidComm_t world, const std::vector<std::string>& hostOf, double mine,
            std::map<std::string, std::pair<double, int>>* hosts) {
  std::vector<double> all(hostOf.size());
  if (braidAllGather(&mine, all.data(), 1, braidFloat64, world, nullptr) != braidSuccess) return false;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto& [sum, k] = (*hosts)[hostOf[r]];
    sum += all[r];
    ++k;
  }
  return true;
}

// Each host's mean of its ranks' `mine` (what the host as a whole does, shared out), the smallest over
// the hosts: a collective's ranks on that host cannot together go faster.
bool slowestHost(braidComm_t world, const std::vector<std::string>& hostOf, double mine, double* out) {
  std::map<std::string, std::pair<double, int>> hosts;
  if (!byHost(world, hostOf, mine, &hosts)) return false;
  *out = 1e300;
  for (const auto& [host, h] : hosts) *out = std::min(*out, h.first / h.second);
  return true;
}

}  // namespace

bool measureMemory(braidComm_t world, const std::vector<std::string>& hostOf, std::byte* a, std::byte* b,
                   std::size_t bytes, DataType dt, ReduceOp op, MemoryRates* out) {
  const std::size_t es = dataTypeSize(dt);
  const std::size_t count = bytes / es;
  double copy = 0;
  for (bool streaming : {false, true}) {  // the faster of the two ways to copy
    if (braidBarrier(world) != braidSuccess) return false;
    copy = std::max(copy, windowRate(bytes, [&] { kernels::copy(b, a, bytes, streaming); }));
  }
  if (braidBarrier(world) != braidSuccess) return false;
  // c = a op b into a buffer of its own, as a reduction step writes a third one (a kernel may take
  // another path where the output overlaps an input).
  static thread_local std::vector<std::byte> c;
  if (c.size() < count * es) c.resize(count * es);
  const double reduce = count ? windowRate(count * es, [&] { kernels::reduce(c.data(), a, b, count, dt, op); }) : 0;
  return slowestHost(world, hostOf, copy, &out->copyGBps) && slowestHost(world, hostOf, reduce, &out->reduceGBps);
}

bool measureLinks(braidComm_t world, int rank, const std::vector<std::string>& hostOf, std::size_t bytes, LinkRate* out) {
  const int n = static_cast<int>(hostOf.size());
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const auto host = [&](int r) { return hostOf[static_cast<std::size_t>(r)]; };
  const bool sends = n > 1 && host(next) != host(rank), receives = n > 1 && host(prev) != host(rank);
  std::vector<std::byte> s(sends ? bytes : 0), r(receives ? bytes : 0);
  double best = 1e300;
  for (int rep = -1; rep < 3; ++rep) {
    // Every stream starts together (a receiver that came late would find data already buffered).
    if (braidBarrier(world) != braidSuccess) return false;
    if (!sends && !receives) continue;
    const double t0 = now();
    if (braidGroupStart() != braidSuccess) return false;
    if (sends && braidSend(s.data(), bytes, braidUint8, next, world, nullptr) != braidSuccess) return false;
    if (receives && braidRecv(r.data(), bytes, braidUint8, prev, world, nullptr) != braidSuccess) return false;
    if (braidGroupEnd() != braidSuccess) return false;
    if (rep >= 0) best = std::min(best, now() - t0);
  }
  // Each stream's time is the slower of its two ends' (a sender is done once the kernel holds its
  // last bytes); a host's link is what its ranks that stream across move together (ranks dealt
  // round-robin over hosts all cross at once, each with a share); the slowest host's sum.
  const double mine = sends || receives ? best : 0;
  std::vector<double> took(static_cast<std::size_t>(n));
  if (braidAllGather(&mine, took.data(), 1, braidFloat64, world, nullptr) != braidSuccess) return false;
  std::map<std::string, double> egress;
  out->pairs = 0;
  for (int q = 0; q < n; ++q)
    if (n > 1 && host((q + 1) % n) != host(q)) {
      const double t = std::max(took[static_cast<std::size_t>(q)], took[static_cast<std::size_t>((q + 1) % n)]);
      egress[host(q)] += static_cast<double>(bytes) / t / 1e9;
      ++out->pairs;
    }
  out->gbps = 0;
  for (const auto& [h, gbps] : egress) out->gbps = out->gbps == 0 ? gbps : std::min(out->gbps, gbps);
  return true;
}

}  // namespace braid::tools
