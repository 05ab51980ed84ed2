// Braid: throughput of the CPU reduce engine next to memcpy on the same sizes, so GB/s compare
// directly. A reduce moves 3 x bytes (reads a and b, writes dst), a memcpy 2 x bytes, and both
// report that as bytes processed: a reduce at memcpy's GB/s is as memory-bound as it can get.
// Sizes are the bytes of one input; 64 KiB stays in L2, 256 MiB is far beyond any LLC.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "braid/types.hpp"
#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace {

using braid::DataType;
using braid::ReduceOp;

// Buffers whose pages are all touched before timing, so page faults are not measured. Values are
// small and well-formed for every type (no NaN, no subnormal), so no slow path gets measured either.
std::vector<unsigned char> makeInput(std::size_t bytes, DataType t, double seed) {
  std::vector<unsigned char> buf(bytes);
  const std::size_t size = braid::dataTypeSize(t);
  const std::size_t count = bytes / size;
  const std::size_t pattern = count < 1024 ? count : 1024;
  for (std::size_t i = 0; i < pattern; ++i) {
    braid::kernels::storeFromDouble(buf.data(), i, t, seed + static_cast<double>(i % 7));
  }
  // Replicate the pattern by doubling; every byte gets written.
  for (std::size_t done = pattern * size; done < count * size; done *= 2) {
    std::memcpy(buf.data() + done, buf.data(), std::min(done, count * size - done));
  }
  return buf;
}

void reduceBench(benchmark::State& state, DataType t, ReduceOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / braid::dataTypeSize(t);
  const std::vector<unsigned char> a = makeInput(bytes, t, 1.0), b = makeInput(bytes, t, 2.0);
  std::vector<unsigned char> dst = makeInput(bytes, t, 0.0);
  for (auto _ : state) {
    braid::kernels::reduce(dst.data(), a.data(), b.data(), count, t, op);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 3 * static_cast<std::int64_t>(bytes));
  state.SetLabel(braid::kernels::isaName());
}

// The same loop on a forced ISA (1 MiB, in L2), to show what each dispatch level buys.
void isaBench(benchmark::State& state, const char* isa, DataType t) {
  braid::kernels::setIsaOverride(isa);
  if (std::strcmp(braid::kernels::isaName(), isa) != 0) {
    braid::kernels::setIsaOverride(nullptr);
    state.SkipWithError("this CPU cannot run that ISA");
    return;
  }
  reduceBench(state, t, ReduceOp::kSum);
  braid::kernels::setIsaOverride(nullptr);
}

// memcpy, and kernels::streamingCopy (stores past the cache), the copy Braid uses from
// largeCopyBytes() up: the pair shows where streaming starts to pay on this machine.
void copyBench(benchmark::State& state, bool streaming) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::vector<unsigned char> src = makeInput(bytes, DataType::kUint8, 1.0);
  std::vector<unsigned char> dst = makeInput(bytes, DataType::kUint8, 0.0);
  for (auto _ : state) {
    if (streaming)
      braid::kernels::streamingCopy(dst.data(), src.data(), bytes);
    else
      std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}

void memcpyBench(benchmark::State& state) { copyBench(state, false); }
void streamingCopyBench(benchmark::State& state) { copyBench(state, true); }

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes : {64LL << 10, 1LL << 20, 4LL << 20, 16LL << 20, 256LL << 20}) b->Arg(bytes);
}

}  // namespace

BENCHMARK_CAPTURE(reduceBench, float32_sum, DataType::kFloat32, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, bfloat16_sum, DataType::kBfloat16, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, float16_sum, DataType::kFloat16, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, int32_sum, DataType::kInt32, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, float64_sum, DataType::kFloat64, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, float32_max, DataType::kFloat32, ReduceOp::kMax)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, float8_e4m3_sum, DataType::kFloat8e4m3, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, float8_e5m2_sum, DataType::kFloat8e5m2, ReduceOp::kSum)->Apply(sizes);
BENCHMARK_CAPTURE(reduceBench, int16_sum, DataType::kInt16, ReduceOp::kSum)->Apply(sizes);
BENCHMARK(memcpyBench)->Apply(sizes);
BENCHMARK(streamingCopyBench)->Apply(sizes);
BENCHMARK_CAPTURE(isaBench, generic_float32_sum, "generic", DataType::kFloat32)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx2_float32_sum, "avx2", DataType::kFloat32)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx512_float32_sum, "avx512", DataType::kFloat32)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, generic_float16_sum, "generic", DataType::kFloat16)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx2_float16_sum, "avx2", DataType::kFloat16)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx512_float16_sum, "avx512", DataType::kFloat16)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, generic_bfloat16_sum, "generic", DataType::kBfloat16)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx2_bfloat16_sum, "avx2", DataType::kBfloat16)->Arg(1 << 20);
BENCHMARK_CAPTURE(isaBench, avx512_bfloat16_sum, "avx512", DataType::kBfloat16)->Arg(1 << 20);
