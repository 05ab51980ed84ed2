// Braid: the CUDA reduction kernels behind kernels/reduce_cuda.h.
//
// One fold kernel template per (type, op) pair: 10 types x 4 ops (kAvg is kSum, its division fused),
// plus one byte-wise fold and one divide kernel per type, 60 kernels in all, which keeps nvcc's time
// for this file modest. reduce() is the fold of two sources into one destination. The DDP layer's
// conversions (float32/float64 to fp16/bf16 and back) and its finite check add 12 small
// element-wise kernels.
//
// Layout of one launch over n elements whose pointers all share their offset modulo 16:
//   [0, head)                        element-wise, until the 16-byte boundary
//   [head, head + nvec * kPerVec)    16-byte vector loads and stores (uint4)
//   [head + nvec * kPerVec, n)       element-wise tail
// When the offsets differ, head = n and everything is element-wise (still coalesced); when a pointer is
// not even aligned to the element size, a byte-wise kernel assembles each element from bytes.
// The element arithmetic is the CPU engine's (kernels/half.h is shared), so results match bit for bit.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/half.h"
#include "kernels/reduce_cuda.h"

namespace braid::kernels::gpu {
namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 4;  // 4 x 512 threads fill an SM of sm_80/sm_90

template <class S>
struct Plain {
  using Storage = S;
  using Value = S;
  __device__ static Value load(S s) { return s; }
  __device__ static S store(Value v) { return v; }
};
struct Half {
  using Storage = std::uint16_t;
  using Value = float;
  __device__ static float load(std::uint16_t s) { return halfToFloat(s); }
  __device__ static std::uint16_t store(float v) { return floatToHalf(v); }
};
template <int kExpBits, int kManBits>
struct Fp8 {
  using Storage = std::uint8_t;
  using Value = float;
  __device__ static float load(std::uint8_t s) { return fp8ToFloat<kExpBits, kManBits>(s); }
  __device__ static std::uint8_t store(float v) { return floatToFp8<kExpBits, kManBits>(v); }
};
struct Bf16 {
  using Storage = std::uint16_t;
  using Value = float;
  __device__ static float load(std::uint16_t s) { return bf16ToFloat(s); }
  __device__ static std::uint16_t store(float v) { return floatToBf16(v); }
};

// Signed integers wrap like the CPU engine: the arithmetic runs in the unsigned type of the same width.
template <class T, bool kSignedInt = std::is_integral_v<T> && std::is_signed_v<T>>
struct WrapOf { using Type = T; };
template <class T>
struct WrapOf<T, true> { using Type = std::make_unsigned_t<T>; };
template <class T>
using Wrap = typename WrapOf<T>::Type;

struct Sum {
  template <class T>
  __device__ static T apply(T x, T y) { return static_cast<T>(static_cast<Wrap<T>>(x) + static_cast<Wrap<T>>(y)); }
};
struct Prod {
  template <class T>
  __device__ static T apply(T x, T y) { return static_cast<T>(static_cast<Wrap<T>>(x) * static_cast<Wrap<T>>(y)); }
};
struct Max {  // x86 maxps(y, x): a NaN in y yields x, a NaN in x propagates
  template <class T>
  __device__ static T apply(T x, T y) { return y > x ? y : x; }
};
struct Min {
  template <class T>
  __device__ static T apply(T x, T y) { return y < x ? y : x; }
};

template <class S>
__device__ __forceinline__ S loadBytes(const unsigned char* p) {
  S v;
  unsigned char* o = reinterpret_cast<unsigned char*>(&v);
#pragma unroll
  for (std::size_t k = 0; k < sizeof(S); ++k) o[k] = p[k];
  return v;
}
template <class S>
__device__ __forceinline__ void storeBytes(unsigned char* p, S v) {
  const unsigned char* i = reinterpret_cast<const unsigned char*>(&v);
#pragma unroll
  for (std::size_t k = 0; k < sizeof(S); ++k) p[k] = i[k];
}

template <class V>
using DivisorType = std::conditional_t<std::is_integral_v<V>, std::common_type_t<V, int>, V>;

// The n-input fold behind reduceMany: r = s0[i] (op) s1[i] (op) ... in source order, the accumulation
// in C::Value (float for fp16/bf16, so a launch rounds once), divided by `divisor` if above 1 (kAvg,
// as divideKernel does it), and written to every destination. Layout as in the file's head comment:
// vector body where every pointer shares its offset modulo 16, element-wise heads and tails. Every element
// is read from all sources before any destination is written, so destinations may be sources.
struct Sources {
  const unsigned char* p[kMaxFoldSources];
};
struct Outputs {
  unsigned char* p[kMaxFoldSources];
};

template <class C>
__device__ __forceinline__ typename C::Value divided(typename C::Value v, int divisor) {
  using V = typename C::Value;
  return divisor > 1 ? static_cast<V>(v / static_cast<DivisorType<V>>(divisor)) : v;
}

template <class C, class Op>
__global__ void __launch_bounds__(kThreads) foldKernel(Outputs dst, int ndst, Sources src, int nsrc, std::size_t n,
                                                       std::size_t head, std::size_t nvec, int divisor) {
  using S = typename C::Storage;
  using V = typename C::Value;
  constexpr std::size_t kPerVec = 16 / sizeof(S);
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t off = head * sizeof(S);
  for (std::size_t v = tid; v < nvec; v += stride) {
    union { uint4 u; S s[kPerVec]; } x;
    V acc[kPerVec];
    x.u = reinterpret_cast<const uint4*>(src.p[0] + off)[v];
#pragma unroll
    for (std::size_t k = 0; k < kPerVec; ++k) acc[k] = C::load(x.s[k]);
    for (int j = 1; j < nsrc; ++j) {
      x.u = reinterpret_cast<const uint4*>(src.p[j] + off)[v];
#pragma unroll
      for (std::size_t k = 0; k < kPerVec; ++k) acc[k] = Op::apply(acc[k], C::load(x.s[k]));
    }
#pragma unroll
    for (std::size_t k = 0; k < kPerVec; ++k) x.s[k] = C::store(divided<C>(acc[k], divisor));
    for (int o = 0; o < ndst; ++o) reinterpret_cast<uint4*>(dst.p[o] + off)[v] = x.u;
  }
  const std::size_t tailStart = head + nvec * kPerVec;
  const std::size_t scalar = head + (n - tailStart);
  for (std::size_t k = tid; k < scalar; k += stride) {
    const std::size_t i = k < head ? k : tailStart + (k - head);
    V acc = C::load(reinterpret_cast<const S*>(src.p[0])[i]);
    for (int j = 1; j < nsrc; ++j) acc = Op::apply(acc, C::load(reinterpret_cast<const S*>(src.p[j])[i]));
    const S r = C::store(divided<C>(acc, divisor));
    for (int o = 0; o < ndst; ++o) reinterpret_cast<S*>(dst.p[o])[i] = r;
  }
}

// The fold for pointers not aligned to the element size (legal in Braid's API, rare in practice): the
// op is a run-time argument here so that this slow path costs one kernel per type, not one per (type, op).
template <class C>
__global__ void __launch_bounds__(kThreads) foldBytesKernel(Outputs dst, int ndst, Sources src, int nsrc, std::size_t n,
                                                            int op, int divisor) {
  using S = typename C::Storage;
  using V = typename C::Value;
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = tid; i < n; i += stride) {
    V acc = C::load(loadBytes<S>(src.p[0] + i * sizeof(S)));
    for (int j = 1; j < nsrc; ++j) {
      const V y = C::load(loadBytes<S>(src.p[j] + i * sizeof(S)));
      switch (op) {
        case 1: acc = Prod::apply(acc, y); break;
        case 2: acc = Max::apply(acc, y); break;
        case 3: acc = Min::apply(acc, y); break;
        default: acc = Sum::apply(acc, y); break;
      }
    }
    const S r = C::store(divided<C>(acc, divisor));
    for (int o = 0; o < ndst; ++o) storeBytes<S>(dst.p[o] + i * sizeof(S), r);
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads) divideKernel(unsigned char* x, std::size_t n, int divisor, bool aligned) {
  using S = typename C::Storage;
  using V = typename C::Value;
  const auto dv = static_cast<DivisorType<V>>(divisor);
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = tid; i < n; i += stride) {
    unsigned char* p = x + i * sizeof(S);
    const S s = aligned ? *reinterpret_cast<const S*>(p) : loadBytes<S>(p);
    const S r = C::store(static_cast<V>(C::load(s) / dv));
    if (aligned) *reinterpret_cast<S*>(p) = r;
    else storeBytes<S>(p, r);
  }
}

