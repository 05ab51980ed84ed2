// The DDP gradient layer over real processes: data-parallel training must give the parameters that
// one process gets on the whole batch, replicas must stay bitwise identical, and every error that
// involves other ranks must reach every rank without a hang. Also the sampler and the wire
// conversions, in process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "braid/ddp.hpp"
#include "comm/c_handle.h"
#include "ddp/numeric.h"
#include "tests/common/harness.h"

namespace braid::test {
namespace {

using ddp::GradSync;
using ddp::GradSyncOptions;
using ddp::Parameter;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// "p3": built with snprintf because GCC 12 at -O3 misreports "p" + std::to_string(i) (-Wrestrict).
std::string indexed(const char* prefix, std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%zu", prefix, i);
  return buf;
}

Env envFor(const std::string& algo) { return {{"BRAID_ALGO", algo}, {"BRAID_TIMEOUT", "30"}}; }

// runRanks with a Communicator. The harness's rank 0 hosts the rendezvous store and exits as soon
// as its body returns; a rank still inside its last call (say, receiving a broadcast from rank 0)
// would then lose the store and fail. A reduce to rank 0 as the very last call makes rank 0 the
// last to finish.
std::vector<RankOutcome> runDdp(int n, const std::function<int(int, Communicator&)>& body, const Env& env = {},
                                double timeoutSec = 60) {
  return runRanks(n, [&](int rank, braidComm_t c) {
    Communicator comm(c->impl);
    const int rc = body(rank, comm);
    std::int32_t mine = rc, most = 0;
    Status s = comm.reduce(&mine, &most, 1, DataType::kInt32, ReduceOp::kMax, 0).wait();
    if (rc == 0 && !s.ok()) report(rank, "final reduce: " + s.toString());
    return rc != 0 ? rc : s.ok() ? 0 : 50;
  }, env, timeoutSec);
}

// ---- A small fp64 MLP (4 -> 32 -> 16 -> 3, tanh, softmax cross-entropy) and its data --------------

constexpr std::size_t kWidth[4] = {4, 32, 16, 3};
const char* const kNames[6] = {"w1", "b1", "w2", "b2", "w3", "b3"};
constexpr std::size_t kSteps = 20, kBatch = 24;  // 24 splits evenly over 1-4 ranks and 2 micro-batches

std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t& s) { return static_cast<double>(mix(s) >> 11) * 0x1p-53 * 2 - 1; }

struct Data {
  std::vector<double> x;  // 4 per sample
  std::vector<std::size_t> y;
};

Data makeData(std::size_t n) {
  Data d;
  std::uint64_t s = 99;
  for (std::size_t i = 0; i < n; ++i) {
    double v[4];
    for (double& e : v) e = uniform(s);
    const double score[3] = {v[0] + v[1], v[2] - v[3], 0.5 * v[0] - v[2]};
    d.x.insert(d.x.end(), v, v + 4);
    d.y.push_back(static_cast<std::size_t>(std::max_element(score, score + 3) - score));
  }
  return d;
}

struct Net {
  std::vector<std::vector<double>> p, g;
  std::vector<double*> grad;  // where backward adds: g[i], or the bucket views
};

Net makeNet(std::uint64_t seed) {
  Net n;
  for (std::size_t l = 0; l < 3; ++l) {
    std::vector<double> w(kWidth[l] * kWidth[l + 1]), b(kWidth[l + 1]);
    for (double& v : w) v = uniform(seed) / std::sqrt(static_cast<double>(kWidth[l]));
    for (double& v : b) v = 0.1 * uniform(seed);
    n.p.push_back(std::move(w));
    n.p.push_back(std::move(b));
  }
  for (auto& v : n.p) n.g.emplace_back(v.size(), 0.0);
  for (auto& v : n.g) n.grad.push_back(v.data());
  return n;
}

// Adds scale * the gradient of the mean loss over samples [begin, begin + count), one layer at a
// time from the last, calling ready(i) as soon as gradient i is final.
void addGradients(Net& n, const Data& d, std::size_t begin, std::size_t count, double scale,
                  const std::function<void(std::size_t)>& ready) {
  std::vector<std::vector<double>> act(4);
  act[0].assign(d.x.begin() + static_cast<std::ptrdiff_t>(4 * begin),
                d.x.begin() + static_cast<std::ptrdiff_t>(4 * (begin + count)));
  for (std::size_t l = 0; l < 3; ++l) {
    const std::size_t in = kWidth[l], out = kWidth[l + 1];
    act[l + 1].assign(count * out, 0.0);
    for (std::size_t s = 0; s < count; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        double v = n.p[2 * l + 1][o];
        for (std::size_t k = 0; k < in; ++k) v += n.p[2 * l][o * in + k] * act[l][s * in + k];
        act[l + 1][s * out + o] = l < 2 ? std::tanh(v) : v;
      }
    }
  }
  std::vector<double> delta(count * 3);
  for (std::size_t s = 0; s < count; ++s) {
    const double* z = &act[3][s * 3];
    const double mx = std::max({z[0], z[1], z[2]});
    double e[3], sum = 0;
    for (int c = 0; c < 3; ++c) sum += (e[c] = std::exp(z[c] - mx));
    for (std::size_t c = 0; c < 3; ++c) delta[s * 3 + c] = e[c] / sum - (c == d.y[begin + s] ? 1.0 : 0.0);
  }
  for (std::size_t l = 3; l-- > 0;) {
    const std::size_t in = kWidth[l], out = kWidth[l + 1];
    double* gw = n.grad[2 * l];
    double* gb = n.grad[2 * l + 1];
    for (std::size_t s = 0; s < count; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        const double f = delta[s * out + o] * scale / static_cast<double>(count);
        gb[o] += f;
        for (std::size_t k = 0; k < in; ++k) gw[o * in + k] += f * act[l][s * in + k];
      }
    }
    if (ready) {
      ready(2 * l + 1);
      ready(2 * l);
    }
    if (l == 0) break;
    std::vector<double> prev(count * in, 0.0);
    for (std::size_t s = 0; s < count; ++s) {
      for (std::size_t o = 0; o < out; ++o)
        for (std::size_t k = 0; k < in; ++k) prev[s * in + k] += delta[s * out + o] * n.p[2 * l][o * in + k];
      for (std::size_t k = 0; k < in; ++k) prev[s * in + k] *= 1 - act[l][s * in + k] * act[l][s * in + k];
    }
    delta.swap(prev);
  }
}

