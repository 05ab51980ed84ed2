// Braid: picks the reduce loops for this CPU at run time. The library is built for the baseline
// ISA so one binary runs everywhere; the AVX2/AVX-512 copies are only entered after the CPU (and
// the OS, which must save the wider registers) has been checked. Also the scalar element access
// the tests use as their oracle.
#include "kernels/reduce.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "kernels/half.h"
#include "kernels/reduce_impl.h"

namespace braid {

const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat8e4m3: return "float8_e4m3";
    case DataType::kFloat8e5m2: return "float8_e5m2";
    case DataType::kInt16: return "int16";
    case DataType::kUint16: return "uint16";
  }
  return "?";
}

const char* reduceOpName(ReduceOp o) {
  switch (o) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

namespace kernels {
namespace {

#if defined(__x86_64__)
bool cpuHasF16c() {
#if defined(__clang__)
  return true;  // clang 14 cannot query f16c; F16C predates AVX2 on every Intel and AMD core anyway
#else
  return __builtin_cpu_supports("f16c");
#endif
}
bool cpuHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuHasF16c(); }
bool cpuHasAvx512() {
  return cpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#endif

const KernelTable& detectedTable() {
  // A function-local static: initialized once, race-free, on first use.
  static const KernelTable& best = []() -> const KernelTable& {
#if defined(__x86_64__)
    // The libgcc CPU model is filled by a constructor; this may run before it (from another
    // static initializer), so initialize explicitly. Calling it twice is harmless.
    __builtin_cpu_init();
    if (cpuHasAvx512()) return avx512::kTable;
    if (cpuHasAvx2()) return avx2::kTable;
#endif
    return generic::kTable;
  }();
  return best;
}

// nullptr means "use detectedTable()". Relaxed is enough: the tables are immutable constants.
std::atomic<const KernelTable*> gOverride{nullptr};

const KernelTable& activeTable() {
  const KernelTable* forced = gOverride.load(std::memory_order_relaxed);
  return forced != nullptr ? *forced : detectedTable();
}

// Rounds v to float with "round to odd": truncate, then set the last bit if anything was lost.
// Rounding that float once more to fp16/bf16 (at least 2 bits shorter) then gives the correctly
// rounded result of v itself, which a plain double->float->half chain does not on ties.
float roundToOddFloat(double v) {
  const float nearest = static_cast<float>(v);
  if (!std::isfinite(nearest) || static_cast<double>(nearest) == v) return nearest;
  float truncated = nearest;
  if (std::fabs(static_cast<double>(nearest)) > std::fabs(v)) {
    truncated = std::nextafter(nearest, 0.0f);
  }
  std::uint32_t bits = std::bit_cast<std::uint32_t>(truncated);
  bits |= 1u;
  return std::bit_cast<float>(bits);
}

template <class T>
T loadElem(const void* p, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
void storeElem(void* p, std::size_t i, T v) {
  std::memcpy(static_cast<unsigned char*>(p) + i * sizeof(T), &v, sizeof(T));
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t, ReduceOp op) {
  if (!isValid(t) || !isValid(op) || count == 0) return;
  activeTable().reduce[static_cast<int>(t)][static_cast<int>(op)](dst, a, b, count);
}

void divide(void* x, std::size_t count, DataType t, int divisor) {
  if (!isValid(t) || count == 0) return;
  activeTable().divide[static_cast<int>(t)](x, count, divisor);
}

const char* isaName() { return activeTable().name; }

void setIsaOverride(const char* name) {
  const KernelTable* forced = nullptr;
  const std::string_view want = name != nullptr ? name : "auto";
  if (want == "generic") {
    forced = &generic::kTable;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (want == "avx2" && cpuHasAvx2()) forced = &avx2::kTable;
  if (want == "avx512" && cpuHasAvx512()) forced = &avx512::kTable;
#endif
  gOverride.store(forced, std::memory_order_relaxed);
}

double loadAsDouble(const void* p, std::size_t i, DataType t) {
  switch (t) {
    case DataType::kInt8: return loadElem<std::int8_t>(p, i);
    case DataType::kUint8: return loadElem<std::uint8_t>(p, i);
    case DataType::kInt32: return loadElem<std::int32_t>(p, i);
    case DataType::kUint32: return loadElem<std::uint32_t>(p, i);
    case DataType::kInt64: return static_cast<double>(loadElem<std::int64_t>(p, i));
    case DataType::kUint64: return static_cast<double>(loadElem<std::uint64_t>(p, i));
    case DataType::kFloat16: return halfToFloat(loadElem<std::uint16_t>(p, i));
    case DataType::kFloat32: return loadElem<float>(p, i);
    case DataType::kFloat64: return loadElem<double>(p, i);
    case DataType::kBfloat16: return bf16ToFloat(loadElem<std::uint16_t>(p, i));
    case DataType::kFloat8e4m3: return e4m3ToFloat(loadElem<std::uint8_t>(p, i));
    case DataType::kFloat8e5m2: return e5m2ToFloat(loadElem<std::uint8_t>(p, i));
    case DataType::kInt16: return loadElem<std::int16_t>(p, i);
    case DataType::kUint16: return loadElem<std::uint16_t>(p, i);
  }
  return 0.0;
}

void storeFromDouble(void* p, std::size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kInt8: storeElem(p, i, static_cast<std::int8_t>(v)); return;
    case DataType::kUint8: storeElem(p, i, static_cast<std::uint8_t>(v)); return;
    case DataType::kInt32: storeElem(p, i, static_cast<std::int32_t>(v)); return;
    case DataType::kUint32: storeElem(p, i, static_cast<std::uint32_t>(v)); return;
    case DataType::kInt64: storeElem(p, i, static_cast<std::int64_t>(v)); return;
    case DataType::kUint64: storeElem(p, i, static_cast<std::uint64_t>(v)); return;
    case DataType::kFloat16: storeElem(p, i, floatToHalf(roundToOddFloat(v))); return;
    case DataType::kFloat32: storeElem(p, i, static_cast<float>(v)); return;
    case DataType::kFloat64: storeElem(p, i, v); return;
    case DataType::kBfloat16: storeElem(p, i, floatToBf16(roundToOddFloat(v))); return;
    case DataType::kFloat8e4m3: storeElem(p, i, floatToE4m3(roundToOddFloat(v))); return;
    case DataType::kFloat8e5m2: storeElem(p, i, floatToE5m2(roundToOddFloat(v))); return;
    case DataType::kInt16: storeElem(p, i, static_cast<std::int16_t>(v)); return;
    case DataType::kUint16: storeElem(p, i, static_cast<std::uint16_t>(v)); return;
  }
}

}  // namespace kernels
}  // namespace braid