// The DDP layer's conversions and finite check: element-wise, grid-stride (neither is a hot path).
template <class From, class To>
__global__ void __launch_bounds__(kThreads) convertKernel(typename To::Storage* dst, const typename From::Storage* src,
                                                          std::size_t n, int divisor) {
  using V = typename From::Value;
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = tid; i < n; i += stride) {
    V v = From::load(src[i]);
    if (divisor > 1) v = static_cast<V>(v / static_cast<V>(divisor));
    dst[i] = To::store(static_cast<typename To::Value>(v));
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads) nonFiniteKernel(const typename C::Storage* x, std::size_t n,
                                                            std::int32_t* flag, std::int32_t value) {
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  int bad = 0;
  for (std::size_t i = tid; i < n; i += stride) bad |= !isfinite(C::load(x[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = value;  // (every writer stores the same value)
}

int multiprocessors() {
  static int cached[64] = {};  // by device; 0 = not asked yet (a benign race: every writer stores the same value)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 1;
  if (dev < 64 && cached[dev]) return cached[dev];
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) sms = 1;
  if (dev < 64) cached[dev] = sms;
  return sms;
}

unsigned gridFor(std::size_t work) {
  const std::size_t want = (work + kThreads - 1) / kThreads;
  const std::size_t cap = static_cast<std::size_t>(multiprocessors()) * kBlocksPerSm;
  return static_cast<unsigned>(want < 1 ? 1 : (want < cap ? want : cap));
}

// Launches `kernel` on stream s and returns that launch's own result (cudaLaunchKernelEx), not the
// thread's last error: on the proxy thread that is often a stale cudaErrorNotReady from the polls
// before the launch (cudaEventQuery, cudaStreamQuery), which a chevron launch checked with
// cudaGetLastError would report as a failed launch.
#ifndef BRAID_KERNEL_LAUNCH
#define BRAID_KERNEL_LAUNCH cudaLaunchKernelEx  // (tests/fakecuda/simt.h runs the kernels on the CPU instead)
#endif
template <class... Params, class... Args>
Status launch(const char* what, DataType t, ReduceOp op, unsigned grid, cudaStream_t s, void (*kernel)(Params...),
              Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  const cudaError_t e = BRAID_KERNEL_LAUNCH(&cfg, kernel, std::forward<Args>(args)...);
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // this launch's error is returned here; it must not surface again elsewhere
  return Status::CudaError(std::string("launching the ") + what + " kernel (" + dataTypeName(t) + " " + reduceOpName(op) +
                           "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The layout of one launch over n elements of type S whose destination sits at address ud: `head`
// elements to the 16-byte boundary, `nvec` vectors, the rest element-wise; everything element-wise
// unless every pointer shares dst's offset modulo 16 (coAligned). `work`: items for the grid.
struct Split {
  std::size_t head, nvec, work;
};
template <class S>
Split splitFor(std::uintptr_t ud, bool coAligned, std::size_t n) {
  constexpr std::size_t kPerVec = 16 / sizeof(S);
  std::size_t head = n, nvec = 0;
  if (coAligned) {
    const std::size_t toBoundary = ((16 - ud % 16) % 16) / sizeof(S);
    head = toBoundary < n ? toBoundary : n;
    nvec = (n - head) / kPerVec;
  }
  return {head, nvec, nvec + head + (n - head - nvec * kPerVec)};
}

// Calls f.template operator()<Op>() for the functor of op (kAvg reduces like kSum).
template <class F>
Status withOp(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return f.template operator()<Sum>();
    case ReduceOp::kProd: return f.template operator()<Prod>();
    case ReduceOp::kMax: return f.template operator()<Max>();
    case ReduceOp::kMin: return f.template operator()<Min>();
  }
  return Status::InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(op)));
}

// One launch: up to kMaxFoldSources sources and destinations.
template <class C, class Op>
Status launchFold(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t n, DataType t, ReduceOp op,
                  int divisor, cudaStream_t s) {
  using S = typename C::Storage;
  Sources src{};
  Outputs dst{};
  const auto ud = reinterpret_cast<std::uintptr_t>(dsts[0]);
  std::uintptr_t any = 0;
  bool coAligned = true;
  const auto note = [&](const void* p) {
    const auto u = reinterpret_cast<std::uintptr_t>(p);
    any |= u;
    coAligned = coAligned && u % 16 == ud % 16;
  };
  for (int j = 0; j < nsrc; ++j) {
    src.p[j] = static_cast<const unsigned char*>(srcs[j]);
    note(srcs[j]);
  }
  for (int o = 0; o < ndst; ++o) {
    dst.p[o] = static_cast<unsigned char*>(dsts[o]);
    note(dsts[o]);
  }
  if (any % sizeof(S) != 0) {
    return launch("byte-wise fold", t, op, gridFor(n), s, foldBytesKernel<C>, dst, ndst, src, nsrc, n, static_cast<int>(op),
                  divisor);
  }
  const Split sp = splitFor<S>(ud, coAligned, n);
  return launch("fold", t, op, gridFor(sp.work), s, foldKernel<C, Op>, dst, ndst, src, nsrc, n, sp.head, sp.nvec, divisor);
}

template <class C>
Status foldFor(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t n, DataType t, ReduceOp op,
               int divisor, cudaStream_t s) {
  return withOp(op, [&]<class Op>() { return launchFold<C, Op>(dsts, ndst, srcs, nsrc, n, t, op, divisor, s); });
}

template <class C>
Status divideFor(void* x, std::size_t n, DataType t, int divisor, cudaStream_t s) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(x) % sizeof(typename C::Storage) == 0;
  return launch("divide", t, ReduceOp::kAvg, gridFor(n), s, divideKernel<C>, static_cast<unsigned char*>(x), n, divisor,
                aligned);
}

