// braid-train-example: data-parallel training in plain C++, the program docs/DDP.md walks through.
//
//   braid run -n 4 build/braid-train-example [--epochs N] [--checkpoint PATH]
//                                                      [--bucket-cap-kib K] [--min-accuracy A]
//
// A small MLP (2 -> 32 -> 32 -> 3, tanh, softmax cross-entropy) with a hand-written forward and
// backward learns which of three rings a point of the plane lies in. Each rank trains on its shard
// of the data (DistributedSampler), gradients are averaged by braid::ddp::GradSync with
// accumulation over 2 micro-batches, rank 0 saves a checkpoint that every rank then loads, and a
// distributed evaluation gathers every rank's predictions so rank 0 can print the accuracy.
// Exit status: 0, or 1 on any error or an accuracy below --min-accuracy.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "braid/ddp.hpp"

namespace {

using braid::DataType;
using braid::ReduceOp;
using braid::Status;

struct Args {
  int epochs = 20;
  std::string checkpoint;  // empty: a temporary file that rank 0 creates and removes
  std::size_t bucketCapKib = 25 * 1024;
  double minAccuracy = 0;
};

bool parseArgs(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    if (k == "--epochs") a.epochs = std::atoi(v.c_str());
    else if (k == "--checkpoint") a.checkpoint = v;
    else if (k == "--bucket-cap-kib") a.bucketCapKib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--min-accuracy") a.minAccuracy = std::atof(v.c_str());
    else return false;
  }
  return a.epochs > 0 && a.bucketCapKib > 0;
}

// The dataset: points in [-1, 1]^2 labelled by ring (radius < 0.45, < 0.8, beyond). Every rank
// generates the same points from the same seed, as every rank would read the same files.
struct Dataset {
  std::vector<float> x;  // 2 per sample
  std::vector<int> y;
  std::size_t size() const { return y.size(); }
};

Dataset makeDataset(std::size_t n, std::uint64_t seed) {
  Dataset d;
  std::uint64_t s = seed;
  auto uniform = [&] {  // xorshift64*: small, deterministic everywhere
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return static_cast<float>((s * 0x2545f4914f6cdd1dull) >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  };
  for (std::size_t i = 0; i < n; ++i) {
    float a = uniform(), b = uniform();
    float r = std::sqrt(a * a + b * b);
    d.x.push_back(a);
    d.x.push_back(b);
    d.y.push_back(r < 0.45f ? 0 : r < 0.8f ? 1 : 2);
  }
  return d;
}

// The model: parameters in forward order (w1 b1 w2 b2 w3 b3), gradients beside them.
constexpr int kWidth[4] = {2, 32, 32, 3};

struct Mlp {
  std::vector<std::vector<float>> param, grad;  // 6 each
  // Seeded by rank on purpose: replicas start different, and GradSync::create makes them rank 0's.
  explicit Mlp(int rank) {
    std::uint64_t s = 12345 + static_cast<std::uint64_t>(rank);
    for (int l = 0; l < 3; ++l) {
      std::size_t in = static_cast<std::size_t>(kWidth[l]), out = static_cast<std::size_t>(kWidth[l + 1]);
      std::vector<float> w(in * out), b(out, 0.0f);
      for (float& v : w) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v = (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f) * 2.0f / std::sqrt(static_cast<float>(in));
      }
      param.push_back(std::move(w));
      param.push_back(std::move(b));
    }
    for (auto& p : param) grad.emplace_back(p.size(), 0.0f);
  }
};

// Activations of one micro-batch, layer by layer.
struct Trace {
  std::vector<std::vector<float>> act;  // act[0] = input, act[3] = softmax output
};

