// What ProcessGroupBraid and its point-to-point queue (p2p.h) need to hand tensors to Braid.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/api/include/torch/version.h>
#ifndef BRAID_TORCH_CUDA
#define BRAID_TORCH_CUDA 0
#endif
#if BRAID_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstddef>
#include <optional>

#include "braid/braid.hpp"

namespace braid::torch_backend {

// torch 2.3 and later have unsigned 16-, 32- and 64-bit tensors, which Braid reduces as such, and
// torch 2.1 and later the 8-bit floats (float8_e4m3fn and float8_e5m2).
#define BRAID_TORCH_UINTS (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#define BRAID_TORCH_FLOAT8 (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))

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
    case at::kShort: return braid::DataType::kInt16;
    case at::kByte:
    case at::kBool: return braid::DataType::kUint8;
#if BRAID_TORCH_UINTS
    case at::kUInt16: return braid::DataType::kUint16;
    case at::kUInt32: return braid::DataType::kUint32;
    case at::kUInt64: return braid::DataType::kUint64;
#endif
#if BRAID_TORCH_FLOAT8
    case at::kFloat8_e4m3fn: return braid::DataType::kFloat8e4m3;
    case at::kFloat8_e5m2: return braid::DataType::kFloat8e5m2;
#endif
    default: break;
  }
  TORCH_CHECK(false, "braid: tensors of type ", t,
              " are not supported (Braid has float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64, bool",
              BRAID_TORCH_FLOAT8 ? ", float8_e4m3fn, float8_e5m2" : "",
              BRAID_TORCH_UINTS ? ", uint16, uint32 and uint64)" : "; uint16, uint32 and uint64 with torch >= 2.3)");
}
inline braid::DataType braidType(const at::Tensor& t) { return braidType(t.scalar_type()); }

inline void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

inline std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// Refuses a tensor this build cannot hand Braid: CPU tensors always go; CUDA tensors where the
// backend was built against a torch with CUDA (BRAID_TORCH_CUDA: python/meson.build).
inline void checkDevice(const at::Tensor& t) {
#if BRAID_TORCH_CUDA
  if (t.is_cuda()) return;
#endif
  TORCH_CHECK(t.device().is_cpu(), "braid: ", t.device(), " tensors are not supported by this build of the backend (CPU",
              BRAID_TORCH_CUDA ? " and CUDA" : "", " tensors are; CUDA needs a torch built with CUDA and Braid built with -Dcuda)");
}

// The stream a call on a device tensor is ordered with: torch's current stream on its device, as
// NCCL's calls are (none for a CPU tensor). The call starts after the work queued there before it,
// and work queued there after it sees its result.
inline std::optional<c10::Stream> currentStream(const at::Tensor& t) {
  if (t.device().is_cpu()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
}

// Both tensors of a call on one device (Braid's call reads one and writes the other there).
inline void checkSameDevice(const at::Tensor& a, const at::Tensor& b, const char* what) {
  checkDevice(a);
  checkDevice(b);
  TORCH_CHECK(a.device() == b.device(), "braid: ", what, "'s tensors are on ", a.device(), " and ", b.device(),
              ": they must be on one device");
}

// That stream as Braid's `stream` argument (a cudaStream_t), or nullptr.
inline void* braidStream(const at::Tensor& t) {
#if BRAID_TORCH_CUDA
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
#endif
  return nullptr;
}

}  // namespace braid::torch_backend
