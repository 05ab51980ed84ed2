// Braid: the element loops behind kernels::reduce and kernels::divide, written once and compiled
// once per ISA. A translation unit that instantiates them defines, before including this header:
//   BRAID_KERNEL_ISA     the namespace to put this copy in (generic, avx2, avx512), so copies built
//                        for different ISAs never share a mangled name and cannot be merged by the linker;
//   BRAID_KERNEL_TARGET  a function attribute such as __attribute__((target("avx2"))), or nothing;
//   BRAID_KERNEL_F16C    0, or 256 / 512 to convert fp16 with F16C / AVX-512 at that vector width.
// It then defines its table with `const KernelTable kTable = makeTable("name");`.
// Without BRAID_KERNEL_ISA only KernelTable and the table declarations are visible (for the dispatcher).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "braid/types.hpp"
#include "kernels/half.h"

namespace braid::kernels {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, std::size_t count);
using DivideFn = void (*)(void* x, std::size_t count, int divisor);

struct KernelTable {
  const char* name;
  ReduceFn reduce[kNumDataTypes][kNumReduceOps];
  DivideFn divide[kNumDataTypes];
};

namespace generic { extern const KernelTable kTable; }
#if defined(__x86_64__)
namespace avx2 { extern const KernelTable kTable; }
namespace avx512 { extern const KernelTable kTable; }
#endif

}  // namespace braid::kernels

#if defined(BRAID_KERNEL_ISA)
#if BRAID_KERNEL_F16C
// GCC 12's AVX-512 intrinsics seed their pass-through operand with a self-initialized variable
// (_mm512_undefined_ps), which -Wmaybe-uninitialized flags once inlined (GCC PR 105593). The
// warning is attributed to the header's lines, so silencing it around the include is enough.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace braid::kernels::BRAID_KERNEL_ISA {

// Elements per inner block. The inner loop has a constant trip count that every vector width
// divides, which lets GCC vectorize it even under -O2's "very cheap" cost model (no epilogue, no
// runtime alias check thanks to ivdep); the tail of fewer than kBlock elements runs scalar.
inline constexpr std::size_t kBlock = 64;
#if defined(__clang__)
#define BRAID_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define BRAID_IVDEP _Pragma("GCC ivdep")
#endif

// Buffers carry no alignment promise, so every access goes through memcpy, which GCC turns into
// plain (unaligned) loads and stores and still vectorizes.
template <class S>
inline S loadAt(const unsigned char* p, std::size_t i) {
  S v;
  std::memcpy(&v, p + i * sizeof(S), sizeof(S));
  return v;
}
template <class S>
inline void storeAt(unsigned char* p, std::size_t i, S v) {
  std::memcpy(p + i * sizeof(S), &v, sizeof(S));
}

// A codec maps storage to the type arithmetic happens in and back.
template <class S>
struct PlainCodec {
  using Storage = S;
  using Value = S;
  static Value load(S s) { return s; }
  static S store(Value v) { return v; }
};
struct HalfCodec {
  using Storage = std::uint16_t;
  using Value = float;
  static float load(std::uint16_t s) { return halfToFloat(s); }
  static std::uint16_t store(float v) { return floatToHalf(v); }
};
template <int kExpBits, int kManBits>
struct Fp8Codec {
  using Storage = std::uint8_t;
  using Value = float;
  static float load(std::uint8_t s) { return fp8ToFloat<kExpBits, kManBits>(s); }
  static std::uint8_t store(float v) { return floatToFp8<kExpBits, kManBits>(v); }
};
struct Bf16Codec {
  using Storage = std::uint16_t;
  using Value = float;
  static float load(std::uint16_t s) { return bf16ToFloat(s); }
  static std::uint16_t store(float v) { return floatToBf16(v); }
};

