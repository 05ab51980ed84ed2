#include "tools/pattern.h"

#include <algorithm>

#include "kernels/reduce.h"

namespace braid::pattern {
namespace {
bool isUnsigned(DataType t) {
  return t == DataType::kUint8 || t == DataType::kUint16 || t == DataType::kUint32 || t == DataType::kUint64;
}
bool isFp8(DataType t) { return t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2; }
}  // namespace

double input(DataType t, ReduceOp op, int rank, std::size_t i) {
  const std::size_t r = static_cast<std::size_t>(rank);
  if (isFp8(t)) {
    // The 8-bit floats hold the integers only up to 16 (e4m3) and 8 (e5m2): at each index 4 of
    // ranks 0-7 contribute -2..2 (or a factor of 2), the others 0 (or 1), so every partial
    // result is exact for any number of ranks and in any order.
    const bool contributes = r < 8 && (r + i) % 8 < 4;
    if (op == ReduceOp::kProd) return contributes && (i + r) % 2 == 0 ? 2.0 : 1.0;
    return contributes ? static_cast<double>((i * 7 + r * 3) % 5) - 2.0 : 0.0;
  }
  if (op == ReduceOp::kProd) return (i + r) % 3 == 0 ? 2.0 : 1.0;  // product <= 2^ceil(n/3)
  double v = static_cast<double>((i * 7 + r * 3) % 9);  // 0..8
  return isUnsigned(t) ? v : v - 4.0;  // -4..4: sums of up to 8 ranks fit int8
}

void fill(void* buf, std::size_t count, DataType t, ReduceOp op, int rank, std::size_t firstIndex) {
  for (std::size_t k = 0; k < count; ++k) kernels::storeFromDouble(buf, k, t, input(t, op, rank, firstIndex + k));
}

double reduced(DataType t, ReduceOp op, int nranks, std::size_t i) {
  double acc = input(t, op, 0, i);
  for (int r = 1; r < nranks; ++r) {
    double v = input(t, op, r, i);
    switch (op) {
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      default: acc += v; break;
    }
  }
  if (op != ReduceOp::kAvg) return acc;
  // The division is done the way the type does it (integer truncation, float rounding).
  unsigned char one[8];
  kernels::storeFromDouble(one, 0, t, acc);
  kernels::divide(one, 1, t, nranks);
  return kernels::loadAsDouble(one, 0, t);
}

std::size_t countWrong(const void* buf, std::size_t count, DataType t, ReduceOp op, int nranks, std::size_t firstIndex,
                       int rootOnly) {
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < count; ++k) {
    std::size_t i = firstIndex + k;
    double want = rootOnly >= 0 ? input(t, op, rootOnly, i) : reduced(t, op, nranks, i);
    if (kernels::loadAsDouble(buf, k, t) != want) ++wrong;
  }
  return wrong;
}

}  // namespace braid::pattern
