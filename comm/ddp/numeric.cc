// Conversions are written for clarity over speed: compression is opt-in, and a bucket is narrowed
// once per step while its all-reduce moves half the bytes. Rounding is to nearest, ties to even,
// in every case, so every rank narrows the same value to the same bits.
#include "comm/ddp/numeric.h"

#include <bit>
#include <cmath>

namespace braid::ddp::detail {

std::uint16_t floatToHalf(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN stays NaN (quiet)
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // from 65520 up: Inf
  if (ax >= 0x38800000u) {
    // A normal half: re-bias the exponent (127 -> 15) and round away the 13 low mantissa bits; a
    // carry out of the mantissa moves the exponent up, which is the right answer.
    std::uint32_t r = ax - (112u << 23);
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  // Below 2^-14 the half is a subnormal: a multiple of 2^-24. Scaling by 2^24 is exact, and
  // nearbyint rounds to nearest even; 1024 is the encoding of the smallest normal, also right.
  const float scaled = std::bit_cast<float>(ax) * 0x1p24f;
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
}

float halfToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // exact
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

std::uint16_t floatToBfloat16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);  // overflow past the largest finite value correctly gives Inf
  return static_cast<std::uint16_t>(x >> 16);
}

float bfloat16ToFloat(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

namespace {

template <typename T>
bool finiteLoop(const T* p, std::size_t n) {
  // Summing a flag instead of returning early keeps the loop branch-free; a step pays this only
  // with checkFinite on.
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  return bad == 0;
}

bool finite16(const std::uint16_t* p, std::size_t n, std::uint16_t expMask) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += (p[i] & expMask) == expMask;
  return bad == 0;
}

}  // namespace

bool allFinite(const void* data, std::size_t count, DataType t) {
  switch (t) {
    case DataType::kFloat32: return finiteLoop(static_cast<const float*>(data), count);
    case DataType::kFloat64: return finiteLoop(static_cast<const double*>(data), count);
    case DataType::kFloat16: return finite16(static_cast<const std::uint16_t*>(data), count, 0x7c00u);
    case DataType::kBfloat16: return finite16(static_cast<const std::uint16_t*>(data), count, 0x7f80u);
    default: return true;
  }
}

DataType wireType(DataType t, WireFormat w) {
  if (t != DataType::kFloat32 && t != DataType::kFloat64) return t;
  if (w == WireFormat::kFloat16) return DataType::kFloat16;
  if (w == WireFormat::kBfloat16) return DataType::kBfloat16;
  return t;
}

namespace {

template <typename T>
void narrowLoop(const T* src, std::uint16_t* dst, std::size_t n, int divisor, bool half) {
  const T d = static_cast<T>(divisor);
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<float>(divisor == 1 ? src[i] : src[i] / d);
    dst[i] = half ? floatToHalf(v) : floatToBfloat16(v);
  }
}

template <typename T>
void widenLoop(const std::uint16_t* src, T* dst, std::size_t n, bool half) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(half ? halfToFloat(src[i]) : bfloat16ToFloat(src[i]));
}

}  // namespace

void narrow(const void* src, DataType from, void* dst, DataType to, std::size_t count, int divisor) {
  auto* out = static_cast<std::uint16_t*>(dst);
  const bool half = to == DataType::kFloat16;
  if (from == DataType::kFloat64) {
    narrowLoop(static_cast<const double*>(src), out, count, divisor, half);
  } else {
    narrowLoop(static_cast<const float*>(src), out, count, divisor, half);
  }
}

void widen(const void* src, DataType from, void* dst, DataType to, std::size_t count) {
  const auto* in = static_cast<const std::uint16_t*>(src);
  const bool half = from == DataType::kFloat16;
  if (to == DataType::kFloat64) {
    widenLoop(in, static_cast<double*>(dst), count, half);
  } else {
    widenLoop(in, static_cast<float*>(dst), count, half);
  }
}

}  // namespace braid::ddp::detail