void forward(const Mlp& m, const Dataset& d, const std::vector<std::size_t>& batch, Trace& t) {
  t.act.assign(4, {});
  for (std::size_t i : batch) t.act[0].insert(t.act[0].end(), &d.x[2 * i], &d.x[2 * i] + 2);
  for (int l = 0; l < 3; ++l) {
    const std::size_t in = static_cast<std::size_t>(kWidth[l]), out = static_cast<std::size_t>(kWidth[l + 1]);
    const auto& w = m.param[static_cast<std::size_t>(2 * l)];
    const auto& b = m.param[static_cast<std::size_t>(2 * l + 1)];
    auto& next = t.act[static_cast<std::size_t>(l + 1)];
    next.assign(batch.size() * out, 0.0f);
    for (std::size_t s = 0; s < batch.size(); ++s) {
      const float* a = &t.act[static_cast<std::size_t>(l)][s * in];
      float* z = &next[s * out];
      for (std::size_t o = 0; o < out; ++o) {
        float v = b[o];
        for (std::size_t k = 0; k < in; ++k) v += w[o * in + k] * a[k];
        z[o] = l < 2 ? std::tanh(v) : v;
      }
      if (l == 2) {  // softmax
        float mx = std::max(z[0], std::max(z[1], z[2])), sum = 0;
        for (std::size_t o = 0; o < out; ++o) sum += (z[o] = std::exp(z[o] - mx));
        for (std::size_t o = 0; o < out; ++o) z[o] /= sum;
      }
    }
  }
}

// Adds scale * d(mean loss)/d(param) to the gradients, last layer first, and tells the gradient
// layer as soon as each gradient is final, so its bucket can travel while earlier layers compute.
// Returns the summed loss of the micro-batch.
Status backward(Mlp& m, const Dataset& d, const std::vector<std::size_t>& batch, const Trace& t, float scale,
                braid::ddp::GradSync& sync, double& lossSum) {
  const std::size_t n = batch.size();
  std::vector<float> delta(t.act[3]);  // softmax + cross-entropy: dL/dz = p - onehot
  for (std::size_t s = 0; s < n; ++s) {
    lossSum -= std::log(std::max(t.act[3][s * 3 + static_cast<std::size_t>(d.y[batch[s]])], 1e-12f));
    delta[s * 3 + static_cast<std::size_t>(d.y[batch[s]])] -= 1.0f;
  }
  for (int l = 2; l >= 0; --l) {
    const std::size_t in = static_cast<std::size_t>(kWidth[l]), out = static_cast<std::size_t>(kWidth[l + 1]);
    const std::size_t wi = static_cast<std::size_t>(2 * l);
    auto& gw = m.grad[wi];
    auto& gb = m.grad[wi + 1];
    const auto& a = t.act[static_cast<std::size_t>(l)];
    const float f = scale / static_cast<float>(n);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        const float g = delta[s * out + o] * f;
        gb[o] += g;
        for (std::size_t k = 0; k < in; ++k) gw[o * in + k] += g * a[s * in + k];
      }
    }
    // Bias and weight of layer l are final: hand them over (reverse of registration order).
    if (Status st = sync.markReady(wi + 1); !st.ok()) return st;
    if (Status st = sync.markReady(wi); !st.ok()) return st;
    if (l == 0) break;
    std::vector<float> prev(n * in, 0.0f);  // through w, then through tanh
    const auto& w = m.param[wi];
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t o = 0; o < out; ++o)
        for (std::size_t k = 0; k < in; ++k) prev[s * in + k] += delta[s * out + o] * w[o * in + k];
      for (std::size_t k = 0; k < in; ++k) prev[s * in + k] *= 1.0f - a[s * in + k] * a[s * in + k];
    }
    delta.swap(prev);
  }
  return Status::Ok();
}

// Checkpoint: a magic word, then each parameter as name length, name, count, floats.
bool saveCheckpoint(const std::string& path, const braid::ddp::GradSync& sync) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write("BRAIDCK1", 8);
  for (std::size_t i = 0; i < sync.numParameters(); ++i) {
    const auto& p = sync.parameter(i);
    std::uint64_t len = p.name.size(), count = p.count;
    f.write(reinterpret_cast<const char*>(&len), 8).write(p.name.data(), static_cast<std::streamsize>(len));
    f.write(reinterpret_cast<const char*>(&count), 8);
    f.write(static_cast<const char*>(p.data), static_cast<std::streamsize>(count * sizeof(float)));
  }
  return static_cast<bool>(f.flush());
}

