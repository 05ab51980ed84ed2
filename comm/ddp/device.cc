#include "comm/ddp/device.h"

#include <string>

#include "braid_build_config.h"
#if BRAID_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/cuda_util.h"
#endif

namespace braid::ddp::detail::device {

#if BRAID_HAVE_CUDA

bool available() { return true; }

Result<std::byte*> allocate(std::size_t bytes, const void* near) {
  cudaPointerAttributes where{};
  cudaError_t e = cudaPointerGetAttributes(&where, near);
  if (e != cudaSuccess) return cuda::failed("cudaPointerGetAttributes (a device parameter)", e);
  if (where.type != cudaMemoryTypeDevice && where.type != cudaMemoryTypeManaged)
    return Status::InvalidArgument("GradSync: a parameter registered as device memory is not device memory");
  cuda::DeviceScope on(where.device);
  if (on.error() != cudaSuccess) return cuda::failed(on.failedCall(), on.error());
  void* p = nullptr;
  if ((e = cudaMalloc(&p, bytes)) != cudaSuccess) {
    cudaGetLastError();
    return Status::CudaError("GradSync: cannot allocate " + std::to_string(bytes) + " bytes of device bucket memory (" +
                             cuda::failedText("cudaMalloc", e) + "); lower GradSyncOptions::bucketCapBytes or free memory");
  }
  if ((e = cudaMemset(p, 0, bytes)) != cudaSuccess) {
    cudaFree(p);
    return cuda::failed("cudaMemset (device bucket memory)", e);
  }
  return static_cast<std::byte*>(p);
}

void release(std::byte* p) { cudaFree(p); }

Status copy(void* dst, const void* src, std::size_t bytes, void* stream, const char* what) {
  if (!bytes || dst == src) return Status::Ok();
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status::Ok() : cuda::failed(what, e);
}

Status zero(void* dst, std::size_t bytes, void* stream, const char* what) {
  if (!bytes) return Status::Ok();
  cudaError_t e = cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status::Ok() : cuda::failed(what, e);
}

#else

namespace {
Status none() { return Status::InvalidArgument("GradSync: device parameters need a build with CUDA (-Dcuda=enabled)"); }
}  // namespace

bool available() { return false; }
Result<std::byte*> allocate(std::size_t, const void*) { return none(); }
void release(std::byte*) {}
Status copy(void*, const void*, std::size_t, void*, const char*) { return none(); }
Status zero(void*, std::size_t, void*, const char*) { return none(); }

#endif

}  // namespace braid::ddp::detail::device
