// Braid's driver for the Gloo peer: Gloo's all-reduce (fp32 sum), and its all-gather and
// broadcast (fp32, root 0), over its TCP transport on 127.0.0.1, with the same timing conventions
// and CSV as mpi_bench.cc (the slowest rank's mean per iteration, back to back after a barrier;
// busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for all-gather, whose size is the whole
// gathered array, 1 for broadcast; GB/s = 1e9 B/s).
//
// Gloo has no launcher, so this program is its own: it forks one process per rank, and the
// ranks meet through a gloo::rendezvous::FileStore in a fresh private directory. Processes
// rather than threads, because Braid and MPI run as processes too and Gloo's TCP transport
// spends its time in the kernel and in its own event loop thread, per process.
//
// Algorithms (-a, comma separated; each is a full sweep):
//   ring   gloo::allreduce with AllreduceOptions, RING; out of place (PyTorch's path)
//   bcube  the same with BCUBE
//   hd     gloo::AllreduceHalvingDoubling<float>, in place (Gloo's best on large sizes)
//   lring  gloo::AllreduceRing<float>, in place (Gloo's quickest on small sizes)
//   allgather  gloo::allgather with AllgatherOptions, out of place (not an all-reduce)
//   broadcast  gloo::broadcast with BroadcastOptions from root 0, out of place (not an all-reduce)
// The algorithm objects of hd and lring are built once per size, outside the timed loop, as a
// user who keeps them would; the options of ring and bcube are set up per call, as PyTorch does.
//
// usage: gloo_allreduce -n RANKS [-a ALGOS] [-b MIN] [-e MAX] [-f FACTOR | --sizes S1,S2,...] [-t SECONDS]
//                       [-l LABEL] [-d STOREDIR]
// Sizes take K, M, G suffixes; -b 8 -e 256M -f 4 is the default sweep. The rendezvous directory is
// created under STOREDIR (default /tmp) and removed at the end.
// Output (rank 0, stdout): '#' lines, then the CSV
//   label,ranks,algo,size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,iters
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sizes.h"

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

struct Options {
  int ranks = 2;
  std::vector<std::string> algos = {"ring", "hd"};
  std::size_t minBytes = 8, maxBytes = 256u << 20;
  double factor = 4;
  std::vector<std::size_t> sizes;  // --sizes: an explicit list instead of -b/-e/-f
  double targetSec = 0.2;
  std::string label = "gloo";
  std::string storeParent = "/tmp";
};

using peers::parseSize;
using peers::parseSizeList;
void expandSizes(Options* o) { peers::expandSizes(o->sizes, o->minBytes, o->maxBytes, o->factor); }

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t comma = std::min(s.find(',', start), s.size());
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

bool parseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "-n") o->ranks = std::atoi(v);
    else if (a == "-a") o->algos = splitList(v);
    else if (a == "-b") { if (!parseSize(v, &o->minBytes)) return false; }
    else if (a == "-e") { if (!parseSize(v, &o->maxBytes)) return false; }
    else if (a == "-f") o->factor = std::atof(v);
    else if (a == "-t") o->targetSec = std::atof(v);
    else if (a == "-l") o->label = v;
    else if (a == "-d") o->storeParent = v;
    else if (a == "--sizes") { if (!parseSizeList(v, &o->sizes)) return false; }
    else return false;
  }
  if (argc % 2 == 0) return false;  // an option without its value
  for (const std::string& a : o->algos)
    if (a != "ring" && a != "bcube" && a != "hd" && a != "lring" && a != "allgather" && a != "broadcast") return false;
  return o->ranks >= 1 && o->factor > 1 && o->minBytes >= 4 && o->minBytes <= o->maxBytes && o->targetSec > 0 &&
         !o->algos.empty();
}

