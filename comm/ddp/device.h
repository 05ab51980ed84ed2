// The CUDA calls the gradient layer makes for device parameters: bucket memory, and copies and
// zeroing ordered on the GradSync's stream. In a build without CUDA, available() is false and
// create() refuses device parameters before any of the others could run.
#pragma once
#include <cstddef>

#include "braid/status.hpp"

namespace braid::ddp::detail::device {

bool available();
// `bytes` of zeroed device memory on the GPU that holds `near` (a parameter).
Result<std::byte*> allocate(std::size_t bytes, const void* near);
void release(std::byte* p);  // (cudaFree: waits for the device's work first)
// Queued on `stream` (a cudaStream_t; nullptr: the legacy default stream); `what` names the step.
Status copy(void* dst, const void* src, std::size_t bytes, void* stream, const char* what);
Status zero(void* dst, std::size_t bytes, void* stream, const char* what);

}  // namespace braid::ddp::detail::device