// Calls f.template operator()<Codec>() for the codec of t.
template <class F>
Status withCodec(DataType t, F&& f) {
  switch (t) {
    case DataType::kInt8: return f.template operator()<Plain<std::int8_t>>();
    case DataType::kUint8: return f.template operator()<Plain<std::uint8_t>>();
    case DataType::kInt32: return f.template operator()<Plain<std::int32_t>>();
    case DataType::kUint32: return f.template operator()<Plain<std::uint32_t>>();
    case DataType::kInt64: return f.template operator()<Plain<std::int64_t>>();
    case DataType::kUint64: return f.template operator()<Plain<std::uint64_t>>();
    case DataType::kFloat16: return f.template operator()<Half>();
    case DataType::kFloat32: return f.template operator()<Plain<float>>();
    case DataType::kFloat64: return f.template operator()<Plain<double>>();
    case DataType::kBfloat16: return f.template operator()<Bf16>();
    case DataType::kFloat8e4m3: return f.template operator()<Fp8<4, 3>>();
    case DataType::kFloat8e5m2: return f.template operator()<Fp8<5, 2>>();
    case DataType::kInt16: return f.template operator()<Plain<std::int16_t>>();
    case DataType::kUint16: return f.template operator()<Plain<std::uint16_t>>();
  }
  return Status::InvalidArgument("unknown data type " + std::to_string(static_cast<int>(t)));
}

