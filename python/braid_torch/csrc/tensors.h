// What ProcessGroupBraid and its point-to-point queue (p2p.h) need to hand tensors to Braid.
#pragma once
#include <ATen/ATen.h>

#include <cstddef>

#include "braid/braid.hpp"

namespace braid::torch_backend {

// Braid's element type for a dtype; bool travels as uint8 (its reductions: process_group.cc).
inline braid::DataType braidType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return braid::DataType::kFloat32;
    case at::kDouble: return braid::DataType::kFloat64;
    case at::kHalf: return braid::DataType::kFloat16;
    case at::kBFloat16: return braid::DataType::kBfloat16;
    case at::kInt: return braid::DataType::kInt32;
    case at::kLong: return braid::DataType::kInt64;
    case at::kChar: return braid::DataType::kInt8;
    case at::kByte:
    case at::kBool: return braid::DataType::kUint8;
    default: break;
  }
  TORCH_CHECK(false, "braid: tensors of type ", t,
              " are not supported (Braid has float32, float64, float16, bfloat16, int8, uint8, int32, int64 and bool)");
}
inline braid::DataType braidType(const at::Tensor& t) { return braidType(t.scalar_type()); }

inline void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

inline std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

}  // namespace braid::torch_backend
