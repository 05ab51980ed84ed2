// Braid: CPU reduction engine (element-wise combine of two buffers), also the test oracle.
#pragma once
#include <cstddef>

#include "braid/types.hpp"

namespace braid::kernels {

// dst[i] = a[i] (op) b[i] for i in [0, count). dst may equal a or b (exactly, not partially overlapping).
// No alignment requirement on any pointer. ReduceOp::kAvg reduces like kSum (the division is a separate pass).
// fp16 and bf16: each element is converted to float, combined in float, and rounded back (round to nearest even).
// Integer sum/prod wrap around (two's complement). Float max/min: when exactly one operand is NaN the
// result is that of the x86 max/min instructions (a NaN in `a` propagates, a NaN in `b` yields `a`);
// every ISA gives the same answer. An invalid type or op does nothing.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t, ReduceOp op);

// x[i] = x[i] / divisor: the final pass of kAvg. Integers: C++ integer division (truncation); floats: IEEE division
// (fp16/bf16 through float, rounded to nearest even). divisor must be positive.
void divide(void* x, std::size_t count, DataType t, int divisor);

// Which vector implementation runtime dispatch chose: "avx512", "avx2" or "generic".
const char* isaName();

// nullptr or "auto": use the best ISA this CPU supports. "generic", "avx2", "avx512": force that one;
// a name this CPU cannot run (or does not know) falls back to "auto". Meant for tests and benchmarks;
// safe to call concurrently with reduce(), though a call in flight may still use the previous choice.
void setIsaOverride(const char* name);

// Scalar element access for tests and checks: element i of buffer p as double / store a double into element i
// (fp16/bf16 rounded to nearest even; integers by static_cast).
double loadAsDouble(const void* p, std::size_t i, DataType t);
void storeFromDouble(void* p, std::size_t i, DataType t, double v);

}  // namespace braid::kernels
