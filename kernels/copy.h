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

// streamingCopy when `streaming`, else plainCopy: the one switch the callers' size rules feed.
void copy(void* dst, const void* src, std::size_t n, bool streaming);

// memcpy(dst, src, n), except that from kRepMovsbMinBytes up it is x86's `rep movsb` where that
// was measured faster here. The C library's memcpy decides per CPU model how to copy (and changes
// its mind between versions): on this project's machine type (an AMD Zen 5 VM), Debian 12's glibc
// 2.36 copies such sizes with rep movsb, Debian 13's 2.41 with a vector loop that moves half the
// bytes per second there (67 against 125 GB/s at 64-256 KiB in cache), which made a 1 MiB 2-rank
// all-reduce 2.4x slower. So the first use times both on 64 KiB page-aligned copies (aligned, and
// either side 64 bytes off) and keeps rep movsb when it is 1.2x as fast over the three (geometric
// mean) and slower in none (CPUs with ERMS only; elsewhere, and below the size, memcpy). About
// 0.3 ms, once per process.
void plainCopy(void* dst, const void* src, std::size_t n);
inline constexpr std::size_t kRepMovsbMinBytes = 32 << 10;  // below it glibc's vector loops win (L1)

// x86's `rep movsb` (memcpy elsewhere), what plainCopy uses where it chose it; for the tests.
void repMovsbCopy(void* dst, const void* src, std::size_t n);

// Which plainCopy uses from kRepMovsbMinBytes up, and the measurement that chose it, for braid
// perf's header and braid info: "rep movsb from 32 KiB (rep movsb 1.4x memcpy aligned, ...)".
const char* plainCopyName();

}  // namespace braid::kernels
