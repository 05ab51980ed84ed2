// Braid: element types and reduction operators shared by the C++ API and the reduce engines.
// Values equal NCCL's (and braid.h's braidDataType_t / braidRedOp_t), so casts between them are safe.
#pragma once
#include <cstddef>
#include <cstdint>

#include "braid/export.h"

namespace braid {

enum class DataType : int {
  kInt8 = 0, kUint8, kInt32, kUint32, kInt64, kUint64, kFloat16, kFloat32, kFloat64, kBfloat16,
  kFloat8e4m3, kFloat8e5m2,  // NCCL's values (2.24 on)
  kInt16, kUint16,           // Braid's, after NCCL's
};
inline constexpr int kNumDataTypes = 14;

enum class ReduceOp : int { kSum = 0, kProd, kMax, kMin, kAvg };
inline constexpr int kNumReduceOps = 5;

// Bytes per element; 0 for a value outside the enum.
constexpr std::size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8: case DataType::kUint8: case DataType::kFloat8e4m3: case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16: case DataType::kBfloat16: case DataType::kInt16: case DataType::kUint16: return 2;
    case DataType::kInt32: case DataType::kUint32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kUint64: case DataType::kFloat64: return 8;
  }
  return 0;
}
constexpr bool isValid(DataType t) { return dataTypeSize(t) != 0; }
constexpr bool isValid(ReduceOp o) { return static_cast<int>(o) >= 0 && static_cast<int>(o) < kNumReduceOps; }
// float16, bfloat16, float32, float64 or one of the 8-bit floats.
constexpr bool isFloating(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
}

// "float32", "sum", ...; "?" for a value outside the enum.
BRAID_EXPORT const char* dataTypeName(DataType t);
BRAID_EXPORT const char* reduceOpName(ReduceOp o);

}  // namespace braid