template <DataType T> struct CodecFor;
template <> struct CodecFor<DataType::kInt8> : PlainCodec<std::int8_t> {};
template <> struct CodecFor<DataType::kUint8> : PlainCodec<std::uint8_t> {};
template <> struct CodecFor<DataType::kInt32> : PlainCodec<std::int32_t> {};
template <> struct CodecFor<DataType::kUint32> : PlainCodec<std::uint32_t> {};
template <> struct CodecFor<DataType::kInt64> : PlainCodec<std::int64_t> {};
template <> struct CodecFor<DataType::kUint64> : PlainCodec<std::uint64_t> {};
template <> struct CodecFor<DataType::kFloat16> : HalfCodec {};
template <> struct CodecFor<DataType::kFloat32> : PlainCodec<float> {};
template <> struct CodecFor<DataType::kFloat64> : PlainCodec<double> {};
template <> struct CodecFor<DataType::kBfloat16> : Bf16Codec {};
template <> struct CodecFor<DataType::kFloat8e4m3> : Fp8Codec<4, 3> {};
template <> struct CodecFor<DataType::kFloat8e5m2> : Fp8Codec<5, 2> {};
template <> struct CodecFor<DataType::kInt16> : PlainCodec<std::int16_t> {};
template <> struct CodecFor<DataType::kUint16> : PlainCodec<std::uint16_t> {};

// Signed overflow is undefined, so signed sum/prod run in the unsigned type of the same width,
// which wraps exactly like two's complement hardware does.
template <class T, bool kSignedInt = std::is_integral_v<T> && std::is_signed_v<T>>
struct Wrap { using Type = T; };
template <class T>
struct Wrap<T, true> { using Type = std::make_unsigned_t<T>; };
template <class T>
using WrapType = typename Wrap<T>::Type;

struct SumOp {
  template <class T>
  static T apply(T x, T y) { return static_cast<T>(static_cast<WrapType<T>>(x) + static_cast<WrapType<T>>(y)); }
};
struct ProdOp {
  template <class T>
  static T apply(T x, T y) { return static_cast<T>(static_cast<WrapType<T>>(x) * static_cast<WrapType<T>>(y)); }
};
// Written so GCC maps them onto maxps/minps(y, x): with a NaN the second operand, x, comes out.
// The F16C path below uses the same instructions with the same operand order.
struct MaxOp {
  template <class T>
  static T apply(T x, T y) { return y > x ? y : x; }
};
struct MinOp {
  template <class T>
  static T apply(T x, T y) { return y < x ? y : x; }
};

template <ReduceOp O> struct OpFor { using Type = SumOp; };  // kSum and kAvg
template <> struct OpFor<ReduceOp::kProd> { using Type = ProdOp; };
template <> struct OpFor<ReduceOp::kMax> { using Type = MaxOp; };
template <> struct OpFor<ReduceOp::kMin> { using Type = MinOp; };

template <class C, class Op>
inline void combineAt(unsigned char* d, const unsigned char* a, const unsigned char* b, std::size_t i) {
  using S = typename C::Storage;
  storeAt<S>(d, i, C::store(Op::apply(C::load(loadAt<S>(a, i)), C::load(loadAt<S>(b, i)))));
}

#if BRAID_KERNEL_F16C
// fp16 through the hardware converters, which round to nearest even exactly like floatToHalf.
// Returns how many elements it handled; the caller finishes the rest with the portable loop.
template <class Op>
BRAID_KERNEL_TARGET std::size_t reduceHalfHw(unsigned char* d, const unsigned char* a, const unsigned char* b,
                                             std::size_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#if BRAID_KERNEL_F16C == 512
  using Vec = __m512;
  constexpr std::size_t kLanes = 16;
#define BRAID_HALF_LOAD(p) _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
#define BRAID_HALF_STORE(p, v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, kRound))
#define BRAID_HALF_OP(name) _mm512_##name##_ps
#else
  using Vec = __m256;
  constexpr std::size_t kLanes = 8;
#define BRAID_HALF_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define BRAID_HALF_STORE(p, v) _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound))
#define BRAID_HALF_OP(name) _mm256_##name##_ps
#endif
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec x = BRAID_HALF_LOAD(a + 2 * i);
    const Vec y = BRAID_HALF_LOAD(b + 2 * i);
    Vec r;
    if constexpr (std::is_same_v<Op, SumOp>) {
      r = BRAID_HALF_OP(add)(x, y);
    } else if constexpr (std::is_same_v<Op, ProdOp>) {
      r = BRAID_HALF_OP(mul)(x, y);
    } else if constexpr (std::is_same_v<Op, MaxOp>) {
      r = BRAID_HALF_OP(max)(y, x);
    } else {
      r = BRAID_HALF_OP(min)(y, x);
    }
    BRAID_HALF_STORE(d + 2 * i, r);
  }
