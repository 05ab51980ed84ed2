// Helpers for the gpu suite: whether a usable device is present (asked in a child process, so that
// the test process itself never starts CUDA before it forks its ranks) and two test kernels
// (tests/gpu/gpu_kernels.cu) that make stream ordering observable.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace braid::test {

// "" when a CUDA device can be used; otherwise why not (no driver, no device, ...).
std::string gpuUnavailableReason();
// Prints the reason and exits with 77 (meson's SKIP) when no device can be used.
void skipWithoutGpu(const char* suite);
// Whether "CUDA" is tests/fakecuda's emulation (the programs linked against it; what only a real GPU
// can hold in reasonable time and memory is left out or made smaller there).
bool onEmulation();
// The emulation's fakecudaFailIpcOpens(n) (the process's next n cudaIpcOpenMemHandle calls fail), or
// null on a real GPU.
using FailIpcOpens = void (*)(int);
FailIpcOpens failIpcOpensHook();

// On `stream`: every thread first sleeps about `delayUs`, then dst[0, bytes) = src[0, bytes). A call
// that wrongly starts before the stream reaches it reads the stale contents of dst.
void launchDelayedCopy(void* dst, const void* src, std::size_t bytes, unsigned delayUs, cudaStream_t stream);
// On `stream`: dst[0, bytes) = src[0, bytes), byte by byte, by a kernel (reads the output "just after").
void launchSnapshot(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

}  // namespace braid::test
