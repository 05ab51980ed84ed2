// Test kernels for the gpu suite (see gpu_util.h).
#include <cuda_runtime.h>

#include "tests/gpu/gpu_util.h"

namespace braid::test {
namespace {

// The GPU's nanosecond clock: the delay is measured, not counted in __nanosleep calls, whose length
// CUDA leaves between 0 and twice the request.
__device__ unsigned long long globalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delayedCopy(unsigned char* dst, const unsigned char* src, std::size_t bytes, unsigned delayUs) {
  const unsigned long long until = globalNs() + 1000ull * delayUs;
  while (globalNs() < until) __nanosleep(20000);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void copyBytes(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

unsigned blocksFor(std::size_t bytes) {
  std::size_t b = (bytes + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

}  // namespace

void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream) {
  delayedCopy<<<blocksFor(bytes), 256, 0, stream>>>(static_cast<unsigned char*>(dst),
                                                    static_cast<const unsigned char*>(src), bytes, delayUs);
}

void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copyBytes<<<blocksFor(bytes), 256, 0, stream>>>(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src),
                                                  bytes);
}

}  // namespace braid::test
