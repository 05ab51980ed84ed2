#include "tools/pattern.h"

#include <algorithm>

#include "kernels/reduce.h"

namespace braid::pattern {
namespace {
bool isUnsigned(DataType t) { return t == DataType::kUint8 || t == DataType::kUint32 || t == DataType::kUint64; }
}  // namespace

double input(DataType t, ReduceOp op, int rank, std::size_t i) {
  if (op == ReduceOp::kProd) return (i + static_cast<std::size_t>(rank)) % 3 == 0 ? 2.0 : 1.0;  // product <= 2^ceil(n/3)
  double v = static_cast<double>((i * 7 + static_cast<std::size_t>(rank) * 3) % 9);            // 0..8
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
