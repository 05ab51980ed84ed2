// Test kernels for the gpu suite (see gpu_util.h).
#include <cuda_runtime.h>

#include "tests/gpu/gpu_util.h"

namespace braid::test {
namespace {

__global__ void delayedCopy(unsigned char* dst, const unsigned char* src, std::size_t bytes, unsigned delayUs) {
  for (unsigned slept = 0; slept < delayUs; slept += 50) __nanosleep(50000);
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
