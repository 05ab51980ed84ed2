// The CUDA calls the gradient layer makes for device parameters: bucket memory, and copies and
// zeroing ordered on the GradSync's stream. In a build without CUDA, available() is false and
// create() refuses device parameters before any of the others could run.
#pragma once
#include <cstddef>
#include <cstdint>

#include "braid/status.hpp"
#include "braid/types.hpp"

namespace braid::ddp::detail::device {

bool available();
// Which GPU holds `p`; invalid argument if it is not device memory.
Result<int> locate(const void* p);
// `bytes` of device memory on the GPU that holds `near` (a parameter), zeroed on `stream`.
Result<std::byte*> allocate(std::size_t bytes, const void* near, void* stream);
void release(std::byte* p);  // (cudaFree: waits for the device's work first)
// Queued on `stream` (a cudaStream_t; nullptr: the legacy default stream); `what` names the step.
Status copy(void* dst, const void* src, std::size_t bytes, void* stream, const char* what);
Status zero(void* dst, std::size_t bytes, void* stream, const char* what);
// A synchronous copy from device memory to the host (after the work that wrote it has finished).
Status fetch(void* host, const void* src, std::size_t bytes, const char* what);
// On the stream: dst = (to) (src / divisor), narrowing a bucket to its wire format or widening it
// back, as the host path does (kernels::gpu::convert).
Status convert(void* dst, DataType to, const void* src, DataType from, std::size_t count, int divisor, void* stream);
// On the stream: *flag = value if any element of x is NaN or Inf (kernels::gpu::flagNonFinite).
Status flagNonFinite(const void* x, std::size_t count, DataType t, std::int32_t* flag, std::int32_t value, void* stream);

}  // namespace braid::ddp::detail::device
