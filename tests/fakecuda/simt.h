// Braid's CUDA kernels (kernels/reduce_cuda.cu) compiled by the host compiler and run on the CPU, so
// that the emulated suite runs their own code, the vector bodies, element-wise heads and tails and
// byte-wise paths included, on every machine (tests/fakecuda/reduce_cuda_simt.cc): the gpu suite's
// kernel program checks them against the CPU engine (gpu-kernels-simt), and the collectives program
// and braid perf use them. A launch becomes a host function on the (emulated) stream that runs
// every thread of every block one after the other, the blocks' threads from last to first: a
// __syncthreads_or then sees every other thread of its block when thread 0 reaches it, which is
// exact for kernels whose only work after that barrier is thread 0's (nonFiniteKernel). A kernel not loaded yet (kernels::gpu::preload) loads at its first launch as
// CUDA's lazy loading does (fakecudaLoadKernel). What it cannot show: races between threads, real
// memory ordering, speed.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// The host compiler's CUDA keywords: plain C++.
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

// The built-in variables, as thread-locals of namespace braid, where the kernels' unqualified names
// find them before CUDA's host declarations (and members such as cudaLaunchConfig_t::gridDim keep theirs).
namespace braid {
inline thread_local dim3 blockIdx, blockDim, gridDim, threadIdx;
}  // namespace braid

extern "C" void fakecudaLoadKernel(const void* kernel, const char* what);  // (fake_cuda.cc)

namespace braid::simt {

inline thread_local int blockOr = 0;  // __syncthreads_or's accumulator for the running block

inline int syncthreadsOr(int v) { return blockOr |= (v != 0); }

// A kernel of the emulation: `work` on `stream`, after what is queued there before it, loaded
// first as CUDA's lazy loading does (fakecudaLoadKernel, keyed by `kernel`, naming `what`).
inline cudaError_t onStream(const void* kernel, const char* what, cudaStream_t stream, std::function<void()> work) {
  fakecudaLoadKernel(kernel, what);
  auto* run = new std::function<void()>(std::move(work));
  const cudaError_t e = cudaLaunchHostFunc(stream, [](void* p) {
    auto* f = static_cast<std::function<void()>*>(p);
    (*f)();
    delete f;
  }, run);
  if (e != cudaSuccess) delete run;
  return e;
}

// cudaLaunchKernelEx for kernels compiled as host functions: the whole grid, on cfg->stream, after
// what is queued there before it (reduce_cuda.cu calls this through BRAID_KERNEL_LAUNCH).
template <class... Params, class... Args>
cudaError_t launch(const cudaLaunchConfig_t* cfg, void (*kernel)(Params...), Args&&... args) {
  return onStream(reinterpret_cast<const void*>(kernel), "a Braid kernel at its first launch", cfg->stream,
                  [kernel, grid = cfg->gridDim, block = cfg->blockDim,
                   params = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)] {
                    braid::gridDim = grid;
                    braid::blockDim = block;
                    for (unsigned b = 0; b < grid.x; ++b) {
                      braid::blockIdx = dim3(b);
                      blockOr = 0;
                      for (unsigned t = block.x; t-- > 0;) {
                        braid::threadIdx = dim3(t);
                        std::apply(kernel, params);
                      }
                    }
                  });
}

}  // namespace braid::simt

#define __syncthreads_or(v) ::braid::simt::syncthreadsOr(v)
#define BRAID_KERNEL_LAUNCH ::braid::simt::launch
using std::isfinite;