void sgdStep(Net& n) {
  for (std::size_t i = 0; i < 6; ++i) {
    for (std::size_t k = 0; k < n.p[i].size(); ++k) {
      n.p[i][k] -= 0.3 * n.grad[i][k];
      n.grad[i][k] = 0;
    }
  }
}

std::vector<double> flatten(const Net& n) {
  std::vector<double> all;
  for (const auto& v : n.p) all.insert(all.end(), v.begin(), v.end());
  return all;
}

std::vector<Parameter> registerNet(Net& n, bool views) {
  std::vector<Parameter> ps;
  for (std::size_t i = 0; i < 6; ++i) {
    ps.push_back({kNames[i], n.p[i].data(), views ? nullptr : n.g[i].data(), n.p[i].size(), DataType::kFloat64});
  }
  return ps;
}

// One process, the whole batch each step: what data-parallel training must reproduce.
const std::vector<double>& reference() {
  static const std::vector<double> ref = [] {
    const Data d = makeData(kSteps * kBatch);
    Net n = makeNet(1);
    for (std::size_t s = 0; s < kSteps; ++s) {
      addGradients(n, d, s * kBatch, kBatch, 1.0, nullptr);
      sgdStep(n);
    }
    return flatten(n);
  }();
  return ref;
}

struct TrainConfig {
  std::size_t capBytes;
  std::size_t micro;  // micro-batches per step (1: no accumulation)
  bool views;
};