// Calls f.template operator()<Codec>() for the codec of a floating type t.
template <class F>
Status withFloatCodec(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat16: return f.template operator()<Half>();
    case DataType::kFloat32: return f.template operator()<Plain<float>>();
    case DataType::kFloat64: return f.template operator()<Plain<double>>();
    case DataType::kBfloat16: return f.template operator()<Bf16>();
    case DataType::kFloat8e4m3: return f.template operator()<Fp8<4, 3>>();
    case DataType::kFloat8e5m2: return f.template operator()<Fp8<5, 2>>();
    default: return Status::InvalidArgument(std::string(dataTypeName(t)) + " is not a floating type");
  }
}

bool alignedFor(const void* p, DataType t) { return reinterpret_cast<std::uintptr_t>(p) % dataTypeSize(t) == 0; }
enum class WirePair { kNone, kNarrow, kWiden };
WirePair wirePair(DataType from, DataType to) {
  const auto wide = [](DataType t) { return t == DataType::kFloat32 || t == DataType::kFloat64; };
  const auto narrow = [](DataType t) { return t == DataType::kFloat16 || t == DataType::kBfloat16; };
  return wide(from) && narrow(to) ? WirePair::kNarrow : narrow(from) && wide(to) ? WirePair::kWiden : WirePair::kNone;
}