#undef BRAID_HALF_LOAD
#undef BRAID_HALF_STORE
#undef BRAID_HALF_OP
  return i;
}
#endif

template <class C, class Op>
BRAID_KERNEL_TARGET void reduceLoop(void* dst, const void* src0, const void* src1, std::size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* a = static_cast<const unsigned char*>(src0);
  const auto* b = static_cast<const unsigned char*>(src1);
  std::size_t i = 0;
#if BRAID_KERNEL_F16C
  if constexpr (std::is_base_of_v<HalfCodec, C>) i = reduceHalfHw<Op>(d, a, b, n);
#endif
  // dst may be a or b, but element i is read before it is written and never read again, so
  // there is no dependence between iterations: exactly what ivdep promises.
  for (; i + kBlock <= n; i += kBlock) {
    BRAID_IVDEP
    for (std::size_t j = i; j < i + kBlock; ++j) combineAt<C, Op>(d, a, b, j);
  }
  for (; i < n; ++i) combineAt<C, Op>(d, a, b, i);
}

// The divisor's type: float for fp16/bf16/fp32 and double for fp64 (an IEEE division in the
// compute type); for integers the usual arithmetic conversion with int, so a divisor of 256 stays
// 256 for uint8 and unsigned types divide unsigned.
template <class V>
using DivisorType = std::conditional_t<std::is_integral_v<V>, std::common_type_t<V, int>, V>;

template <class C>
inline void divideAt(unsigned char* x, std::size_t i, DivisorType<typename C::Value> divisor) {
  using S = typename C::Storage;
  storeAt<S>(x, i, C::store(static_cast<typename C::Value>(C::load(loadAt<S>(x, i)) / divisor)));
}

template <class C>
BRAID_KERNEL_TARGET void divideLoop(void* buf, std::size_t n, int divisor) {
  auto* x = static_cast<unsigned char*>(buf);
  const auto dv = static_cast<DivisorType<typename C::Value>>(divisor);
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    BRAID_IVDEP
    for (std::size_t j = i; j < i + kBlock; ++j) divideAt<C>(x, j, dv);
  }
  for (; i < n; ++i) divideAt<C>(x, i, dv);
}

template <DataType T>
constexpr void fillRow(KernelTable& t) {
  using C = CodecFor<T>;
  constexpr int kRow = static_cast<int>(T);
  t.reduce[kRow][static_cast<int>(ReduceOp::kSum)] = &reduceLoop<C, typename OpFor<ReduceOp::kSum>::Type>;
  t.reduce[kRow][static_cast<int>(ReduceOp::kProd)] = &reduceLoop<C, typename OpFor<ReduceOp::kProd>::Type>;
  t.reduce[kRow][static_cast<int>(ReduceOp::kMax)] = &reduceLoop<C, typename OpFor<ReduceOp::kMax>::Type>;
  t.reduce[kRow][static_cast<int>(ReduceOp::kMin)] = &reduceLoop<C, typename OpFor<ReduceOp::kMin>::Type>;
  t.reduce[kRow][static_cast<int>(ReduceOp::kAvg)] = &reduceLoop<C, typename OpFor<ReduceOp::kAvg>::Type>;
  t.divide[kRow] = &divideLoop<C>;
}

constexpr KernelTable makeTable(const char* name) {
  KernelTable t{};
  t.name = name;
  fillRow<DataType::kInt8>(t);
  fillRow<DataType::kUint8>(t);
  fillRow<DataType::kInt32>(t);
  fillRow<DataType::kUint32>(t);
  fillRow<DataType::kInt64>(t);
  fillRow<DataType::kUint64>(t);
  fillRow<DataType::kFloat16>(t);
  fillRow<DataType::kFloat32>(t);
  fillRow<DataType::kFloat64>(t);
  fillRow<DataType::kBfloat16>(t);
  fillRow<DataType::kFloat8e4m3>(t);
  fillRow<DataType::kFloat8e5m2>(t);
  fillRow<DataType::kInt16>(t);
  fillRow<DataType::kUint16>(t);
  return t;
}

}  // namespace braid::kernels::BRAID_KERNEL_ISA
#undef BRAID_IVDEP
#endif  // BRAID_KERNEL_ISA
