// Loops written for clarity over speed: compression is opt-in, and a bucket is narrowed once per
// step while its all-reduce moves half the bytes. Rounding is to nearest, ties to even, in every
// case (kernels/half.h), so every rank narrows the same value to the same bits.
#include "ddp/numeric.h"

#include <cmath>

#include "kernels/half.h"

namespace braid::ddp::detail {

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
    dst[i] = half ? kernels::floatToHalf(v) : kernels::floatToBf16(v);
  }
}

template <typename T>
void widenLoop(const std::uint16_t* src, T* dst, std::size_t n, bool half) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(half ? kernels::halfToFloat(src[i]) : kernels::bf16ToFloat(src[i]));
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
