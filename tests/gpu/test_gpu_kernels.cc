// The CUDA reduction kernels against the CPU engine (kernels/reduce.h, the oracle): every dtype x op,
// sizes around the 16-byte vector width, co-aligned, differently aligned and byte-misaligned
// pointers, in place (dst == a, dst == b) and out of place. Inputs are random bit patterns
// (NaN, infinities and subnormals included); results must match bit for bit, except that two NaNs
// match whatever their payloads (the CPU's and the GPU's NaN propagation differ by design).
// Without a usable GPU the program prints why and exits 77 (SKIP).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "ddp/numeric.h"
#include "kernels/half.h"
#include "kernels/reduce.h"
#include "kernels/reduce_cuda.h"
#include "tests/gpu/gpu_util.h"

namespace braid::test {
namespace {

// The largest size: 2^20 + 7 on a GPU. On the CPU (the emulation's copy of this program runs the
// kernels thread by thread, tests/fakecuda/simt.h) 70,001, still more vectors than the emulated
// grid's 2,048 threads for every type but the 1-byte ones, so the grid-stride loops run.
const std::size_t kLarge = onEmulation() ? 70001 : (1u << 20) + 7;
const std::size_t kSizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 127, 1000, 4099, kLarge};
struct Offsets { std::size_t d, a, b; bool inBytes; };
const Offsets kOffsets[] = {{0, 0, 0, false}, {1, 1, 1, false}, {0, 1, 2, false}, {3, 3, 3, false},
                            {1, 1, 1, true},  {1, 0, 3, true}};

bool isNan(const std::byte* p, DataType t) {
  switch (t) {
    case DataType::kFloat16: { std::uint16_t h; std::memcpy(&h, p, 2); return (h & 0x7fff) > 0x7c00; }
    case DataType::kBfloat16: { std::uint16_t h; std::memcpy(&h, p, 2); return (h & 0x7fff) > 0x7f80; }
    case DataType::kFloat32: { float f; std::memcpy(&f, p, 4); return std::isnan(f); }
    case DataType::kFloat64: { double f; std::memcpy(&f, p, 8); return std::isnan(f); }
    case DataType::kFloat8e4m3: return (static_cast<unsigned>(*p) & 0x7fu) == 0x7fu;
    case DataType::kFloat8e5m2: return (static_cast<unsigned>(*p) & 0x7fu) > 0x7cu;
    default: return false;
  }
}

// A source's value for the folds below, whose chains the GPU rounds once and the CPU after each
// step: both agree where every partial result is exact. The 8-bit floats hold the integers only up
// to 16 (e4m3) and 8 (e5m2): there sources from the fifth on give the identity of the op.
double foldValue(DataType t, ReduceOp op, int source, double v) {
  const bool fp8 = t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
  return fp8 && source >= 4 ? (op == ReduceOp::kProd ? 1.0 : 0.0) : v;
}

std::size_t countDifferent(const std::byte* got, const std::byte* want, std::size_t n, DataType t) {
  const std::size_t es = dataTypeSize(t);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* g = got + i * es;
    const std::byte* w = want + i * es;
    if (std::memcmp(g, w, es) == 0) continue;
    if (isNan(g, t) && isNan(w, t)) continue;
    ++bad;
  }
  return bad;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  std::byte* at(std::size_t off) const { return static_cast<std::byte*>(p) + off; }
};

enum class Alias { kNone, kDstIsA, kDstIsB };

