#include "ddp/device.h"

#include <string>

#include "braid_build_config.h"
#if BRAID_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/cuda/cuda_util.h"
#include "kernels/reduce_cuda.h"
#endif

namespace braid::ddp::detail::device {

#if BRAID_HAVE_CUDA

bool available() { return true; }

Result<int> locate(const void* p) {
  cudaPointerAttributes where{};
  cudaError_t e = cudaPointerGetAttributes(&where, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::InvalidArgument(cuda::failedText("cudaPointerGetAttributes", e));
  }
  if (where.type != cudaMemoryTypeDevice && where.type != cudaMemoryTypeManaged)
    return Status::InvalidArgument("not CUDA device memory");
  return where.device;
}

Result<std::byte*> allocate(std::size_t bytes, const void* near, void* stream) {
  auto device = locate(near);
  if (!device.ok()) return device.status();
  cuda::DeviceScope on(*device);
  if (on.error() != cudaSuccess) return cuda::failed(on.failedCall(), on.error());
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::CudaError("GradSync: cannot allocate " + std::to_string(bytes) + " bytes of device bucket memory (" +
                             cuda::failedText("cudaMalloc", e) + "); lower GradSyncOptions::bucketCapBytes or free memory");
  }
  // On the stream: everything the layer does with this memory comes after it there.
  if ((e = cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream))) != cudaSuccess) {
    cudaFree(p);
    return cuda::failed("cudaMemsetAsync (device bucket memory)", e);
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

Status fetch(void* host, const void* src, std::size_t bytes, const char* what) {
  cudaError_t e = cudaMemcpy(host, src, bytes, cudaMemcpyDefault);
  return e == cudaSuccess ? Status::Ok() : cuda::failed(what, e);
}

Status convert(void* dst, DataType to, const void* src, DataType from, std::size_t count, int divisor, void* stream) {
  return kernels::gpu::convert(dst, to, src, from, count, divisor, stream);
}

Status flagNonFinite(const void* x, std::size_t count, DataType t, std::int32_t* flag, std::int32_t value, void* stream) {
  return kernels::gpu::flagNonFinite(x, count, t, flag, value, stream);
}

#else

namespace {
Status none() { return Status::InvalidArgument("GradSync: device parameters need a build with CUDA (-Dcuda=enabled)"); }
}  // namespace

bool available() { return false; }
Result<int> locate(const void*) { return none(); }
Result<std::byte*> allocate(std::size_t, const void*, void*) { return none(); }
void release(std::byte*) {}
Status copy(void*, const void*, std::size_t, void*, const char*) { return none(); }
Status zero(void*, std::size_t, void*, const char*) { return none(); }
Status fetch(void*, const void*, std::size_t, const char*) { return none(); }
Status convert(void*, DataType, const void*, DataType, std::size_t, int, void*) { return none(); }
Status flagNonFinite(const void*, std::size_t, DataType, std::int32_t*, std::int32_t, void*) { return none(); }

#endif

}  // namespace braid::ddp::detail::device