bool loadCheckpoint(const std::string& path, const braid::ddp::GradSync& sync, bool& sameAsMine) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "BRAIDCK1", 8) != 0) return false;
  sameAsMine = true;
  for (std::size_t i = 0; i < sync.numParameters(); ++i) {
    const auto& p = sync.parameter(i);
    std::uint64_t len = 0, count = 0;
    if (!f.read(reinterpret_cast<char*>(&len), 8) || len != p.name.size()) return false;
    std::string name(len, '\0');
    f.read(name.data(), static_cast<std::streamsize>(len)).read(reinterpret_cast<char*>(&count), 8);
    if (!f || name != p.name || count != p.count) return false;
    std::vector<float> values(count);
    if (!f.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)))) return false;
    sameAsMine = sameAsMine && std::memcmp(values.data(), p.data, count * sizeof(float)) == 0;
    std::memcpy(p.data, values.data(), count * sizeof(float));
  }
  return true;
}

int fail(const std::string& what, const Status& s) {
  std::cerr << what << ": " << s.toString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parseArgs(argc, argv, args)) {
    std::cerr << "usage: braid run -n N " << argv[0]
              << " [--epochs N] [--checkpoint PATH] [--bucket-cap-kib K] [--min-accuracy A]\n";
    return 2;
  }
  // 1. Ranks and world size, 2. rendezvous: braid run (or torchrun) sets RANK, WORLD_SIZE,
  // MASTER_ADDR and MASTER_PORT; rank 0 hosts the store and everyone meets there.
  auto comm = braid::Communicator::fromEnv();
  if (!comm.ok()) return fail("init", comm.status());
  const int rank = comm->rank(), world = comm->size();

  // 3. Sampler: each rank sees its own shard; the shuffle depends on seed + epoch.
  const Dataset train = makeDataset(4096, 1), test = makeDataset(1000, 2);
  auto sampler = braid::ddp::DistributedSampler::create(train.size(), *comm, {.shuffle = true, .seed = 7});
  if (!sampler.ok()) return fail("sampler", sampler.status());

  // 4. Wrapping: register the parameters (forward order) with the gradient layer.
  Mlp model(rank);
  const char* names[6] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
  std::vector<braid::ddp::Parameter> params;
  for (std::size_t i = 0; i < 6; ++i) {
    params.push_back({names[i], model.param[i].data(), model.grad[i].data(), model.param[i].size(), DataType::kFloat32});
  }
  braid::ddp::GradSyncOptions options;
  options.bucketCapBytes = args.bucketCapKib * 1024;
  options.firstBucketCapBytes = std::min(options.firstBucketCapBytes, options.bucketCapBytes);
  auto sync = braid::ddp::GradSync::create(*comm, params, options);
  if (!sync.ok()) return fail("GradSync::create", sync.status());
  if (rank == 0) {
    std::cout << "world size " << world << ", " << sync->buckets().size() << " bucket(s), "
              << sampler->numSamples() << " training samples per rank per epoch\n";
  }

  // 5. Training, with 8. accumulation: 2 micro-batches per step, the first inside noSync().
  constexpr std::size_t kMicro = 2, kPerMicro = 8;  // per rank: global batch = world * 16
  const float lr = 0.5f;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    sampler->setEpoch(static_cast<std::uint64_t>(epoch));  // forget this and every epoch repeats the order
    const std::vector<std::size_t> mine = sampler->indices();
    double loss[2] = {0, 0};  // summed loss, samples
    for (std::size_t start = 0; start + kMicro * kPerMicro <= mine.size(); start += kMicro * kPerMicro) {
      for (std::size_t m = 0; m < kMicro; ++m) {
        std::vector<std::size_t> batch(mine.begin() + static_cast<std::ptrdiff_t>(start + m * kPerMicro),
                                       mine.begin() + static_cast<std::ptrdiff_t>(start + (m + 1) * kPerMicro));
        Trace t;
        forward(model, train, batch, t);
        Status s;
        if (m + 1 < kMicro) {
          auto guard = sync->noSync();  // accumulate locally, send nothing
          s = backward(model, train, batch, t, 1.0f / kMicro, *sync, loss[0]);
        } else {
          s = backward(model, train, batch, t, 1.0f / kMicro, *sync, loss[0]);
        }
        if (!s.ok()) return fail("backward", s);
        loss[1] += static_cast<double>(batch.size());
      }
      if (Status s = sync->finish(); !s.ok()) return fail("finish", s);  // gradients now averaged
      for (std::size_t i = 0; i < 6; ++i) {
        for (std::size_t k = 0; k < model.param[i].size(); ++k) model.param[i][k] -= lr * model.grad[i][k];
        std::fill(model.grad[i].begin(), model.grad[i].end(), 0.0f);
      }
    }
    if (Status s = comm->allReduce(loss, loss, 2, DataType::kFloat64, ReduceOp::kSum).wait(); !s.ok()) {
      return fail("loss all-reduce", s);
    }
    if (rank == 0) std::printf("epoch %d: mean training loss %.4f\n", epoch, loss[0] / loss[1]);
  }

  // 6. Checkpoint: rank 0 writes, everyone waits for the file, everyone loads it.
  char path[256] = {};
  if (rank == 0) {
    std::string p = args.checkpoint;
    if (p.empty()) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "braid-train-example-XXXXXX").string();
      int fd = mkstemp(tmpl.data());
      if (fd < 0) return fail("checkpoint", Status::SystemError("mkstemp failed in the temp directory"));
      close(fd);
      p = tmpl;
    }
    if (p.size() >= sizeof(path) || !saveCheckpoint(p, *sync)) {
      return fail("checkpoint", Status::SystemError("cannot write " + p));
    }
    std::snprintf(path, sizeof(path), "%s", p.c_str());
  }
  // The path travels with the broadcast, which also says the file is complete.
  if (Status s = comm->broadcast(path, path, sizeof(path), DataType::kUint8, 0).wait(); !s.ok()) {
    return fail("broadcast checkpoint path", s);
  }
  bool same = false;
  if (!loadCheckpoint(path, *sync, same)) return fail("checkpoint", Status::SystemError(std::string("cannot read ") + path));
  if (!same) return fail("checkpoint", Status::Internal("this rank's replica differs from rank 0's checkpoint"));
  if (Status s = comm->barrier().wait(); !s.ok()) return fail("barrier", s);
  if (rank == 0) {
    std::cout << "checkpoint " << path << " saved by rank 0, loaded by all " << world << " ranks\n";
    if (args.checkpoint.empty()) std::filesystem::remove(path);
  }

  // 7. Evaluation: each rank predicts its shard; the (index, prediction) pairs are gathered, and
  // rank 0 counts each test index once (the sampler pads the last round with repeats).
  auto evalSampler = braid::ddp::DistributedSampler::create(test.size(), *comm, {.shuffle = false});
  if (!evalSampler.ok()) return fail("sampler", evalSampler.status());
  const std::vector<std::size_t> mine = evalSampler->indices();
  Trace t;
  forward(model, test, mine, t);
  std::vector<std::int64_t> pairs;
  for (std::size_t s = 0; s < mine.size(); ++s) {
    const float* p = &t.act[3][s * 3];
    pairs.push_back(static_cast<std::int64_t>(mine[s]));
    pairs.push_back(std::max_element(p, p + 3) - p);
  }
  std::vector<std::int64_t> all(pairs.size() * static_cast<std::size_t>(world));
  if (Status s = comm->allGather(pairs.data(), all.data(), pairs.size(), DataType::kInt64).wait(); !s.ok()) {
    return fail("all-gather predictions", s);
  }
  int verdict = 0;
  if (rank == 0) {
    std::vector<int> prediction(test.size(), -1);
    for (std::size_t k = 0; k < all.size(); k += 2) prediction[static_cast<std::size_t>(all[k])] = static_cast<int>(all[k + 1]);
    std::size_t right = 0;
    for (std::size_t i = 0; i < test.size(); ++i) right += prediction[i] == test.y[i];
    const double accuracy = static_cast<double>(right) / static_cast<double>(test.size());
    std::printf("test accuracy: %.4f (%zu of %zu)\n", accuracy, right, test.size());
    verdict = accuracy >= args.minAccuracy ? 0 : 1;
  }
  // Every rank learns the verdict, so they all exit with it.
  if (Status s = comm->broadcast(&verdict, &verdict, 1, DataType::kInt32, 0).wait(); !s.ok()) {
    return fail("broadcast verdict", s);
  }
  return verdict;
}