TEST(GpuKernels, MatchCpuEngineForEveryTypeOpSizeAndAlignment) {
  const std::size_t maxBytes = (kLarge + 8) * 8 + 64;
  DeviceBuffer dA(maxBytes), dB(maxBytes), dD(maxBytes);
  std::vector<std::byte> hA(maxBytes), hB(maxBytes), hD(maxBytes), want(maxBytes), got(maxBytes);
  std::mt19937_64 rng(12345);
  for (auto& x : hA) x = static_cast<std::byte>(rng());
  for (auto& x : hB) x = static_cast<std::byte>(rng());
  ASSERT_EQ(cudaMemcpy(dA.p, hA.data(), maxBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dB.p, hB.data(), maxBytes, cudaMemcpyHostToDevice), cudaSuccess);
  int cases = 0;
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    const std::size_t es = dataTypeSize(t);
    for (int oi = 0; oi < kNumReduceOps; ++oi) {
      const auto op = static_cast<ReduceOp>(oi);
      for (std::size_t n : kSizes) {
        for (const Offsets& o : kOffsets) {
          if (o.inBytes && es == 1) continue;  // the same as element offsets
          for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB}) {
            const std::size_t unit = o.inBytes ? 1 : es;
            const std::size_t offA = o.a * unit, offB = o.b * unit;
            std::size_t offD = o.d * unit;
            if (alias == Alias::kDstIsA) offD = offA;
            if (alias == Alias::kDstIsB) offD = offB;
            const std::size_t bytes = n * es;
            // Puts back the bytes of whichever input dst aliases.
            auto restore = [&] {
              if (alias == Alias::kDstIsA) return cudaMemcpy(dA.at(offD), hA.data() + offD, bytes, cudaMemcpyHostToDevice);
              if (alias == Alias::kDstIsB) return cudaMemcpy(dB.at(offD), hB.data() + offD, bytes, cudaMemcpyHostToDevice);
              return cudaSuccess;
            };
            // Reference on the CPU: dst starts as a copy of whichever input it aliases.
            std::memcpy(want.data(), (alias == Alias::kDstIsB ? hB : hA).data() + offD, bytes);
            const std::byte* ra = alias == Alias::kDstIsA ? want.data() : hA.data() + offA;
            const std::byte* rb = alias == Alias::kDstIsB ? want.data() : hB.data() + offB;
            std::vector<std::byte> ca(ra, ra + bytes), cb(rb, rb + bytes);
            kernels::reduce(want.data(), ca.data(), cb.data(), n, t, op);
            // GPU: restore the aliased input first.
            std::byte* dst = alias == Alias::kDstIsA ? dA.at(offD) : alias == Alias::kDstIsB ? dB.at(offD) : dD.at(offD);
            ASSERT_EQ(restore(), cudaSuccess);
            const std::byte* ga = alias == Alias::kDstIsA ? dst : dA.at(offA);
            const std::byte* gb = alias == Alias::kDstIsB ? dst : dB.at(offB);
            Status s = kernels::gpu::reduce(dst, ga, gb, n, t, op, nullptr);
            ASSERT_TRUE(s.ok()) << s.toString();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
            const std::size_t bad = countDifferent(got.data(), want.data(), n, t);
            ASSERT_EQ(bad, 0u) << dataTypeName(t) << " " << reduceOpName(op) << " n=" << n << " offsets d/a/b " << offD
                               << "/" << offA << "/" << offB << " bytes, alias " << static_cast<int>(alias);
            ++cases;
            // Leave the aliased input as it was for the next case.
            ASSERT_EQ(restore(), cudaSuccess);
          }
        }
      }
    }
  }
  std::printf("%d cases matched the CPU engine\n", cases);
}

