// Braid: IEEE binary16 (fp16) and bfloat16 <-> binary32 conversion by bit manipulation.
// Every function is branch-free so GCC can vectorize loops that call it with plain SSE2, and every
// result is exact or rounded to nearest, ties to even, for all inputs: normals, subnormals,
// infinities and NaN (NaNs stay NaN; a float NaN keeps its top payload bits and is quieted). The
// float arithmetic inside never sees or makes a float subnormal that matters, so FTZ/DAZ do not
// change any result.
// These functions carry no target attribute on purpose: they are compiled for the baseline ISA in
// every translation unit and inlined into the ISA-specific loops, so the linker can merge the
// out-of-line copies of different translation units without ever picking up AVX code.
#pragma once
#include <bit>
#include <cstdint>

// Under nvcc (kernels/reduce_cuda.cu) the same functions run on the GPU, so both sides round alike.
#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif

namespace braid::kernels {

// Selects are written as masks rather than ?: on purpose. GCC lowers ?: to branches and sinks the
// float arithmetic that only one arm uses into that branch; under the default -ftrapping-math it
// may not execute a float op speculatively, so the loop could no longer be if-converted and
// vectorized. Masks keep every value used unconditionally.
BRAID_HD inline std::uint32_t maskIf(bool c) { return 0u - static_cast<std::uint32_t>(c); }
BRAID_HD inline std::uint32_t pickBits(std::uint32_t mask, std::uint32_t ifSet, std::uint32_t ifClear) {
  return (ifSet & mask) | (ifClear & ~mask);
}

BRAID_HD inline float halfToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t mag = h & 0x7fffu;
  // Normal numbers: move exponent and mantissa up and re-bias the exponent from 15 to 127.
  const std::uint32_t normal = (mag << 13) + ((127u - 15u) << 23);
  // Inf/NaN: all-ones exponent, mantissa (NaN payload) carried over.
  const std::uint32_t special = (mag << 13) | 0x7f800000u;
  // Subnormals (and zero) are mag * 2^-24: an exact int->float conversion and an exact scaling.
  const float scaled = static_cast<float>(static_cast<std::int32_t>(mag)) * 0x1p-24f;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(scaled);
  std::uint32_t bits = pickBits(maskIf(mag >= 0x7c00u), special, normal);
  bits = pickBits(maskIf(mag < 0x0400u), subnormal, bits);
  return std::bit_cast<float>(bits | sign);
}

BRAID_HD inline std::uint16_t floatToHalf(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  // Normal half range (|f| >= 2^-14): re-bias the exponent by -112 and round the 13 dropped
  // mantissa bits to nearest even; a carry out of the mantissa correctly bumps the exponent.
  // From 65520 (the midpoint above 65504, which rounds to even, i.e. up) on, the answer is inf.
  const std::uint32_t rebiased = ax - ((127u - 15u) << 23);
  const std::uint32_t rounded = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
  const std::uint32_t normal = pickBits(maskIf(ax >= 0x477ff000u), 0x7c00u, rounded);
  // Subnormal half range: adding 0.5f puts the ulp at exactly 2^-24 (the half subnormal step), so
  // the FPU's own round-to-nearest-even does the rounding and the low mantissa bits are the result
  // (1024 = 0x0400, the smallest normal, is the right encoding when rounding carries).
  // The absolute value is rebuilt from bits, so no multiply before it can be fused into the add.
  const float shifted = std::bit_cast<float>(ax) + 0.5f;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u;
  // NaN: quiet it and keep the top 9 payload bits.
  const std::uint32_t nan = 0x7e00u | ((ax >> 13) & 0x01ffu);
  std::uint32_t h = pickBits(maskIf(ax < 0x38800000u), subnormal, normal);
  h = pickBits(maskIf(ax > 0x7f800000u), nan, h);
  return static_cast<std::uint16_t>(h | sign);
}

BRAID_HD inline float bf16ToFloat(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

BRAID_HD inline std::uint16_t floatToBf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  // Round the low 16 bits to nearest even; a carry into the exponent yields the next binade or
  // infinity, which is exactly right. NaN must not go through the rounding (it could become inf).
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>(pickBits(maskIf((x & 0x7fffffffu) > 0x7f800000u), nan, rounded));
}

}  // namespace braid::kernels
