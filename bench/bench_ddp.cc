// bench_ddp: one training step's communication through braid::ddp::GradSync.
//
//   braid run -n 2 build/bench_ddp [--mb 100] [--iters 7] [--bucket-cap-mib 25]
//                                           [--backward-ms T] [--busy]
//
// Two figures (docs/DDP.md records them):
//  1. Bandwidth. A gradient set of --mb megabytes (10^6 B, float32, 48 parameters shaped like a
//     model: large weights, small biases) is synchronized bucket by bucket, with markReady called
//     back to back, and compared with one all-reduce of the same bytes: the faster of ordinary
//     memory and braidMemAlloc memory, which buckets use when they can. Target: at least 90%.
//  2. Overlap. A simulated backward spends --backward-ms (default 1.5 x the measured bucketed
//     time) between markReady calls, each parameter taking a share proportional to its size.
//     hidden = (comm + backward - step) / comm: the part of the communication the backward hid.
//     Target: at least half. The backward sleeps by default (as a host thread does while a GPU
//     computes); --busy makes it spin instead, which competes with the all-reduce for the cores.
// Each figure is the median over --iters iterations of the slowest rank's time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "braid/ddp.hpp"

namespace {

using braid::DataType;
using braid::ReduceOp;
using Clock = std::chrono::steady_clock;

struct Args {
  double mb = 100;
  int iters = 7;
  std::size_t bucketCapMib = 25;
  double backwardMs = -1;
  bool busy = false;
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void pause(double sec, bool busy) {
  if (sec <= 0) return;
  if (!busy) {
    std::this_thread::sleep_for(std::chrono::duration<double>(sec));
    return;
  }
  const auto end = Clock::now() + std::chrono::duration<double>(sec);
  while (Clock::now() < end) {
  }
}

// The median over iterations of the slowest rank's time. Ranks start each iteration together.
double timeIt(braid::Communicator& comm, int iters, const std::function<bool()>& body) {
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    if (!comm.barrier().wait().ok()) std::exit(1);
    const auto t0 = Clock::now();
    if (!body()) std::exit(1);
    double t = seconds(t0, Clock::now());
    if (!comm.allReduce(&t, &t, 1, DataType::kFloat64, ReduceOp::kMax).wait().ok()) std::exit(1);
    if (i > 0) times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Model {
  std::vector<std::vector<float>> data, grad;
  std::vector<std::size_t> counts;
  std::size_t total = 0;
};

// 24 weights and 24 biases, float32, adding up to the requested bytes.
Model makeModel(double mb) {
  Model m;
  const auto elems = static_cast<std::size_t>(mb * 1e6 / 4);
  const std::size_t bias = 1000, weight = (elems - 24 * bias) / 24;
  for (int l = 0; l < 24; ++l) {
    m.counts.push_back(l == 23 ? elems - 24 * bias - 23 * weight : weight);
    m.counts.push_back(bias);
  }
  for (std::size_t c : m.counts) {
    m.data.emplace_back(c, 0.5f);
    m.grad.emplace_back(c, 1.0f);
    m.total += c;
  }
  return m;
}

std::vector<braid::ddp::Parameter> parameters(Model& m, bool views) {
  std::vector<braid::ddp::Parameter> ps;
  for (std::size_t i = 0; i < m.counts.size(); ++i) {
    char name[32];  // not "p" + std::to_string(i): GCC 12's -Wrestrict misfires on it at -O3
    std::snprintf(name, sizeof(name), "p%zu", i);
    ps.push_back({name, m.data[i].data(), views ? nullptr : m.grad[i].data(), m.counts[i],
                  DataType::kFloat32});
  }
  return ps;
}

// One step: markReady in reverse order, with `perElem` seconds of backward per element before each.
bool step(braid::ddp::GradSync& sync, const Model& m, double perElem, bool busy) {
  for (std::size_t i = m.counts.size(); i-- > 0;) {
    pause(perElem * static_cast<double>(m.counts[i]), busy);
    if (!sync.markReady(i).ok()) return false;
  }
  braid::Status s = sync.finish();
  if (!s.ok()) std::fprintf(stderr, "finish: %s\n", s.toString().c_str());
  return s.ok();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--busy") { a.busy = true; continue; }
    if (i + 1 >= argc) { std::fprintf(stderr, "missing value after %s\n", k.c_str()); return 2; }
    const char* v = argv[++i];
    if (k == "--mb") a.mb = std::atof(v);
    else if (k == "--iters") a.iters = std::atoi(v);
    else if (k == "--bucket-cap-mib") a.bucketCapMib = std::strtoull(v, nullptr, 10);
    else if (k == "--backward-ms") a.backwardMs = std::atof(v);
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  if (a.mb <= 0.1 || a.iters < 1 || a.bucketCapMib == 0) return 2;

  auto comm = braid::Communicator::fromEnv();
  if (!comm.ok()) { std::fprintf(stderr, "%s\n", comm.status().toString().c_str()); return 1; }
  const bool root = comm->rank() == 0;
  Model model = makeModel(a.mb);
  const double bytes = static_cast<double>(model.total) * 4;

  // The references: one all-reduce of the whole gradient set, averaging as GradSync does, in
  // ordinary memory and in braidMemAlloc memory (what the buckets use when they can).
  std::vector<float> flat(model.total, 1.0f);
  const double tOne = timeIt(*comm, a.iters, [&] {
    return comm->allReduce(flat.data(), flat.data(), flat.size(), DataType::kFloat32, ReduceOp::kAvg).wait().ok();
  });
  double tOneShared = 0;
  if (auto shared = braid::memAlloc(bytes); shared.ok()) {
    auto* p = static_cast<float*>(*shared);
    std::fill(p, p + model.total, 1.0f);
    tOneShared = timeIt(*comm, a.iters, [&] {
      return comm->allReduce(p, p, model.total, DataType::kFloat32, ReduceOp::kAvg).wait().ok();
    });
    (void)braid::memFree(p);
  }
  const double tRef = tOneShared > 0 ? std::min(tOne, tOneShared) : tOne;

  braid::ddp::GradSyncOptions o;
  o.bucketCapBytes = a.bucketCapMib << 20;
  auto copying = braid::ddp::GradSync::create(*comm, parameters(model, false), o);
  o.gradientsAsBucketViews = true;
  auto views = braid::ddp::GradSync::create(*comm, parameters(model, true), o);
  if (!copying.ok() || !views.ok()) {
    std::fprintf(stderr, "create: %s\n", (copying.ok() ? views.status() : copying.status()).toString().c_str());
    return 1;
  }
  const double tCopy = timeIt(*comm, a.iters, [&] { return step(*copying, model, 0, false); });
  const double tViews = timeIt(*comm, a.iters, [&] { return step(*views, model, 0, false); });

  const double backward = a.backwardMs >= 0 ? a.backwardMs / 1e3 : 1.5 * tCopy;
  const double perElem = backward / static_cast<double>(model.total);
  // The backward alone, as this machine actually paces it (sleeps overshoot).
  const double tBackward = timeIt(*comm, a.iters, [&] {
    for (std::size_t i = model.counts.size(); i-- > 0;) pause(perElem * static_cast<double>(model.counts[i]), a.busy);
    return true;
  });
  const double tStepCopy = timeIt(*comm, a.iters, [&] { return step(*copying, model, perElem, a.busy); });
  const double tStepViews = timeIt(*comm, a.iters, [&] { return step(*views, model, perElem, a.busy); });

  if (root) {
    auto gbs = [&](double t) { return bytes / t / 1e9; };
    auto hidden = [&](double comm1, double stepT) {
      return std::clamp((comm1 + tBackward - stepT) / comm1, 0.0, 1.0) * 100;
    };
    std::printf("# bench_ddp: %d ranks, %.1f MB of float32 gradients in %zu parameters, %zu bucket(s) of <= %zu MiB "
                "(first <= 1 MiB, %s), median of %d\n",
                comm->size(), bytes / 1e6, model.counts.size(), copying->buckets().size(), a.bucketCapMib,
                tOneShared > 0 ? "braidMemAlloc memory" : "ordinary memory", a.iters);
    std::printf("one all-reduce          %9.2f ms  %6.2f GB/s (algbw), ordinary memory\n", tOne * 1e3, gbs(tOne));
    if (tOneShared > 0) {
      std::printf("one all-reduce          %9.2f ms  %6.2f GB/s (algbw), braidMemAlloc memory\n", tOneShared * 1e3,
                  gbs(tOneShared));
    }
    std::printf("bucketed, copies        %9.2f ms  %6.2f GB/s  %5.1f%% of the faster all-reduce\n", tCopy * 1e3,
                gbs(tCopy), tRef / tCopy * 100);
    std::printf("bucketed, views         %9.2f ms  %6.2f GB/s  %5.1f%% of the faster all-reduce\n", tViews * 1e3,
                gbs(tViews), tRef / tViews * 100);
    std::printf("backward alone (%s)   %9.2f ms\n", a.busy ? "spin " : "sleep", tBackward * 1e3);
    std::printf("step, copies            %9.2f ms  communication hidden %5.1f%%\n", tStepCopy * 1e3,
                hidden(tCopy, tStepCopy));
    std::printf("step, views             %9.2f ms  communication hidden %5.1f%%\n", tStepViews * 1e3,
                hidden(tViews, tStepViews));
  }
  return 0;
}
