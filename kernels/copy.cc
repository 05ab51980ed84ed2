#include "kernels/copy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace braid::kernels {

void streamingCopy(void* dst, const void* src, std::size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Plain copy up to the destination's first 16-byte boundary: streaming stores need aligned addresses.
  const std::size_t head = std::min(n, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  for (; n >= 16; n -= 16, d += 16, s += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  std::memcpy(d, s, n);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

namespace {

struct CopyChoice {
  bool repMovsb = false;
  char name[96] = "memcpy";
};

#if defined(__x86_64__)
void repMovsb(void* dst, const void* src, std::size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

// The fastest of 7 rounds of 8 copies of `bytes`, in seconds per copy (in cache after the first).
template <typename F>
double fastest(F&& copyOnce) {
  double best = 1e30;
  for (int round = 0; round < 7; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 8; ++i) copyOnce();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 8);
  }
  return best;
}

CopyChoice choose() {
  CopyChoice c;
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &cx, &d) || !(b & (1u << 9))) {  // ERMS: leaf 7, EBX bit 9
    std::snprintf(c.name, sizeof c.name, "memcpy (no ERMS)");
    return c;
  }
  // Page-aligned buffers, as shm rings are, copied aligned and with either side 64 bytes off (user
  // buffers are anywhere): rep movsb must win by 1.2x over the three and lose none of them (some
  // CPUs copy much slower with rep movsb when only one side is aligned).
  constexpr std::size_t kBytes = 64 << 10, kPage = 4096;
  auto* src = static_cast<unsigned char*>(std::aligned_alloc(kPage, kBytes + kPage));
  auto* dst = static_cast<unsigned char*>(std::aligned_alloc(kPage, kBytes + kPage));
  if (!src || !dst) {
    std::free(src);
    std::free(dst);
    return c;
  }
  std::memset(src, 1, kBytes + kPage);
  std::memset(dst, 0, kBytes + kPage);
  double ratio[3];
  const std::size_t offsets[3][2] = {{0, 0}, {0, 64}, {64, 0}};  // {src, dst}
  for (int k = 0; k < 3; ++k) {
    unsigned char* s = src + offsets[k][0];
    unsigned char* t = dst + offsets[k][1];
    const double lib = fastest([&] {
      std::memcpy(t, s, kBytes);
      asm volatile("" : : "r"(t) : "memory");  // the copy counts
    });
    const double rep = fastest([&] { repMovsb(t, s, kBytes); });
    ratio[k] = rep > 0 ? lib / rep : 1;
  }
  std::free(src);
  std::free(dst);
  // The three together (their geometric mean): one copy's figure moves by 0.2-0.4x from run to run
  // on a VM, which alone flipped the choice between processes of one job.
  const double mean = std::cbrt(ratio[0] * ratio[1] * ratio[2]);
  c.repMovsb = mean >= 1.2 && ratio[0] >= 0.95 && ratio[1] >= 0.95 && ratio[2] >= 0.95;
  char what[32] = "memcpy";
  if (c.repMovsb) std::snprintf(what, sizeof what, "rep movsb from %zu KiB", kRepMovsbMinBytes >> 10);
  std::snprintf(c.name, sizeof c.name, "%s (rep movsb %.1fx memcpy aligned, %.1fx and %.1fx unaligned)", what, ratio[0],
                ratio[1], ratio[2]);
  return c;
}
#else
CopyChoice choose() { return {}; }
#endif

const CopyChoice& choice() {
  static const CopyChoice c = choose();  // once per process, at the first copy that could use it
  return c;
}

}  // namespace

void plainCopy(void* dst, const void* src, std::size_t n) {
#if defined(__x86_64__)
  if (n >= kRepMovsbMinBytes && choice().repMovsb) {
    repMovsb(dst, src, n);
    return;
  }
#endif
  if (n) std::memcpy(dst, src, n);
}

const char* plainCopyName() { return choice().name; }

void repMovsbCopy(void* dst, const void* src, std::size_t n) {
#if defined(__x86_64__)
  repMovsb(dst, src, n);
#else
  if (n) std::memcpy(dst, src, n);
#endif
}

void copy(void* dst, const void* src, std::size_t n, bool streaming) {
  if (streaming)
    streamingCopy(dst, src, n);
  else
    plainCopy(dst, src, n);
}

}  // namespace braid::kernels