// Calls f.template operator()<From, To>() with the codecs of one of the 8 pairs the wire formats use
// (there are no kernels for the others).
template <class F>
Status withWirePair(DataType from, DataType to, F&& f) {
  const bool toHalf = to == DataType::kFloat16, fromHalf = from == DataType::kFloat16;
  switch (wirePair(from, to)) {
    case WirePair::kNarrow:
      return from == DataType::kFloat32 ? (toHalf ? f.template operator()<Plain<float>, Half>() : f.template operator()<Plain<float>, Bf16>())
                                        : (toHalf ? f.template operator()<Plain<double>, Half>() : f.template operator()<Plain<double>, Bf16>());
    case WirePair::kWiden:
      return to == DataType::kFloat32 ? (fromHalf ? f.template operator()<Half, Plain<float>>() : f.template operator()<Bf16, Plain<float>>())
                                      : (fromHalf ? f.template operator()<Half, Plain<double>>() : f.template operator()<Bf16, Plain<double>>());
    case WirePair::kNone: break;
  }
  return Status::InvalidArgument(std::string("convert: ") + dataTypeName(from) + " to " + dataTypeName(to) +
                                 " (only float32 and float64 to float16 and bfloat16, and back)");
}

// The kernel behind `fn` fully loaded in the current context: cudaFuncGetAttributes (which fails when
// the binary has no code for this GPU), cudaGetFuncBySymbol (the driver's handle, which loads it
// where the driver loads at that point), then cuFuncLoad where the driver has it (12.4 and later).
using FuncLoad = int (*)(cudaFunction_t);  // CUresult cuFuncLoad(CUfunction)
Status loadKernel(const void* fn, const std::string& what, FuncLoad funcLoad) {
  cudaFuncAttributes attr{};
  const char* call = "cudaFuncGetAttributes";
  cudaError_t e = cudaFuncGetAttributes(&attr, fn);
  cudaFunction_t f = nullptr;
  if (e == cudaSuccess) {
    call = "cudaGetFuncBySymbol";
    e = cudaGetFuncBySymbol(&f, fn);
  }
  if (e == cudaSuccess) {
    const int rc = funcLoad ? funcLoad(f) : 0;
    if (rc == 0) return Status::Ok();
    return Status::CudaError("loading the " + what + " kernel: cuFuncLoad failed with CUresult " + std::to_string(rc));
  }
  (void)cudaGetLastError();
  return Status::CudaError("loading the " + what + " kernel: " + call + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

template <class... Params>
const void* symbol(void (*kernel)(Params...)) {
  return reinterpret_cast<const void*>(kernel);
}

// Every kernel the launches can pick, through the same dispatchers they use.
Status loadAll() {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  FuncLoad funcLoad = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuFuncLoad", &entry, 12040, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess && entry)
    funcLoad = reinterpret_cast<FuncLoad>(entry);
  (void)multiprocessors();  // the launches' grid size, asked once now too
  for (int i = 0; i < kNumDataTypes; ++i) {
    const auto t = static_cast<DataType>(i);
    const std::string type = std::string(" (") + dataTypeName(t) + ")";
    Status st = withCodec(t, [&]<class C>() {
      for (int o = 0; o < kNumReduceOps; ++o) {
        Status s = withOp(static_cast<ReduceOp>(o), [&]<class Op>() { return loadKernel(symbol(foldKernel<C, Op>), "fold" + type, funcLoad); });
        if (!s.ok()) return s;
      }
      Status s = loadKernel(symbol(foldBytesKernel<C>), "byte-wise fold" + type, funcLoad);
      return s.ok() ? loadKernel(symbol(divideKernel<C>), "divide" + type, funcLoad) : s;
    });
    if (!st.ok()) return st;
    if (!isFloating(t)) continue;
    Status fin = withFloatCodec(t, [&]<class C>() { return loadKernel(symbol(nonFiniteKernel<C>), "finite check" + type, funcLoad); });
    if (!fin.ok()) return fin;
    for (DataType narrow : {DataType::kFloat16, DataType::kBfloat16}) {  // t's wire pairs, if it is float32 or float64
      for (auto [from, to] : {std::pair{t, narrow}, std::pair{narrow, t}}) {
        if (wirePair(from, to) == WirePair::kNone) continue;
        Status conv = withWirePair(from, to, [&]<class F, class T>() { return loadKernel(symbol(convertKernel<F, T>), "convert" + type, funcLoad); });
        if (!conv.ok()) return conv;
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status convert(void* dst, DataType to, const void* src, DataType from, std::size_t count, int divisor, void* stream) {
  if (!isValid(to) || !isValid(from)) return Status::InvalidArgument("convert: unknown data type");
  if (!alignedFor(dst, to) || !alignedFor(src, from)) return Status::InvalidArgument("convert: a pointer not aligned to its element size");
  if (count == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  return withWirePair(from, to, [&]<class F, class T>() {
    return launch("convert", from, ReduceOp::kSum, gridFor(count), s, convertKernel<F, T>,
                  static_cast<typename T::Storage*>(dst), static_cast<const typename F::Storage*>(src), count, divisor);
  });
}

Status flagNonFinite(const void* x, std::size_t count, DataType t, std::int32_t* flag, std::int32_t value, void* stream) {
  if (!isValid(t)) return Status::InvalidArgument("flagNonFinite: unknown data type");
  if (!isFloating(t) || count == 0) return Status::Ok();  // integers are always finite
  if (!alignedFor(x, t)) return Status::InvalidArgument("flagNonFinite: a pointer not aligned to its element size");
  auto s = static_cast<cudaStream_t>(stream);
  return withFloatCodec(t, [&]<class C>() {
    return launch("finite check", t, ReduceOp::kSum, gridFor(count), s, nonFiniteKernel<C>,
                  static_cast<const typename C::Storage*>(x), count, flag, value);
  });
}

Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t, ReduceOp op, void* stream) {
  // Two sources, one destination: the fold reads both before it writes, so dst may be a or b.
  void* dsts[1] = {dst};
  const void* srcs[2] = {a, b};
  return reduceMany(dsts, 1, srcs, 2, count, t, op, 0, stream);
}

Status reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, std::size_t count, DataType t,
                  ReduceOp op, int divisor, void* stream) {
  if (!isValid(t)) return Status::InvalidArgument("unknown data type " + std::to_string(static_cast<int>(t)));
  if (!isValid(op)) return Status::InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(op)));
  if (nsrc < 1 || ndst < 1 || ndst > kMaxFoldSources || (ndst > 1 && nsrc > kMaxFoldSources))
    return Status::InvalidArgument("reduceMany: 1 to 8 destinations, and more than one only with at most 8 sources");
  if (count == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  // Groups of kMaxFoldSources (one destination only): the first folds into dst, each later one folds
  // dst with its sources; the division comes with the last.
  const void* group[kMaxFoldSources];
  int done = 0;
  while (done < nsrc) {
    int k = 0;
    if (done > 0) group[k++] = dsts[0];
    while (k < kMaxFoldSources && done < nsrc) group[k++] = srcs[done++];
    const int d = done == nsrc ? divisor : 0;
    Status st = withCodec(t, [&]<class C>() { return foldFor<C>(dsts, ndst, group, k, count, t, op, d, s); });
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status divide(void* x, std::size_t count, DataType t, int divisor, void* stream) {
  if (!isValid(t)) return Status::InvalidArgument("unknown data type " + std::to_string(static_cast<int>(t)));
  if (divisor < 1) return Status::InvalidArgument("divisor must be positive");
  if (count == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  return withCodec(t, [&]<class C>() { return divideFor<C>(x, count, t, divisor, s); });
}

Status preload() {
  static std::mutex mu;
  static std::set<int> loaded;  // devices
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return Status::CudaError(std::string("cudaGetDevice: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  std::lock_guard<std::mutex> g(mu);  // a second caller waits until the kernels are loaded
  if (loaded.count(dev)) return Status::Ok();
  Status s = loadAll();
  if (s.ok()) loaded.insert(dev);  // (a failure is tried again by the next communicator)
  return s;
}

}  // namespace braid::kernels::gpu