float inputValue(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }
float expectedSum(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void sumFloat(void* c, const void* a, const void* b, std::size_t n) {
  gloo::sum<float>(static_cast<float*>(c), static_cast<const float*>(a), static_cast<const float*>(b), n);
}
void maxDouble(void* c, const void* a, const void* b, std::size_t n) {
  gloo::max<double>(static_cast<double*>(c), static_cast<const double*>(a), static_cast<const double*>(b), n);
}
void sumUint64(void* c, const void* a, const void* b, std::size_t n) {
  gloo::sum<std::uint64_t>(static_cast<std::uint64_t*>(c), static_cast<const std::uint64_t*>(a),
                           static_cast<const std::uint64_t*>(b), n);
}

// Small all-reduces that carry the measurement itself; tags apart from the measured calls' tag.
template <typename T>
T reduceScalar(const std::shared_ptr<gloo::Context>& ctx, T mine, void (*fn)(void*, const void*, const void*, std::size_t),
               std::uint32_t tag) {
  T out{};
  gloo::AllreduceOptions opts(ctx);
  opts.setInput(&mine, 1);
  opts.setOutput(&out, 1);
  opts.setReduceFunction(fn);
  opts.setTag(tag);
  gloo::allreduce(opts);
  return out;
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(90);
  gloo::barrier(opts);
}

int runRank(const Options& o, int rank, const std::string& storeDir) {
  gloo::transport::tcp::attr attr("127.0.0.1");
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(storeDir);
  auto rendezvous = std::make_shared<gloo::rendezvous::Context>(rank, o.ranks);
  rendezvous->setTimeout(std::chrono::seconds(120));
  rendezvous->connectFullMesh(store, device);
  std::shared_ptr<gloo::Context> ctx = rendezvous;
  const int n = o.ranks;

  const std::size_t maxCount = o.maxBytes / sizeof(float);
  std::vector<float> send(maxCount), recv(maxCount);  // persistent and touched once
  for (std::size_t i = 0; i < maxCount; ++i) send[i] = inputValue(rank, i);
  if (rank == 0) {
    std::printf("# gloo_allreduce: %d ranks (processes), tcp on 127.0.0.1, fp32 (sum for all-reduce, root 0 for "
                "broadcast), target %.2f s per size\n", n, o.targetSec);
    std::printf("label,ranks,algo,size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,iters\n");
    std::fflush(stdout);
  }
  int failures = 0;
  for (const std::string& algo : o.algos) {
    const bool inPlace = algo == "hd" || algo == "lring";
    const bool gather = algo == "allgather", bcast = algo == "broadcast";
    const std::size_t un = static_cast<std::size_t>(n);
    for (std::size_t requested : o.sizes) {
      // All-gather: a whole number of floats per rank; `count` is the gathered array's.
      const std::size_t per = gather ? requested / sizeof(float) / un : requested / sizeof(float);
      const std::size_t count = gather ? per * un : per;
      const std::size_t bytes = count * sizeof(float);
      if (per == 0) continue;
      std::function<void()> once;
      std::unique_ptr<gloo::Algorithm> kept;
      if (gather) {
        once = [&, per, count] {
          gloo::AllgatherOptions opts(ctx);
          opts.setInput(send.data(), per);
          opts.setOutput(recv.data(), count);
          opts.setTag(1);
          gloo::allgather(opts);
        };
      } else if (bcast) {
        once = [&, count] {
          gloo::BroadcastOptions opts(ctx);
          opts.setRoot(0);
          if (rank == 0) opts.setInput(send.data(), count);
          opts.setOutput(recv.data(), count);
          opts.setTag(1);
          gloo::broadcast(opts);
        };
      } else if (algo == "hd") {
        kept = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, std::vector<float*>{recv.data()},
                                                                        static_cast<int>(count));
      } else if (algo == "lring") {
        kept = std::make_unique<gloo::AllreduceRing<float>>(ctx, std::vector<float*>{recv.data()},
                                                             static_cast<int>(count));
      } else {
        const auto which = algo == "ring" ? gloo::AllreduceOptions::Algorithm::RING
                                          : gloo::AllreduceOptions::Algorithm::BCUBE;
        once = [&, which, count] {
          gloo::AllreduceOptions opts(ctx);
          opts.setAlgorithm(which);
          opts.setInput(send.data(), count);
          opts.setOutput(recv.data(), count);
          opts.setReduceFunction(sumFloat);
          opts.setTag(1);
          gloo::allreduce(opts);
        };
      }
      if (kept) once = [&kept] { kept->run(); };

      if (inPlace) std::copy_n(send.begin(), count, recv.begin());
      else std::fill_n(recv.begin(), count, -1.0f);  // no value left from the previous size may pass
      once();
      std::uint64_t wrong = 0;
      if (gather) {
        for (std::size_t q = 0; q < un; ++q)
          for (std::size_t i = 0; i < per; ++i) wrong += recv[q * per + i] != inputValue(static_cast<int>(q), i);
      } else if (bcast) {
        for (std::size_t i = 0; i < count; ++i) wrong += recv[i] != inputValue(0, i);
      } else {
        for (std::size_t i = 0; i < count; ++i) wrong += recv[i] != expectedSum(n, i);
      }
      wrong = reduceScalar<std::uint64_t>(ctx, wrong, sumUint64, 91);
      failures += wrong != 0;
      if (inPlace) std::fill_n(recv.begin(), count, 0.0f);  // keeps repeated in-place sums finite

      // Warm-up doubles as calibration: batches of 1, 2, 4, ... calls, timed on the slowest rank
      // (every rank sees the same maximum, so all leave the loop together), until a batch of at
      // least 4 calls lasts 10 ms or any batch lasts half the target. The quickest batch sets the
      // estimate: one preempted call must not shrink the timed loop to a handful of iterations.
      double perCall = 1e30;
      for (int k = 1;; k *= 2) {
        barrier(ctx);
        double t0 = now();
        for (int i = 0; i < k; ++i) once();
        double took = reduceScalar<double>(ctx, now() - t0, maxDouble, 92);
        perCall = std::min(perCall, took / k);
        if ((took >= 0.01 && k >= 4) || took >= o.targetSec / 2 || k >= (1 << 16)) break;
      }
      const int iters = static_cast<int>(std::clamp(o.targetSec / perCall, 3.0, 1e6));
      barrier(ctx);
      double t0 = now();
      for (int i = 0; i < iters; ++i) once();
      const double timeUs = reduceScalar<double>(ctx, (now() - t0) / iters, maxDouble, 93) * 1e6;
      if (rank == 0) {
        const double algbw = static_cast<double>(bytes) / timeUs / 1e3;
        const double factor = gather ? static_cast<double>(n - 1) / n : bcast ? 1.0 : 2.0 * (n - 1) / n;
        std::printf("%s,%d,%s,%zu,%zu,float,%s,%d,%.3f,%.4f,%.4f,%llu,%d\n", o.label.c_str(), n, algo.c_str(), bytes,
                    count, gather || bcast ? "none" : "sum", bcast ? 0 : -1, timeUs, algbw, algbw * factor,
                    static_cast<unsigned long long>(wrong), iters);
        std::fflush(stdout);
      }
    }
  }
  barrier(ctx);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: gloo_allreduce -n RANKS [-a ring,bcube,hd,lring,allgather,broadcast] [-b MIN] [-e MAX] [-f FACTOR | --sizes S1,S2,...]\n"
                 "                      [-t SECONDS] [-l LABEL] [-d STOREDIR]\n");
    return 2;
  }
  expandSizes(&o);
  std::string tmpl = o.storeParent + "/gloo-store-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror("gloo_allreduce: mkdtemp");
    return 1;
  }
  const std::string storeDir = tmpl;
  std::fflush(stdout);  // nothing buffered may be duplicated into the children
  std::vector<pid_t> children;
  for (int r = 0; r < o.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo_allreduce: fork");
      for (pid_t c : children) kill(c, SIGTERM);
      break;
    }
    if (pid == 0) {
      int rc = 1;
      try {
        rc = runRank(o, r, storeDir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_allreduce: rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    children.push_back(pid);
  }
  // A failed rank leaves the others waiting for Gloo's timeout: end them at once instead.
  int worst = children.size() == static_cast<std::size_t>(o.ranks) ? 0 : 1;
  for (std::size_t left = children.size(); left > 0; --left) {
    int status = 0;
    pid_t done = waitpid(-1, &status, 0);
    if (done < 0) break;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0 && worst == 0)
      for (pid_t c : children)
        if (c != done) kill(c, SIGTERM);
    worst = std::max(worst, rc);
  }
  std::error_code ec;
  std::filesystem::remove_all(storeDir, ec);
  return worst;
}