// Trains kSteps on this rank's share of each global batch; every replica must match rank 0's after
// every step, and the result must match reference(). Returns 0 or a failure code.
int trainAndCompare(int rank, Communicator& comm, const TrainConfig& cfg) {
  const std::size_t world = static_cast<std::size_t>(comm.size());
  const Data d = makeData(kSteps * kBatch);
  Net n = makeNet(1 + 1000 * static_cast<std::uint64_t>(rank));  // differs by rank: create() must fix it
  GradSyncOptions o;
  o.bucketCapBytes = cfg.capBytes;
  o.firstBucketCapBytes = std::min(o.firstBucketCapBytes, cfg.capBytes);
  o.gradientsAsBucketViews = cfg.views;
  auto sync = GradSync::create(comm, registerNet(n, cfg.views), o);
  if (!sync.ok()) { report(rank, "create: " + sync.status().toString()); return 10; }
  if (cfg.views) {
    for (std::size_t i = 0; i < 6; ++i) n.grad[i] = static_cast<double*>(sync->gradient(i));
  }
  const std::size_t local = kBatch / world, micro = local / cfg.micro;
  std::string err;
  auto ready = [&](std::size_t i) {
    if (Status s = sync->markReady(i); !s.ok() && err.empty()) err = s.toString();
  };
  for (std::size_t step = 0; step < kSteps; ++step) {
    for (std::size_t m = 0; m < cfg.micro; ++m) {
      const std::size_t begin = step * kBatch + static_cast<std::size_t>(rank) * local + m * micro;
      const double scale = 1.0 / static_cast<double>(cfg.micro);
      if (m + 1 < cfg.micro) {
        auto guard = sync->noSync();
        addGradients(n, d, begin, micro, scale, ready);
      } else {
        addGradients(n, d, begin, micro, scale, ready);
      }
    }
    if (Status s = sync->finish(); !s.ok()) { report(rank, "finish: " + s.toString()); return 11; }
    if (!err.empty()) { report(rank, "markReady: " + err); return 12; }
    sgdStep(n);
    const std::vector<double> mine = flatten(n);
    std::vector<double> all(mine.size() * world);
    if (!comm.allGather(mine.data(), all.data(), mine.size(), DataType::kFloat64).wait().ok()) return 13;
    for (std::size_t r = 1; r < world; ++r) {
      if (std::memcmp(all.data(), all.data() + r * mine.size(), mine.size() * sizeof(double)) != 0) {
        report(rank, "replica of rank " + std::to_string(r) + " differs from rank 0's after step " + std::to_string(step));
        return 14;
      }
    }
  }
  const std::vector<double>& ref = reference();
  const std::vector<double> mine = flatten(n);
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(mine[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  if (!(diff <= 1e-12 * scale)) {
    report(rank, "relative difference " + std::to_string(diff / scale) + " from single-process training (cap " +
                     std::to_string(cfg.capBytes) + ", micro " + std::to_string(cfg.micro) + ")");
    return 15;
  }
  return 0;
}

// ---- Equivalence and replicas ---------------------------------------------------------------------

// (ranks, algorithm, transport)
class Equivalence : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(Equivalence, MatchesSingleProcessTrainingAndReplicasStayIdentical) {
  const auto [ranks, algo, transport] = GetParam();
  Env env = envFor(algo);
  for (auto& kv : transportEnv(transport)) env.push_back(kv);
  (void)reference();  // computed once, before the fork, so every rank compares with the same numbers
  // Bucket caps from 1 KiB (4 buckets) to 25 MiB (1 bucket), with and without accumulation and views.
  const std::vector<TrainConfig> configs = {
      {1024, 1, false}, {1024, 2, true}, {2048, 1, true}, {4096, 2, false}, {65536, 2, true},
      {std::size_t{1} << 20, 1, false}, {std::size_t{25} << 20, 1, true}, {std::size_t{25} << 20, 2, false},
  };
  auto outcome = runDdp(ranks, [&](int rank, Communicator& comm) {
    for (const TrainConfig& cfg : configs) {
      if (int rc = trainAndCompare(rank, comm, cfg); rc != 0) return rc;
    }
    return 0;
  }, env, 90);
  expectEveryRankSucceeded(outcome);
}

std::string equivalenceName(const ::testing::TestParamInfo<std::tuple<int, std::string, std::string>>& info) {
  return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Shm, Equivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("ring", "tree"),
                                            ::testing::Values("shm")),
                         equivalenceName);
INSTANTIATE_TEST_SUITE_P(Tcp, Equivalence,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values("ring", "tree"),
                                            ::testing::Values("tcp")),
                         equivalenceName);