TEST(GpuKernels, DivideMatchesCpuEngine) {
  const std::size_t n = 4099;
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    const std::size_t es = dataTypeSize(t);
    for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
      std::vector<std::byte> h(n * es + 8), want, got(n * es + 8);
      for (std::size_t i = 0; i < n; ++i) kernels::storeFromDouble(h.data() + shift, i, t, static_cast<double>(i % 200) - 50);
      want = h;
      kernels::divide(want.data() + shift, n, t, 3);
      DeviceBuffer d(h.size());
      ASSERT_EQ(cudaMemcpy(d.p, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
      Status s = kernels::gpu::divide(d.at(shift), n, t, 3, nullptr);
      ASSERT_TRUE(s.ok()) << s.toString();
      ASSERT_EQ(cudaMemcpy(got.data(), d.p, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(countDifferent(got.data() + shift, want.data() + shift, n, t), 0u) << dataTypeName(t) << " shift " << shift;
    }
  }
}

// convert (the DDP layer's wire formats on device buckets) against the layer's host conversions
// (ddp/numeric.h): float32 and float64 to fp16 and bf16, divided by 1 and by 3, and back,
// on random bit patterns (NaN, infinities, subnormals, values past fp16's range), bit for bit except
// for NaN payloads.
TEST(GpuKernels, ConvertMatchesTheDdpLayersHostConversions) {
  std::mt19937_64 rng(11);
  const std::size_t n = 4099;
  for (DataType wide : {DataType::kFloat32, DataType::kFloat64})
    for (DataType narrow : {DataType::kFloat16, DataType::kBfloat16}) {
      const std::size_t we = dataTypeSize(wide), ne = dataTypeSize(narrow);
      std::vector<std::byte> src(n * we), want(n * ne), got(n * ne);
      for (auto& b : src) b = static_cast<std::byte>(rng());
      DeviceBuffer ds(src.size()), dn(want.size()), dw(src.size());
      ASSERT_EQ(cudaMemcpy(ds.p, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
      for (int divisor : {1, 3}) {
        ddp::detail::narrow(src.data(), wide, want.data(), narrow, n, divisor);
        Status s = kernels::gpu::convert(dn.p, narrow, ds.p, wide, n, divisor, nullptr);
        ASSERT_TRUE(s.ok()) << s.toString();
        ASSERT_EQ(cudaMemcpy(got.data(), dn.p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(countDifferent(got.data(), want.data(), n, narrow), 0u)
            << dataTypeName(wide) << " -> " << dataTypeName(narrow) << " / " << divisor;
      }
      // And back: exact.
      std::vector<std::byte> wantWide(src.size()), gotWide(src.size());
      ddp::detail::widen(want.data(), narrow, wantWide.data(), wide, n);
      Status s = kernels::gpu::convert(dw.p, wide, dn.p, narrow, n, 1, nullptr);
      ASSERT_TRUE(s.ok()) << s.toString();
      ASSERT_EQ(cudaMemcpy(gotWide.data(), dw.p, gotWide.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(countDifferent(gotWide.data(), wantWide.data(), n, wide), 0u) << dataTypeName(narrow) << " -> " << dataTypeName(wide);
    }
  DeviceBuffer x(64);
  EXPECT_EQ(kernels::gpu::convert(x.p, DataType::kInt32, x.p, DataType::kFloat32, 4, 1, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(kernels::gpu::convert(x.at(1), DataType::kFloat16, x.at(8), DataType::kFloat32, 4, 1, nullptr).code(),
            Code::kInvalidArgument);
}

// flagNonFinite: finite values leave the flag alone; one NaN or infinity anywhere (first, middle,
// last element) sets it, for each floating type; integer types never do.
TEST(GpuKernels, FlagNonFiniteFindsOneBadElementAnywhere) {
  const std::size_t n = (1u << 16) + 5;
  DeviceBuffer flag(sizeof(std::int32_t));
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64, DataType::kInt32}) {
    const std::size_t es = dataTypeSize(t);
    std::vector<std::byte> h(n * es);
    for (std::size_t i = 0; i < n; ++i) kernels::storeFromDouble(h.data(), i, t, static_cast<double>(i % 100) - 50);
    DeviceBuffer d(h.size());
    const bool floating = t != DataType::kInt32;
    for (std::size_t bad : {n, std::size_t{0}, n / 2, n - 1}) {  // n: none (and for int32: never)
      std::vector<std::byte> in = h;
      if (bad < n && floating) kernels::storeFromDouble(in.data(), bad, t, bad == n / 2 ? std::nan("") : HUGE_VAL);
      ASSERT_EQ(cudaMemcpy(d.p, in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
      const std::int32_t start = -1;
      ASSERT_EQ(cudaMemcpy(flag.p, &start, 4, cudaMemcpyHostToDevice), cudaSuccess);
      Status s = kernels::gpu::flagNonFinite(d.p, n, t, static_cast<std::int32_t*>(flag.p), 7, nullptr);
      ASSERT_TRUE(s.ok()) << s.toString();
      std::int32_t got = 0;
      ASSERT_EQ(cudaMemcpy(&got, flag.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, bad < n && floating ? 7 : -1) << dataTypeName(t) << ", bad element " << bad;
    }
  }
}

// reduceMany (the CUDA IPC all-reduce's fold) against a chain of the CPU engine's reduce, on small
// integer values (1 and 2, so every sum and product is exact in every type and the float accumulation
// of fp16/bf16 cannot differ from the chain): 1 to 12 sources (one group of 8 and beyond), sizes
// around the vector width, co-aligned (on a 16-byte boundary, and one element past one: a head),
// differently aligned and byte-misaligned pointers, dst separate or equal to the first or the sixth
// source.
TEST(GpuKernels, ReduceManyMatchesAChainOfCpuReductions) {
  const std::size_t sizes[] = {0, 1, 7, 17, 33, 4099, kLarge};
  const int sourceCounts[] = {1, 2, 3, 8, 9, 12};
  const std::size_t maxBytes = kLarge * 8 + 64;
  std::deque<DeviceBuffer> dSrc;  // (DeviceBuffer does not move)
  for (int j = 0; j < 12; ++j) dSrc.emplace_back(maxBytes);
  DeviceBuffer dD(maxBytes);
  std::vector<std::vector<std::byte>> hSrc(12, std::vector<std::byte>(maxBytes));
  std::vector<std::byte> want(maxBytes), got(maxBytes);
  int cases = 0;
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    const std::size_t es = dataTypeSize(t);
    for (int oi = 0; oi < kNumReduceOps; ++oi) {
      const auto op = static_cast<ReduceOp>(oi);
      for (int j = 0; j < 12; ++j)
        for (std::size_t i = 0; i < maxBytes / es; ++i)
          kernels::storeFromDouble(hSrc[j].data(), i, t, foldValue(t, op, j, 1 + static_cast<double>((i * 7 + j * 3) % 2)));
      for (int j = 0; j < 12; ++j)
        ASSERT_EQ(cudaMemcpy(dSrc[j].p, hSrc[j].data(), maxBytes, cudaMemcpyHostToDevice), cudaSuccess);
      for (int nsrc : sourceCounts)
        for (std::size_t n : sizes)
          for (int layout = 0; layout < 4; ++layout)    // co-aligned, element offsets, byte offsets, co-aligned off 16
            for (int alias = 0; alias < 3; ++alias) {   // none, dst = srcs[0], dst = srcs[5]
              if ((alias == 2 && nsrc < 6) || (layout == 2 && es == 1)) continue;
              if (n > 4099 && nsrc != 3 && nsrc != 9) continue;  // the large size: one source count per group shape
              std::vector<std::size_t> off(static_cast<std::size_t>(nsrc));
              // Layout 3 puts every pointer one element past a 16-byte boundary: a vector body with a head.
              for (int j = 0; j < nsrc; ++j) off[j] = layout == 0 ? 16 : layout == 1 ? (j % 3) * es : layout == 2 ? 1 + j % 3 : es;
              std::size_t offD = layout == 0 ? 16 : layout == 1 ? 2 * es : layout == 2 ? 3 : es;
              const std::size_t bytes = n * es;
              std::vector<const void*> srcs;
              for (int j = 0; j < nsrc; ++j) srcs.push_back(dSrc[j].at(off[j]));
              void* dst = dD.at(offD);
              if (alias) {
                const int a = alias == 1 ? 0 : 5;
                dst = const_cast<void*>(srcs[a]);
                offD = off[a];
              }
              // The CPU chain: want = s0 (op) s1 (op) ...
              std::memcpy(want.data(), hSrc[0].data() + off[0], bytes);
              for (int j = 1; j < nsrc; ++j) kernels::reduce(want.data(), want.data(), hSrc[j].data() + off[j], n, t, op);
              Status st = kernels::gpu::reduceMany(&dst, 1, srcs.data(), nsrc, n, t, op, 0, nullptr);
              ASSERT_TRUE(st.ok()) << st.toString();
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              ASSERT_EQ(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
              ASSERT_EQ(countDifferent(got.data(), want.data(), n, t), 0u)
                  << dataTypeName(t) << " " << reduceOpName(op) << " sources " << nsrc << " n=" << n << " layout " << layout
                  << " alias " << alias;
              if (alias) {  // put the overwritten source back
                const int a = alias == 1 ? 0 : 5;
                ASSERT_EQ(cudaMemcpy(dSrc[a].p, hSrc[a].data(), maxBytes, cudaMemcpyHostToDevice), cudaSuccess);
              }
              ++cases;
            }
    }
  }
  std::printf("%d fold cases matched\n", cases);
}

// reduceMany with several destinations (the all-reduce's reduce-and-broadcast step): 2 to 8 sources,
// every op (kAvg with its division fused), destinations equal to the sources (in place everywhere)
// or separate buffers; every destination must hold the CPU engine's chain (and divide).
TEST(GpuKernels, ReduceManyWritesEveryDestinationInPlaceWithTheDivision) {
  const std::size_t n = 4099;
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    const std::size_t es = dataTypeSize(t);
    for (int nsrc : {2, 3, 8})
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin})
    for (bool separate : {false, true}) {
      for (std::size_t shift : {std::size_t{0}, es, std::size_t{1}}) {
        if (shift == 1 && es == 1) continue;
        if (separate && op != ReduceOp::kAvg && shift != 0) continue;  // separate buffers: one layout per op
        std::vector<std::vector<std::byte>> h(static_cast<std::size_t>(nsrc), std::vector<std::byte>(n * es + 16));
        std::deque<DeviceBuffer> d, out;
        std::vector<const void*> srcs;
        std::vector<void*> dsts;
        for (int j = 0; j < nsrc; ++j) {
          // 1 to 2 for products (exact in every type), 0 to 4 otherwise.
          for (std::size_t i = 0; i < n; ++i)
            kernels::storeFromDouble(h[j].data() + shift, i, t,
                                     foldValue(t, op, j, op == ReduceOp::kProd ? 1 + (i + j) % 2 : static_cast<double>((i + 3 * j) % 5)));
          d.emplace_back(n * es + 16);
          ASSERT_EQ(cudaMemcpy(d.back().p, h[j].data(), n * es + 16, cudaMemcpyHostToDevice), cudaSuccess);
          srcs.push_back(d.back().at(shift));
          if (separate) out.emplace_back(n * es + 16);
          dsts.push_back(separate ? out.back().at(shift) : d.back().at(shift));
        }
        std::vector<std::byte> want(n * es);
        std::memcpy(want.data(), h[0].data() + shift, n * es);
        for (int j = 1; j < nsrc; ++j) kernels::reduce(want.data(), want.data(), h[j].data() + shift, n, t, op);
        if (op == ReduceOp::kAvg) kernels::divide(want.data(), n, t, nsrc);
        Status st = kernels::gpu::reduceMany(dsts.data(), nsrc, srcs.data(), nsrc, n, t, op,
                                             op == ReduceOp::kAvg ? nsrc : 0, nullptr);
        ASSERT_TRUE(st.ok()) << st.toString();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<std::byte> got(n * es);
        for (int j = 0; j < nsrc; ++j) {
          ASSERT_EQ(cudaMemcpy(got.data(), dsts[j], n * es, cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(countDifferent(got.data(), want.data(), n, t), 0u)
              << dataTypeName(t) << " " << reduceOpName(op) << " sources " << nsrc << " shift " << shift
              << (separate ? " separate" : " in place") << " destination " << j;
        }
      }
    }
  }
}

TEST(GpuKernels, RejectsBadArguments) {
  EXPECT_EQ(kernels::gpu::reduce(nullptr, nullptr, nullptr, 1, static_cast<DataType>(99), ReduceOp::kSum, nullptr).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(kernels::gpu::reduce(nullptr, nullptr, nullptr, 1, DataType::kFloat32, static_cast<ReduceOp>(9), nullptr).code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(kernels::gpu::reduce(nullptr, nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum, nullptr).ok());
  void* none = nullptr;
  EXPECT_EQ(kernels::gpu::reduceMany(&none, 1, nullptr, 0, 1, DataType::kFloat32, ReduceOp::kSum, 0, nullptr).code(),
            Code::kInvalidArgument);
  const void* nine[9] = {};
  void* two[2] = {};
  EXPECT_EQ(kernels::gpu::reduceMany(two, 2, nine, 9, 1, DataType::kFloat32, ReduceOp::kSum, 0, nullptr).code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace braid::test

int main(int argc, char** argv) {
  braid::test::skipWithoutGpu("gpu-kernels");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
