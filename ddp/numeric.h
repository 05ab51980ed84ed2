// Element loops the gradient layer needs on host buffers: the finite check, and narrowing buckets to
// fp16 / bf16 for the wire and widening them back, with the engine's conversions (kernels/half.h),
// which the GPU kernels for device buckets use too, so that both paths round alike.
#pragma once
#include <cstddef>
#include <cstdint>

#include "braid/ddp.hpp"
#include "braid/types.hpp"

namespace braid::ddp::detail {

// False if any element is NaN or +-Inf. Integer types are always finite.
bool allFinite(const void* data, std::size_t count, DataType t);

// The element type a bucket of `t` travels as under `w`: fp16 or bf16 for float32 and float64
// buckets when compression is on, `t` itself otherwise.
DataType wireType(DataType t, WireFormat w);

// dst[i] = narrow(src[i] / divisor), src of type `from` (float32 or float64), dst fp16 or bf16.
void narrow(const void* src, DataType from, void* dst, DataType to, std::size_t count, int divisor);
// dst[i] = widen(src[i]), src fp16 or bf16, dst float32 or float64.
void widen(const void* src, DataType from, void* dst, DataType to, std::size_t count);

}  // namespace braid::ddp::detail
