// braid-status-job: a job for braid status's tests. Every rank all-reduces `--count` floats
// `--calls` times; rank `--busy-rank`, after `--busy-after` calls, spins for `--busy-seconds`
// outside any call (as a rank busy in compute), and the others wait for it inside their next
// all-reduce. The test ends the job when it has seen enough.
//   braid run -n 8 braid-status-job --count 262144 --calls 100000 [--busy-rank R --busy-after K --busy-seconds S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.hpp"

int main(int argc, char** argv) {
  std::size_t count = 262144;
  double busySeconds = 0;
  long calls = 100000;
  int busyRank = -1, busyAfter = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--count") count = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--calls") calls = std::atol(v.c_str());
    else if (k == "--busy-rank") busyRank = std::atoi(v.c_str());
    else if (k == "--busy-after") busyAfter = std::atoi(v.c_str());
    else if (k == "--busy-seconds") busySeconds = std::atof(v.c_str());
    else { std::fprintf(stderr, "unknown argument %s\n", k.c_str()); return 2; }
  }
  auto comm = braid::Communicator::fromEnv();
  if (!comm.ok()) { std::fprintf(stderr, "%s\n", comm.status().toString().c_str()); return 1; }
  std::vector<float> in(count, 1.0f), out(count);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (long call = 0; call < calls; ++call) {
    if (comm->rank() == busyRank && call == busyAfter) {
      const double until = elapsed() + busySeconds;
      volatile double x = 0;
      while (elapsed() < until) x = x + 1;  // compute, outside Braid
    }
    braid::Status s = comm->allReduce(in.data(), out.data(), count, braid::DataType::kFloat32, braid::ReduceOp::kSum).wait();
    if (!s.ok()) { std::fprintf(stderr, "rank %d: %s\n", comm->rank(), s.toString().c_str()); return 1; }
  }
  return 0;
}
