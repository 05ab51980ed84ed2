// kernels/reduce_cuda.cu, compiled by the host compiler with tests/fakecuda/simt.h: its kernels run
// on the CPU, a launch at a time on the emulated streams of tests/fakecuda.
#include "tests/fakecuda/simt.h"

// (built with -Wno-unknown-pragmas: the host compiler ignores #pragma unroll)
#include "kernels/reduce_cuda.cu"