TEST(GradSync, BucketsFollowReverseRegistrationOrderAndCaps) {
  auto outcome = runDdp(1, [](int rank, Communicator& comm) {
    Net n = makeNet(1);
    GradSyncOptions o;
    o.bucketCapBytes = o.firstBucketCapBytes = 1024;
    auto sync = GradSync::create(comm, registerNet(n, false), o);
    if (!sync.ok()) { report(rank, sync.status().toString()); return 1; }
    // Bytes: w1 1024, b1 256, w2 4096, b2 128, w3 384, b3 24.
    const std::vector<std::vector<std::size_t>> want = {{5, 4, 3}, {2}, {1}, {0}};
    if (sync->buckets().size() != want.size()) { report(rank, "bucket count"); return 2; }
    for (std::size_t b = 0; b < want.size(); ++b) {
      if (sync->buckets()[b].params != want[b]) { report(rank, "bucket " + std::to_string(b)); return 3; }
    }
    auto one = GradSync::create(comm, registerNet(n, false), GradSyncOptions{});
    if (!one.ok() || one->buckets().size() != 1 || one->buckets()[0].count != 739) return 4;
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

TEST(GradSync, BucketsStartInOrderWhateverOrderGradientsArriveIn) {
  // Each rank marks its parameters in a different order, so buckets fill in different orders on
  // different ranks; the all-reduces must still pair up and give the average.
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    std::vector<std::vector<float>> data(8), grad(8);
    std::vector<Parameter> ps;
    for (std::size_t i = 0; i < 8; ++i) {
      data[i].assign(100 + 37 * i, 0.0f);
      grad[i].assign(data[i].size(), 0.0f);
      ps.push_back({indexed("p", i), data[i].data(), grad[i].data(), data[i].size(), DataType::kFloat32});
    }
    GradSyncOptions o;
    o.bucketCapBytes = o.firstBucketCapBytes = 1200;
    auto sync = GradSync::create(comm, ps, o);
    if (!sync.ok() || sync->buckets().size() < 4) return 1;
    std::vector<std::size_t> order(8);
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (int step = 0; step < 3; ++step) {
      std::uint64_t s = static_cast<std::uint64_t>(rank * 10 + step);
      for (std::size_t i = 8; i > 1; --i) std::swap(order[i - 1], order[mix(s) % i]);
      for (std::size_t i : order) {
        std::fill(grad[i].begin(), grad[i].end(), static_cast<float>((rank + 1) * (step + 1)) + static_cast<float>(i));
        if (!sync->markReady(i).ok()) return 2;
      }
      if (Status st = sync->finish(); !st.ok()) { report(rank, st.toString()); return 3; }
      for (std::size_t i = 0; i < 8; ++i) {
        const float want = static_cast<float>(2 * (step + 1)) + static_cast<float>(i);  // mean of 1,2,3 is 2
        for (float v : grad[i]) if (v != want) { report(rank, "wrong average in " + indexed("p", i)); return 4; }
      }
    }
    return 0;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

TEST(GradSync, LargeBucketsAverageExactlyWithAndWithoutViews) {
  // Buckets of 256 KiB and more take the zero-copy all-reduce when all ranks' bucket memory is
  // braidMemAlloc memory (the staged path otherwise); either way the average must be exact.
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    for (bool views : {false, true}) {
      std::vector<std::vector<double>> data(3), grad(3);
      std::vector<Parameter> ps;
      const std::size_t counts[3] = {70000, 100, 50000};
      for (std::size_t i = 0; i < 3; ++i) {
        data[i].assign(counts[i], static_cast<double>(rank));
        grad[i].assign(counts[i], 0.0);
        ps.push_back({indexed("p", i), data[i].data(), views ? nullptr : grad[i].data(), counts[i], DataType::kFloat64});
      }
      GradSyncOptions o;
      o.gradientsAsBucketViews = views;
      o.firstBucketCapBytes = 256 << 10;
      auto sync = GradSync::create(comm, ps, o);
      if (!sync.ok()) { report(rank, sync.status().toString()); return 1; }
      if (sync->buckets().size() != 2) return 2;
      for (std::size_t i = 0; i < 3; ++i) {
        if (data[i][0] != 0.0) return 3;  // rank 0's values everywhere
      }
      for (int step = 0; step < 2; ++step) {
        for (std::size_t i = 3; i-- > 0;) {
          auto* g = static_cast<double*>(sync->gradient(i));
          for (std::size_t k = 0; k < counts[i]; ++k) g[k] = static_cast<double>((rank + 1) * static_cast<int>(k % 5 + step));
          if (!sync->markReady(i).ok()) return 4;
        }
        if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 5; }
        for (std::size_t i = 0; i < 3; ++i) {
          const auto* g = static_cast<const double*>(sync->gradient(i));
          for (std::size_t k = 0; k < counts[i]; ++k) {
            if (g[k] != 2.0 * static_cast<double>(k % 5 + static_cast<std::size_t>(step))) return 6;
          }
        }
      }
    }
    return 0;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

// ---- Errors every rank agrees on ------------------------------------------------------------------

// Three float parameters a (8), b (16), c (4) with gradients set to `value`.
struct Small {
  std::vector<float> data[3], grad[3];
  explicit Small(float value = 0) {
    const std::size_t counts[3] = {8, 16, 4};
    for (int i = 0; i < 3; ++i) {
      data[i].assign(counts[i], 0.0f);
      grad[i].assign(counts[i], value);
    }
  }
  std::vector<Parameter> params() {
    std::vector<Parameter> ps;
    const char* names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; ++i) ps.push_back({names[i], data[i].data(), grad[i].data(), data[i].size(), DataType::kFloat32});
    return ps;
  }
  void fill(float v) {
    for (auto& g : grad) std::fill(g.begin(), g.end(), v);
  }
};

// Every check below returns a distinct code, so a failing rank says which one failed.
int expectError(int rank, const Status& s, Code code, const std::vector<std::string>& parts, int rc) {
  if (s.code() != code) { report(rank, "expected " + std::string(codeName(code)) + ", got " + s.toString()); return rc; }
  for (const std::string& p : parts) {
    if (!contains(s.message(), p)) { report(rank, "message lacks '" + p + "': " + s.toString()); return rc; }
  }
  return 0;
}

TEST(GradSyncErrors, MismatchedRegistrationNamesParameterAndRankOnEveryRank) {
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    Small m;
    // Rank 2's parameter b has 15 elements instead of 16.
    std::vector<Parameter> ps = m.params();
    if (rank == 2) ps[1].count = 15;
    Status s = GradSync::create(comm, ps).status();
    if (int rc = expectError(rank, s, Code::kInvalidUsage, {"parameter #1 ('b' here)", "16 x float32 (host) on rank 0",
                                                          "15 x float32 (host) on rank 2"}, 1)) return rc;
    // Rank 1 registers one parameter fewer.
    ps = m.params();
    if (rank == 1) ps.pop_back();
    s = GradSync::create(comm, ps).status();
    if (int rc = expectError(rank, s, Code::kInvalidUsage, {"parameter #2", "on rank 1", "registered 2 parameters"}, 2)) return rc;
    // Rank 1 passes another dtype.
    ps = m.params();
    if (rank == 1) ps[0].dtype = DataType::kFloat64;
    s = GradSync::create(comm, ps).status();
    if (int rc = expectError(rank, s, Code::kInvalidUsage, {"parameter #0", "float64", "on rank 1"}, 3)) return rc;
    // Options differ.
    GradSyncOptions o;
    if (rank == 2) o.bucketCapBytes = 4096;
    s = GradSync::create(comm, m.params(), o).status();
    if (int rc = expectError(rank, s, Code::kInvalidUsage, {"bucketCapBytes", "on rank 2"}, 4)) return rc;
    // A bad argument on one rank: that rank says what, the others name it.
    ps = m.params();
    if (rank == 1) ps[2].memory = ddp::MemoryType::kDevice;
    s = GradSync::create(comm, ps).status();
    if (rank == 1) {
      if (int rc = expectError(rank, s, Code::kInvalidArgument, {"'c'", "device memory"}, 5)) return rc;
    } else if (int rc = expectError(rank, s, Code::kInvalidUsage, {"rank 1 rejected"}, 6)) {
      return rc;
    }
    // The communicator is still usable: a matching registration works.
    if (Status ok = GradSync::create(comm, m.params()).status(); !ok.ok()) { report(rank, ok.toString()); return 7; }
    return 0;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

TEST(GradSyncErrors, MissingMarkReadyIsReportedOnEveryRankAndTheNextStepWorks) {
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    Small m;
    auto sync = GradSync::create(comm, m.params());
    if (!sync.ok()) return 1;
    for (std::size_t i = 0; i < 3; ++i) {
      if (rank == 1 && i == 1) continue;  // rank 1 forgets b
      if (!sync->markReady(i).ok()) return 2;
    }
    if (int rc = expectError(rank, sync->finish(), Code::kInvalidUsage,
                             {"parameter 'b' (#1) was not marked ready", "on rank 1", "allowUnusedParameters"}, 3)) {
      return rc;
    }
    // Marked twice: an error on this rank only, nothing sent, the step goes on.
    m.fill(static_cast<float>(rank));
    for (std::size_t i = 0; i < 3; ++i) if (!sync->markReady(i).ok()) return 4;
    if (int rc = expectError(rank, sync->markReady(2), Code::kInvalidUsage, {"'c'", "twice"}, 5)) return rc;
    if (int rc = expectError(rank, sync->markReady(3), Code::kInvalidArgument, {"index 3"}, 6)) return rc;
    if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 7; }
    for (auto& g : m.grad) for (float v : g) if (v != 1.0f) return 8;  // mean of 0, 1, 2
    return 0;
  }, envFor("tree"), 60);
  expectEveryRankSucceeded(outcome);
}

TEST(GradSyncErrors, UnusedParametersCountAsZeroWhenAllowed) {
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    Small m(static_cast<float>(rank + 1));
    GradSyncOptions o;
    o.allowUnusedParameters = true;
    auto sync = GradSync::create(comm, m.params(), o);
    if (!sync.ok()) return 1;
    // Step 1: rank 1 does not use a; nobody uses c.
    if (rank != 1 && !sync->markReady(0).ok()) return 2;
    if (!sync->markReady(1).ok()) return 3;
    if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 4; }
    const float wantA = (1.0f + 3.0f) / 3.0f;
    for (float v : m.grad[0]) if (v != wantA) { report(rank, "a: " + std::to_string(v)); return 5; }
    for (float v : m.grad[1]) if (v != 2.0f) return 6;
    for (float v : m.grad[2]) if (v != 0.0f) return 7;
    // Step 2, accumulating: c is used only in the noSync micro-batch on rank 0, and still counts.
    m.fill(0.0f);
    {
      auto guard = sync->noSync();
      if (rank == 0) {
        std::fill(m.grad[2].begin(), m.grad[2].end(), 6.0f);
        if (!sync->markReady(2).ok()) return 8;
      }
    }
    if (!sync->markReady(0).ok() || !sync->markReady(1).ok()) return 9;
    if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 10; }
    for (float v : m.grad[2]) if (v != 2.0f) { report(rank, "c: " + std::to_string(v)); return 11; }
    return 0;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

