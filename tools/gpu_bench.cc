// braid-gpu-bench: the CUDA reduction kernel (dst = a + b) against cudaMemcpy device-to-device, in
// one run on one GPU. Bandwidth counts the bytes each moves: the reduction reads two buffers and
// writes one (3 x size), a copy reads one and writes one (2 x size). The ratio to the copy is the
// figure of merit: a memory-bound kernel can at best match the copy's bandwidth. Last, pinned host
// memory to and from the device (bytes counted once), the bound of the staged path.
//   braid-gpu-bench [--bytes SIZE] [--iters N] [--json FILE]     (default 1G, 20)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/config.h"
#include "kernels/reduce_cuda.h"

namespace {

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "braid-gpu-bench: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return false;
}

struct Result {
  std::string name;
  double ms = 0, gbps = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = std::size_t{1} << 30;
  int iters = 20;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--bytes") {
      auto v = braid::parseSize(argv[i + 1]);
      if (!v.ok()) return std::fprintf(stderr, "%s\n", v.status().message().c_str()), 2;
      bytes = *v;
    } else if (a == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (a == "--json") {
      json = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: braid-gpu-bench [--bytes SIZE] [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  int count = 0;
  if (!check(cudaGetDeviceCount(&count), "cudaGetDeviceCount") || count < 1) return 77;
  cudaDeviceProp prop{};
  if (!check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  if (!check(cudaMalloc(&a, bytes), "cudaMalloc") || !check(cudaMalloc(&b, bytes), "cudaMalloc") ||
      !check(cudaMalloc(&c, bytes), "cudaMalloc"))
    return 1;
  // Small integers: every sum is exact and no NaN/inf path is timed.
  if (!check(cudaMemset(a, 0x01, bytes), "cudaMemset") || !check(cudaMemset(b, 0x02, bytes), "cudaMemset")) return 1;
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  auto timeIt = [&](auto&& body, double moved) -> Result {
    for (int w = 0; w < 3; ++w) body();
    cudaEventRecord(t0);
    for (int i = 0; i < iters; ++i) body();
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    Result r;
    r.ms = ms / iters;
    r.gbps = moved / (r.ms * 1e-3) / 1e9;
    return r;
  };
  std::vector<Result> results;
  Result copy = timeIt([&] { cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice); }, 2.0 * static_cast<double>(bytes));
  copy.name = "cudaMemcpy D2D";
  results.push_back(copy);
  for (auto [t, name] : {std::pair{braid::DataType::kFloat32, "reduce float32 sum"},
                         std::pair{braid::DataType::kBfloat16, "reduce bfloat16 sum"}}) {
    const std::size_t n = bytes / braid::dataTypeSize(t);
    braid::Status st;
    Result r = timeIt([&] { st = braid::kernels::gpu::reduce(c, a, b, n, t, braid::ReduceOp::kSum, nullptr); },
                      3.0 * static_cast<double>(n * braid::dataTypeSize(t)));
    if (!st.ok()) return std::fprintf(stderr, "braid-gpu-bench: %s\n", st.toString().c_str()), 1;
    r.name = name;
    results.push_back(r);
  }
  // Pinned host <-> device copies (the bound of the staged path, which moves every byte across once
  // each way): at most 256 MiB of pinned memory, bytes counted once.
  const std::size_t pinnedBytes = bytes < (std::size_t{256} << 20) ? bytes : std::size_t{256} << 20;
  void* pinned = nullptr;
  if (!check(cudaHostAlloc(&pinned, pinnedBytes, cudaHostAllocDefault), "cudaHostAlloc")) return 1;
  std::memset(pinned, 1, pinnedBytes);
  for (auto [kind, name] : {std::pair{cudaMemcpyHostToDevice, "pinned host to device"},
                            std::pair{cudaMemcpyDeviceToHost, "pinned device to host"}}) {
    Result r = timeIt([&] {
      if (kind == cudaMemcpyHostToDevice) cudaMemcpyAsync(c, pinned, pinnedBytes, kind);
      else cudaMemcpyAsync(pinned, c, pinnedBytes, kind);
    }, static_cast<double>(pinnedBytes));
    r.name = name;
    results.push_back(r);
  }
  if (!check(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  cudaFreeHost(pinned);
  std::printf("# braid-gpu-bench: %s, %d SMs, %.2f GiB per buffer, %d iterations\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(bytes) / (1 << 30), iters);
  std::printf("%-24s %10s %10s %12s\n", "kernel", "ms", "GB/s", "vs memcpy");
  for (const Result& r : results) std::printf("%-24s %10.3f %10.1f %11.2fx\n", r.name.c_str(), r.ms, r.gbps, r.gbps / copy.gbps);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) return std::fprintf(stderr, "cannot write %s\n", json.c_str()), 1;
    std::fprintf(f, "{\"device\": \"%s\", \"bytes\": %zu, \"iters\": %d, \"results\": [", prop.name, bytes, iters);
    for (std::size_t i = 0; i < results.size(); ++i)
      std::fprintf(f, "%s{\"name\": \"%s\", \"ms\": %.4f, \"gbps\": %.2f, \"vs_memcpy\": %.3f}", i ? ", " : "",
                   results[i].name.c_str(), results[i].ms, results[i].gbps, results[i].gbps / copy.gbps);
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 0;
}
