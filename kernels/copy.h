// Braid: copying large buffers past the cache.
#pragma once
#include <cstddef>

namespace braid::kernels {

// memcpy(dst, src, n) with streaming (non-temporal) stores: the destination's lines are neither read
// before they are overwritten nor kept in the cache. Once source and destination no longer fit in
// the last-level cache this moves about 1.5x the bytes per second memcpy does (docs/PERFORMANCE.md);
// below that it is slower, so callers choose by size. The stores are fenced before it returns: a
// flag written afterwards is seen after the data. No alignment requirement; the buffers must not
// overlap. Plain memcpy on CPUs without SSE2.
void streamingCopy(void* dst, const void* src, std::size_t n);

// streamingCopy when `streaming`, else memcpy: the one switch the callers' size rules feed.
void copy(void* dst, const void* src, std::size_t n, bool streaming);

}  // namespace braid::kernels
