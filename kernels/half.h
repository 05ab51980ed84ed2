// Braid: IEEE binary16 (fp16), bfloat16 and the two 8-bit floats (float8 e4m3 and e5m2) <->
// binary32 conversion by bit manipulation.
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

// The 8-bit floats, as NCCL and torch have them: e4m3 (torch's float8_e4m3fn: 4 exponent bits,
// bias 7, 3 mantissa bits, no infinity, NaN S.1111.111, largest 448) and e5m2 (5 and 2, bias 15:
// fp16's top byte, with infinities). Decoding is exact. Encoding rounds to nearest, ties to even,
// subnormals included; NaN stays NaN. Past the largest finite value e4m3 saturates to +-448 (it
// has no infinity: a sum that overflows stays a number, as NCCL's saturating conversion makes it)
// and e5m2 rounds to infinity from 61440 on, as fp16 and bf16 do; an infinite float becomes
// e4m3's NaN and e5m2's infinity. Written with plain branches: 8-bit reductions are not yet a
// vectorized path.
template <int kExpBits, int kManBits>
BRAID_HD inline float fp8ToFloat(std::uint8_t b) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> kManBits) & ((1u << kExpBits) - 1u), man = b & ((1u << kManBits) - 1u);
  std::uint32_t bits;
  if (kExpBits == 4 && (b & 0x7fu) == 0x7fu) {
    bits = 0x7fc00000u;  // e4m3's only NaN
  } else if (kExpBits == 5 && exp == 31u) {
    bits = 0x7f800000u | (man << (23 - kManBits)) | (man ? 0x00400000u : 0u);  // inf, or a quiet NaN
  } else if (exp == 0) {  // subnormal: man x 2^(1 - bias - kManBits), exact
    bits = std::bit_cast<std::uint32_t>(static_cast<float>(man) *
                                        std::bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - kBias - kManBits) << 23));
  } else {
    bits = ((exp + 127u - kBias) << 23) | (man << (23 - kManBits));
  }
  return std::bit_cast<float>(bits | sign);
}

template <int kExpBits, int kManBits>
BRAID_HD inline std::uint8_t floatToFp8(float f) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr std::uint32_t kNan = kExpBits == 4 ? 0x7fu : 0x7eu;
  constexpr std::uint32_t kMaxFinite = kExpBits == 4 ? 0x7eu : 0x7bu;
  constexpr std::uint32_t kOverflow = kExpBits == 4 ? 0x7eu : 0x7cu;  // saturate / infinity
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint8_t>(sign | kNan);
  if (ax == 0x7f800000u) return static_cast<std::uint8_t>(sign | (kExpBits == 4 ? kNan : kOverflow));
  constexpr std::uint32_t kSmallestNormal = static_cast<std::uint32_t>(127 + 1 - kBias) << 23;
  if (ax >= kSmallestNormal) {
    // Re-bias and round the dropped mantissa bits to nearest even; a carry bumps the exponent.
    constexpr int kShift = 23 - kManBits;
    const std::uint32_t rebiased = ax - (static_cast<std::uint32_t>(127 - kBias) << 23);
    const std::uint32_t r = (rebiased + ((1u << (kShift - 1)) - 1u) + ((rebiased >> kShift) & 1u)) >> kShift;
    return static_cast<std::uint8_t>(sign | (r > kMaxFinite ? kOverflow : r));
  }
  // Subnormal: |f| / 2^(1 - bias - kManBits) rounded to an integer, nearest even (adding and
  // taking away 2^23 rounds in the FPU's default mode); 2^kManBits is the smallest normal's code.
  const float scaled = std::bit_cast<float>(ax) * std::bit_cast<float>(static_cast<std::uint32_t>(127 - 1 + kBias + kManBits) << 23);
  const float q = (scaled + 8388608.0f) - 8388608.0f;
  return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(q));
}

BRAID_HD inline float e4m3ToFloat(std::uint8_t b) { return fp8ToFloat<4, 3>(b); }
BRAID_HD inline std::uint8_t floatToE4m3(float f) { return floatToFp8<4, 3>(f); }
BRAID_HD inline float e5m2ToFloat(std::uint8_t b) { return fp8ToFloat<5, 2>(b); }
BRAID_HD inline std::uint8_t floatToE5m2(float f) { return floatToFp8<5, 2>(f); }

}  // namespace braid::kernels
