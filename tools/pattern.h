// Integer-valued test data and its exact expected result after a reduction over n ranks. Small
// integers make every sum, product, min and max exact in every type (fp16 and bf16 included) and in
// any order, so results are compared for equality, element by element. (The 8-bit floats take
// values from ranks 0-7 only, 4 of them at each index: see input().) Used by `braid perf -c` and
// by the test suites.
#pragma once
#include <cstddef>

#include "braid/types.hpp"

namespace braid::pattern {

// The value rank `rank` contributes at element i (index counted over the whole array).
double input(DataType t, ReduceOp op, int rank, std::size_t i);
void fill(void* buf, std::size_t count, DataType t, ReduceOp op, int rank, std::size_t firstIndex = 0);
// The reduction of input(t, op, r, i) over r = 0..nranks-1, as the type stores it.
double reduced(DataType t, ReduceOp op, int nranks, std::size_t i);
// Elements of buf (element k holds index firstIndex + k) that differ from reduced(); with
// `rootOnly` >= 0, expected values are input(t, op, rootOnly, i) instead (broadcast, gather).
std::size_t countWrong(const void* buf, std::size_t count, DataType t, ReduceOp op, int nranks, std::size_t firstIndex,
                       int rootOnly = -1);

}  // namespace braid::pattern