TEST(GradSyncErrors, NanIsReportedWithParameterAndRankOnEveryRank) {
  auto outcome = runDdp(3, [](int rank, Communicator& comm) {
    Small m(1.0f);
    GradSyncOptions o;
    o.checkFinite = true;
    o.bucketCapBytes = o.firstBucketCapBytes = 32;  // one parameter per bucket
    auto sync = GradSync::create(comm, m.params(), o);
    if (!sync.ok()) return 1;
    if (rank == 2) m.grad[1][5] = std::numeric_limits<float>::quiet_NaN();
    if (rank == 0) m.grad[2][0] = std::numeric_limits<float>::infinity();
    for (std::size_t i = 3; i-- > 0;) if (!sync->markReady(i).ok()) return 2;
    if (int rc = expectError(rank, sync->finish(), Code::kInvalidArgument,
                             {"parameter 'b' (#1) has a gradient with NaN or Inf on rank 2", "1 more"}, 3)) {
      return rc;
    }
    if (rank != 2 && m.grad[1][0] != 1.0f) return 4;  // the failed step left the gradients alone
    m.fill(static_cast<float>(rank));
    for (std::size_t i = 3; i-- > 0;) if (!sync->markReady(i).ok()) return 5;
    if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 6; }
    return m.grad[1][5] == 1.0f ? 0 : 7;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

// ---- Wire compression ------------------------------------------------------------------------------

class Compression : public ::testing::TestWithParam<ddp::WireFormat> {};

TEST_P(Compression, AveragesExactlyRepresentableValues) {
  const ddp::WireFormat wf = GetParam();
  auto outcome = runDdp(4, [wf](int rank, Communicator& comm) {
    std::vector<float> f32(300), g32(300);
    std::vector<double> f64(50), g64(50);
    std::vector<Parameter> ps = {{"f32", f32.data(), g32.data(), 300, DataType::kFloat32},
                                 {"f64", f64.data(), g64.data(), 50, DataType::kFloat64}};
    GradSyncOptions o;
    o.wireFormat = wf;
    auto sync = GradSync::create(comm, ps, o);
    if (!sync.ok()) return 1;
    // 0.25 * (rank + 1) * k is exact in fp16 and bf16, and so is its quarter.
    for (std::size_t k = 0; k < 300; ++k) g32[k] = 0.25f * static_cast<float>((rank + 1) * static_cast<int>(k % 8));
    for (std::size_t k = 0; k < 50; ++k) g64[k] = -0.5 * (rank + 1);
    if (!sync->markReady(1).ok() || !sync->markReady(0).ok()) return 2;
    if (Status s = sync->finish(); !s.ok()) { report(rank, s.toString()); return 3; }
    for (std::size_t k = 0; k < 300; ++k) if (g32[k] != 0.625f * static_cast<float>(k % 8)) return 4;  // mean of 1..4 / 4
    for (double v : g64) if (v != -1.25) return 5;
    return 0;
  }, envFor("ring"), 60);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Formats, Compression, ::testing::Values(ddp::WireFormat::kFloat16, ddp::WireFormat::kBfloat16),
                         [](const auto& info) { return info.param == ddp::WireFormat::kFloat16 ? "fp16" : "bf16"; });

// The layer's own part of compression (the conversions themselves are the engine's, tested in the
// unit suite): division before narrowing, rounding to nearest even, overflow to infinity, exact
// widening, float64 sources; and the finite check.
TEST(WireConversions, NarrowDividesFirstRoundsToNearestEvenAndWidensExactly) {
  using namespace ddp::detail;
  const std::vector<float> in = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65520.0f, 6.0f, -2.0f};
  std::vector<std::uint16_t> half(in.size()), bf(in.size());
  narrow(in.data(), DataType::kFloat32, half.data(), DataType::kFloat16, in.size(), 1);
  EXPECT_EQ(half, (std::vector<std::uint16_t>{0x3c00u, 0x3c02u, 0x7c00u, 0x4600u, 0xc000u}));
  narrow(in.data(), DataType::kFloat32, half.data(), DataType::kFloat16, in.size(), 3);
  EXPECT_EQ(half[3], 0x4000u);  // 6 / 3 = 2
  EXPECT_EQ(half[2], 0x7555u);  // 65520 / 3 = 21840, in range once divided
  const std::vector<double> in64 = {1.0 + 0x1p-8, 1.0 + 0x3p-8};
  narrow(in64.data(), DataType::kFloat64, bf.data(), DataType::kBfloat16, 2, 1);
  EXPECT_EQ(bf[0], 0x3f80u);
  EXPECT_EQ(bf[1], 0x3f82u);
  std::vector<double> back(2);
  widen(bf.data(), DataType::kBfloat16, back.data(), DataType::kFloat64, 2);
  EXPECT_EQ(back, (std::vector<double>{1.0, 1.0 + 0x2p-7}));
  EXPECT_FALSE(allFinite(std::vector<float>{1, std::numeric_limits<float>::infinity()}.data(), 2, DataType::kFloat32));
  EXPECT_TRUE(allFinite(std::vector<double>{1, -2}.data(), 2, DataType::kFloat64));
}

// ---- DistributedSampler ----------------------------------------------------------------------------

std::vector<std::vector<std::size_t>> shards(std::size_t size, int ranks, ddp::SamplerOptions o, std::uint64_t epoch) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < ranks; ++r) {
    auto s = ddp::DistributedSampler::create(size, ranks, r, o);
    EXPECT_TRUE(s.ok());
    s->setEpoch(epoch);
    out.push_back(s->indices());
  }
  return out;
}

