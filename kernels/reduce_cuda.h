// Braid: CUDA reduction kernels (kernels/reduce_cuda.cu), the GPU twin of kernels/reduce.h.
// Compiled only when the build has CUDA (BRAID_HAVE_CUDA); this header needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "braid/status.hpp"
#include "braid/types.hpp"

namespace braid::kernels::gpu {

// dst[i] = a[i] (op) b[i] on `stream` (a cudaStream_t; nullptr is the legacy default stream) for device
// memory (or any memory the current device can address). Asynchronous: returns after the launch.
// Same results, bit for bit, as kernels::reduce: fp16/bf16 combine in float and round to nearest even,
// integers wrap, max/min take x86's NaN rule (a NaN in `a` propagates, a NaN in `b` yields `a`), kAvg
// reduces like kSum. dst may equal a or b exactly. No alignment requirement: 16-byte vector loads run
// where the three pointers share their offset modulo 16, with element-wise heads and tails; pointers
// not aligned to the element size take a byte-wise path. The grid is sized from the multiprocessor count
// of the current device. Errors: invalid argument for a bad type/op; cuda error naming the call otherwise.
Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t, ReduceOp op, void* stream);

// r[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i], folded in source order, divided by
// `divisor` when it is above 1 (kAvg's last step, as divide() does it), and written to each of the
// ndst destinations: the device collectives that read every rank's buffer at once (comm/cuda/cuda_ipc.cc).
// The accumulator is the element type, except fp16 and bf16, which fold (and divide) in float and
// round once per launch (so results may differ from a chain of reduce() calls in the last bit).
// Up to kMaxFoldSources sources run as one launch, where every element is read from all sources
// before any destination is written, so destinations may equal sources exactly. More sources
// (one destination only) chain launches through dst, which may then equal only one of the first
// kMaxFoldSources sources. Alignment as reduce(). 1 to kMaxFoldSources destinations.
inline constexpr int kMaxFoldSources = 8;
Status reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t count, DataType t,
                  ReduceOp op, int divisor, void* stream);

// x[i] = x[i] / divisor, the final pass of kAvg, as kernels::divide.
Status divide(void* x, std::size_t count, DataType t, int divisor, void* stream);

// The DDP layer's wire formats on device buckets: float32 or float64 to float16 or bfloat16, and
// back; pointers aligned to their element size, dst and src not overlapping.
// dst[i] = (to) (src[i] / divisor): the division (when divisor > 1) in the source's arithmetic (float
// for fp16/bf16), then a cast to float for a 16-bit destination and its conversion, rounded to
// nearest even (kernels/half.h), as the host path narrows; widening back is exact.
Status convert(void* dst, DataType to, const void* src, DataType from, std::size_t count, int divisor, void* stream);
// *flag = value if any of the count elements of x is NaN or +-Inf (floating types; other types never
// are); *flag is left alone otherwise.
Status flagNonFinite(const void* x, std::size_t count, DataType t, std::int32_t* flag, std::int32_t value, void* stream);

// Loads every kernel of this file into the current device's context now, once per device and
// process (later calls return at once; a failed load is tried again by the next call). CUDA loads
// kernels lazily by default (since 12.2), and loading one may wait for everything queued in the
// context: a first launch on Braid's proxy thread while a caller's stream is held until that thread
// says "done" would wait for itself. So the proxy calls this when it starts, before it holds any
// stream; a build without code for this GPU fails here, naming the kernel, not at a first launch.
Status preload();

}  // namespace braid::kernels::gpu