TEST(DistributedSampler, ShardsCoverTheDatasetWithPaddingOrDropLast) {
  ddp::SamplerOptions o;
  o.seed = 5;
  auto padded = shards(10, 4, o, 0);  // 3 each, 2 repeats
  std::multiset<std::size_t> seen;
  for (auto& s : padded) {
    EXPECT_EQ(s.size(), 3u);
    seen.insert(s.begin(), s.end());
  }
  EXPECT_EQ(seen.size(), 12u);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_GE(seen.count(i), 1u) << i;
  o.dropLast = true;
  auto dropped = shards(10, 4, o, 0);  // 2 each, 8 distinct
  std::set<std::size_t> distinct;
  for (auto& s : dropped) {
    EXPECT_EQ(s.size(), 2u);
    distinct.insert(s.begin(), s.end());
  }
  EXPECT_EQ(distinct.size(), 8u);
  auto tiny = shards(2, 5, {}, 0);  // fewer samples than ranks: wrap around
  for (auto& s : tiny) EXPECT_EQ(s.size(), 1u);
  EXPECT_TRUE(shards(0, 3, {}, 0)[2].empty());
  EXPECT_FALSE(ddp::DistributedSampler::create(10, 4, 4).ok());
  EXPECT_FALSE(ddp::DistributedSampler::create(10, 0, 0).ok());
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpochOnlyAndUnshuffledIsStrided) {
  ddp::SamplerOptions o;
  o.seed = 42;
  EXPECT_EQ(shards(1000, 3, o, 1), shards(1000, 3, o, 1));  // what another rank computes
  EXPECT_NE(shards(1000, 3, o, 1), shards(1000, 3, o, 2));  // setEpoch changes the order
  ddp::SamplerOptions other = o;
  other.seed = 43;
  EXPECT_NE(shards(1000, 3, o, 1), shards(1000, 3, other, 1));
  std::vector<std::size_t> all;
  for (auto& s : shards(1000, 3, o, 1)) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::set<std::size_t>(all.begin(), all.end()).size(), 1000u);  // a permutation, padded by 2
  ddp::SamplerOptions plain;
  plain.shuffle = false;
  EXPECT_EQ(shards(7, 3, plain, 9)[1], (std::vector<std::size_t>{1, 4, 0}));
}

}  // namespace
}  // namespace braid::test
