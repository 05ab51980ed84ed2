// Braid: tests for the CPU reduce engine. The expected values never come from the code under
// test: half/bf16/fp8 bits are decoded by their textbook formula and results are rounded by a
// separate arithmetic reference (frexp/ldexp/nearbyint), so a wrong conversion cannot agree with itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/copy.h"
#include "kernels/half.h"
#include "kernels/reduce.h"

namespace braid::kernels {
namespace {

constexpr DataType kAllTypes[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,  DataType::kUint32,
                                  DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                                  DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3,
                                  DataType::kFloat8e5m2, DataType::kInt16, DataType::kUint16};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};
constexpr const char* kIsas[] = {"generic", "avx2", "avx512"};
constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4097};
constexpr std::size_t kMaxCount = 4097;
constexpr double kBf16Max = 0x1.fep127;

// Round v to a binary format with mantBits fraction bits, minimum normal exponent minExp and
// largest finite value maxFinite, to nearest with ties to even (the default FP environment); past
// maxFinite infinity, or maxFinite itself where the format saturates (e4m3).
double refRound(double v, int mantBits, int minExp, double maxFinite, bool saturate = false) {
  if (std::isnan(v) || v == 0.0 || std::isinf(v)) return v;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, minExp) - mantBits);
  double r = std::nearbyint(std::fabs(v) / quantum) * quantum;
  if (r > maxFinite) r = saturate ? maxFinite : std::numeric_limits<double>::infinity();
  return std::copysign(r, v);
}
double refHalf(double v) { return refRound(v, 10, -14, 65504.0); }
double refBf16(double v) { return refRound(v, 7, -126, kBf16Max); }
double refE4m3(double v) { return std::isinf(v) ? std::numeric_limits<double>::quiet_NaN() : refRound(v, 3, -6, 448.0, true); }
double refE5m2(double v) { return refRound(v, 2, -14, 57344.0); }

// A 16-bit float with mantBits fraction bits and exponent bias `bias`, by the textbook formula.
double decodeShort(std::uint16_t h, int mantBits, int bias) {
  const int e = (h & 0x7fff) >> mantBits, m = h & ((1 << mantBits) - 1), eMax = (1 << (15 - mantBits)) - 1;
  double v = std::ldexp(e == 0 ? m : m + (1 << mantBits), std::max(e, 1) - bias - mantBits);
  if (e == eMax) v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  return (h & 0x8000) ? -v : v;
}
double decodeHalf(std::uint16_t h) { return decodeShort(h, 10, 15); }
// The 8-bit floats by the same formula: e5m2 has IEEE's specials, e4m3 only the NaN S.1111.111.
double decodeE5m2(std::uint8_t b) { return decodeShort(static_cast<std::uint16_t>(b << 8), 10, 15); }
double decodeE4m3(std::uint8_t b) {
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const int e = (b & 0x7f) >> 3, m = b & 7;
  const double v = std::ldexp(e == 0 ? m : m + 8, std::max(e, 1) - 7 - 3);
  return (b & 0x80) ? -v : v;
}
double decodeBf16(std::uint16_t h) { return decodeShort(h, 7, 127); }

template <class T>
T rawAt(const unsigned char* p, std::size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// Element i of p, decoded without the code under test.
double decodeAt(const unsigned char* p, std::size_t i, DataType t) {
  switch (t) {
    case DataType::kInt8: return rawAt<std::int8_t>(p, i);
    case DataType::kUint8: return rawAt<std::uint8_t>(p, i);
    case DataType::kInt32: return rawAt<std::int32_t>(p, i);
    case DataType::kUint32: return rawAt<std::uint32_t>(p, i);
    case DataType::kInt64: return static_cast<double>(rawAt<std::int64_t>(p, i));
    case DataType::kUint64: return static_cast<double>(rawAt<std::uint64_t>(p, i));
    case DataType::kFloat16: return decodeHalf(rawAt<std::uint16_t>(p, i));
    case DataType::kFloat32: return rawAt<float>(p, i);
    case DataType::kFloat64: return rawAt<double>(p, i);
    case DataType::kBfloat16: return decodeBf16(rawAt<std::uint16_t>(p, i));
    case DataType::kFloat8e4m3: return decodeE4m3(rawAt<std::uint8_t>(p, i));
    case DataType::kFloat8e5m2: return decodeE5m2(rawAt<std::uint8_t>(p, i));
    case DataType::kInt16: return rawAt<std::int16_t>(p, i);
    case DataType::kUint16: return rawAt<std::uint16_t>(p, i);
  }
  return 0.0;
}

// Random inputs whose sum/prod/max/min are exact in double and never overflow the type: integers
// stay within ranges whose pairwise results fit; floats are built from bits with moderate
// exponents (fp16 products reach the subnormal range, so rounding there is exercised too).
void fillRandom(unsigned char* p, std::size_t n, DataType t, ReduceOp op, std::mt19937_64& rng) {
  const bool prod = op == ReduceOp::kProd;
  auto uni = [&rng](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  auto next = [&]() -> std::uint64_t {
    const std::uint64_t sign = rng() & 1;
    switch (t) {
      case DataType::kInt8: return static_cast<std::uint64_t>(prod ? uni(-11, 11) : uni(-60, 60));
      case DataType::kUint8: return static_cast<std::uint64_t>(prod ? uni(0, 15) : uni(0, 120));
      case DataType::kInt32: return static_cast<std::uint64_t>(prod ? uni(-40000, 40000) : uni(-1000000000, 1000000000));
      case DataType::kUint32: return static_cast<std::uint64_t>(prod ? uni(0, 65535) : uni(0, 2000000000));
      case DataType::kInt64: return static_cast<std::uint64_t>(prod ? uni(-(1LL << 25), 1LL << 25) : uni(-(1LL << 51), 1LL << 51));
      case DataType::kUint64: return static_cast<std::uint64_t>(prod ? uni(0, 1LL << 26) : uni(0, 1LL << 52));
      case DataType::kFloat16: return sign << 15 | static_cast<std::uint64_t>(uni(7, 21) << 10 | uni(0, 1023));
      case DataType::kBfloat16: return sign << 15 | static_cast<std::uint64_t>(uni(120, 134) << 7 | uni(0, 127));
      case DataType::kFloat32: return sign << 31 | static_cast<std::uint64_t>(uni(107, 147) << 23 | uni(0, (1 << 23) - 1));
      case DataType::kFloat64: return sign << 63 | static_cast<std::uint64_t>(uni(1003, 1043)) << 52 | (rng() >> 12);
      // 2^-4..2^3 and 2^-6..2^5: sums and products stay finite and reach the subnormals
      case DataType::kFloat8e4m3: return sign << 7 | static_cast<std::uint64_t>(uni(3, 10) << 3 | uni(0, 7));
      case DataType::kFloat8e5m2: return sign << 7 | static_cast<std::uint64_t>(uni(9, 20) << 2 | uni(0, 3));
      case DataType::kInt16: return static_cast<std::uint64_t>(prod ? uni(-181, 181) : uni(-16000, 16000));
      case DataType::kUint16: return static_cast<std::uint64_t>(prod ? uni(0, 255) : uni(0, 32000));
    }
    return 0;
  };
  // Little-endian x86/ARM: the low bytes of the two's complement value are the element.
  const std::size_t size = dataTypeSize(t);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t v = next();
    std::memcpy(p + i * size, &v, size);
  }
}

double refCombine(double x, double y, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return x + y;
    case ReduceOp::kProd: return x * y;
    case ReduceOp::kMax: return y > x ? y : x;
    case ReduceOp::kMin: return y < x ? y : x;
  }
  return 0.0;
}

// The value the engine must produce from an exact double result: the float types go through a
// float first (the documented semantics for fp16/bf16; for fp32 it is the rounding itself).
double refResult(double exact, DataType t) {
  switch (t) {
    case DataType::kFloat16: return refHalf(static_cast<float>(exact));
    case DataType::kBfloat16: return refBf16(static_cast<float>(exact));
    case DataType::kFloat8e4m3: return refE4m3(static_cast<float>(exact));
    case DataType::kFloat8e5m2: return refE5m2(static_cast<float>(exact));
    case DataType::kFloat32: return static_cast<float>(exact);
    case DataType::kFloat64: return exact;
    default: return exact + 0.0;  // integers have no -0
  }
}

bool sameValue(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// A 64-byte-aligned window into a guarded allocation, so overruns on either side are detected.
class GuardedBuffer {
 public:
  static constexpr std::size_t kGuard = 64;
  static constexpr unsigned char kFill = 0xa5;
  explicit GuardedBuffer(std::size_t bytes) : storage_(bytes + 3 * kGuard + 64, kFill) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    base_ = storage_.data() + kGuard + (64 - addr % 64) % 64;
  }
  unsigned char* at(std::size_t misalign) { return base_ + misalign; }
  // True if nothing outside [at(misalign), at(misalign) + used) changed.
  bool guardsIntact(std::size_t misalign, std::size_t used) const {
    auto untouched = [](const unsigned char* from, const unsigned char* to) {
      return std::all_of(from, to, [](unsigned char c) { return c == kFill; });
    };
    return untouched(storage_.data(), base_ + misalign) &&
           untouched(base_ + misalign + used, storage_.data() + storage_.size());
  }
  void reset() { std::fill(storage_.begin(), storage_.end(), kFill); }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* base_;
};

// Restores automatic ISA choice when a test ends, whatever it forced.
struct IsaScope {
  explicit IsaScope(const char* isa) { setIsaOverride(isa); }
  ~IsaScope() { setIsaOverride(nullptr); }
  bool active(const char* isa) const { return std::string(isaName()) == isa; }
};

using ReduceParam = std::tuple<const char*, DataType, ReduceOp>;
class ReduceTest : public ::testing::TestWithParam<ReduceParam> {};

enum class Mode { kOutOfPlace, kDstIsA, kDstIsB, kAllSame };
constexpr Mode kModes[] = {Mode::kOutOfPlace, Mode::kDstIsA, Mode::kDstIsB, Mode::kAllSame};
constexpr const char* kModeNames[] = {"out-of-place", "dst==a", "dst==b", "dst==a==b"};

TEST_P(ReduceTest, MatchesScalarReference) {
  const auto [isa, type, op] = GetParam();
  IsaScope scope(isa);
  if (!scope.active(isa)) GTEST_SKIP() << "this CPU cannot run " << isa;
  const std::size_t size = dataTypeSize(type);
  std::mt19937_64 rng(1000 * static_cast<unsigned>(type) + static_cast<unsigned>(op));
  std::vector<unsigned char> inA(kMaxCount * size), inB(kMaxCount * size);
  fillRandom(inA.data(), kMaxCount, type, op, rng);
  fillRandom(inB.data(), kMaxCount, type, op, rng);
  std::vector<double> wantAB(kMaxCount), wantAA(kMaxCount);
  for (std::size_t i = 0; i < kMaxCount; ++i) {
    const double x = decodeAt(inA.data(), i, type), y = decodeAt(inB.data(), i, type);
    wantAB[i] = refResult(refCombine(x, y, op), type);
    wantAA[i] = refResult(refCombine(x, x, op), type);
  }
  GuardedBuffer bufA(kMaxCount * size), bufB(kMaxCount * size), bufD(kMaxCount * size);
  for (std::size_t count : kCounts) {
    for (std::size_t shift = 0; shift < 4; ++shift) {
      for (Mode mode : kModes) {
        bufA.reset(), bufB.reset(), bufD.reset();
        unsigned char* a = bufA.at(shift);
        unsigned char* b = mode == Mode::kAllSame ? a : bufB.at((shift + 1) % 4);
        std::memcpy(a, inA.data(), count * size);
        if (b != a) std::memcpy(b, inB.data(), count * size);
        unsigned char* d = mode == Mode::kDstIsA || mode == Mode::kAllSame ? a
                           : mode == Mode::kDstIsB                         ? b
                                                                           : bufD.at((shift + 2) % 4);
        reduce(d, a, b, count, type, op);
        const std::vector<double>& want = mode == Mode::kAllSame ? wantAA : wantAB;
        const std::string where = std::string(isa) + " " + dataTypeName(type) + " " + reduceOpName(op) +
                                  " count=" + std::to_string(count) + " shift=" + std::to_string(shift) + " " +
                                  kModeNames[static_cast<int>(mode)];
        for (std::size_t i = 0; i < count; ++i) {
          const double got = decodeAt(d, i, type);
          if (!sameValue(got, want[i])) {
            FAIL() << where << ": element " << i << " is " << got << ", expected " << want[i] << " from "
                   << decodeAt(inA.data(), i, type) << " and "
                   << decodeAt(mode == Mode::kAllSame ? inA.data() : inB.data(), i, type);
          }
        }
        ASSERT_TRUE(bufA.guardsIntact(shift, count * size)) << where << ": wrote outside a";
        ASSERT_TRUE(bufB.guardsIntact((shift + 1) % 4, b == a ? 0 : count * size)) << where << ": wrote outside b";
        ASSERT_TRUE(bufD.guardsIntact((shift + 2) % 4, d == bufD.at((shift + 2) % 4) ? count * size : 0))
            << where << ": wrote outside dst";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsasTypesOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const ::testing::TestParamInfo<ReduceParam>& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dataTypeName(std::get<1>(info.param)) +
                                  "_" + reduceOpName(std::get<2>(info.param));
                         });

using DivideParam = std::tuple<const char*, DataType>;
class DivideTest : public ::testing::TestWithParam<DivideParam> {};

TEST_P(DivideTest, MatchesScalarDivision) {
  const auto [isa, type] = GetParam();
  IsaScope scope(isa);
  if (!scope.active(isa)) GTEST_SKIP() << "this CPU cannot run " << isa;
  const std::size_t size = dataTypeSize(type), count = 1000 + 5;
  std::mt19937_64 rng(static_cast<unsigned>(type));
  std::vector<unsigned char> in(count * size);
  fillRandom(in.data(), count, type, ReduceOp::kSum, rng);
  for (int divisor : {1, 3, 7}) {
    GuardedBuffer buf(count * size);
    unsigned char* x = buf.at(3);
    std::memcpy(x, in.data(), in.size());
    divide(x, count, type, divisor);
    for (std::size_t i = 0; i < count; ++i) {
      const double v = decodeAt(in.data(), i, type);
      double want = 0;
      if (type == DataType::kFloat64) {
        want = v / divisor;
      } else if (isFloating(type)) {
        want = refResult(static_cast<float>(v) / static_cast<float>(divisor), type);
      } else {
        want = refResult(std::trunc(v / divisor), type);  // exact: |v| <= 2^52, then truncated
      }
      ASSERT_TRUE(sameValue(decodeAt(x, i, type), want))
          << isa << " " << dataTypeName(type) << " / " << divisor << " element " << i << ": " << v << " -> "
          << decodeAt(x, i, type) << ", expected " << want;
    }
    ASSERT_TRUE(buf.guardsIntact(3, count * size));
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsasTypes, DivideTest, ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kAllTypes)),
                         [](const ::testing::TestParamInfo<DivideParam>& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dataTypeName(std::get<1>(info.param));
                         });

TEST(Divide, IntegerTruncatesTowardZero) {
  std::vector<std::int32_t> v = {7, -7, 9, -9, 0, std::numeric_limits<std::int32_t>::min()};
  divide(v.data(), v.size(), DataType::kInt32, 2);
  EXPECT_EQ(v, (std::vector<std::int32_t>{3, -3, 4, -4, 0, -1073741824}));
  std::vector<std::uint8_t> u = {255, 7};
  divide(u.data(), u.size(), DataType::kUint8, 4);
  EXPECT_EQ(u, (std::vector<std::uint8_t>{63, 1}));
  // Divisors wider than the element (many ranks averaging int8) must not be narrowed.
  std::vector<std::uint8_t> u2 = {255, 200};
  divide(u2.data(), u2.size(), DataType::kUint8, 256);
  EXPECT_EQ(u2, (std::vector<std::uint8_t>{0, 0}));
  std::vector<std::int8_t> s = {-128, 127, 100};
  divide(s.data(), s.size(), DataType::kInt8, 100);
  EXPECT_EQ(s, (std::vector<std::int8_t>{-1, 1, 1}));
  divide(s.data(), s.size(), DataType::kInt8, 200);
  EXPECT_EQ(s, (std::vector<std::int8_t>{0, 0, 0}));
  std::uint64_t big = 0xffffffffffffffffULL;
  divide(&big, 1, DataType::kUint64, 3);
  EXPECT_EQ(big, 0x5555555555555555ULL);
}

TEST(Divide, FloatIsIeeeDivision) {
  float f = 1.0f;
  divide(&f, 1, DataType::kFloat32, 3);
  EXPECT_EQ(f, 1.0f / 3.0f);
  std::uint16_t h = 0x3c00;  // 1.0
  divide(&h, 1, DataType::kFloat16, 3);
  EXPECT_EQ(h, 0x3555);  // 0.33325195, the fp16 nearest 1/3
  std::uint16_t bf = 0x3f80;  // 1.0
  divide(&bf, 1, DataType::kBfloat16, 3);
  EXPECT_EQ(bf, 0x3eab);  // 0.333984375
}

TEST(ReduceNaN, MaxMinWithNaNFollowTheDocumentedRule) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const char* isa : kIsas) {
    IsaScope scope(isa);
    if (!scope.active(isa)) continue;
    for (DataType t : {DataType::kFloat16, DataType::kFloat32, DataType::kFloat64, DataType::kBfloat16}) {
      for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
        constexpr std::size_t kN = 67;  // vector body plus a scalar tail
        const std::size_t size = dataTypeSize(t);
        std::vector<unsigned char> a(kN * size), b(kN * size), d(kN * size);
        const double pairs[4][2] = {{nan, 1.0}, {1.0, nan}, {nan, nan}, {2.0, -3.0}};
        for (std::size_t i = 0; i < kN; ++i) {
          storeFromDouble(a.data(), i, t, pairs[i % 4][0]);
          storeFromDouble(b.data(), i, t, pairs[i % 4][1]);
        }
        reduce(d.data(), a.data(), b.data(), kN, t, op);
        for (std::size_t i = 0; i < kN; ++i) {
          const double got = decodeAt(d.data(), i, t), x = pairs[i % 4][0], y = pairs[i % 4][1];
          const std::string where = std::string(isa) + " " + dataTypeName(t) + " " + reduceOpName(op) + " #" +
                                    std::to_string(i);
          if (std::isnan(x)) {
            EXPECT_TRUE(std::isnan(got)) << where << ": a NaN in a must propagate";
          } else if (std::isnan(y)) {
            EXPECT_EQ(got, x) << where << ": a NaN in b must yield a";
          } else {
            EXPECT_EQ(got, op == ReduceOp::kMax ? 2.0 : -3.0) << where;
          }
        }
      }
    }
  }
}

TEST(ReduceWrap, IntegerOverflowWrapsOnEveryIsa) {
  for (const char* isa : kIsas) {
    IsaScope scope(isa);
    if (!scope.active(isa)) continue;
    std::vector<std::int32_t> a(100, std::numeric_limits<std::int32_t>::max()), b(100, 1), d(100);
    reduce(d.data(), a.data(), b.data(), 100, DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(d[99], std::numeric_limits<std::int32_t>::min()) << isa;
    std::vector<std::int8_t> c(100, 16), e(100);
    reduce(e.data(), c.data(), c.data(), 100, DataType::kInt8, ReduceOp::kProd);
    EXPECT_EQ(e[0], 0) << isa;
    std::vector<std::uint8_t> u(100, 200), w(100, 100), r(100);
    reduce(r.data(), u.data(), w.data(), 100, DataType::kUint8, ReduceOp::kSum);
    EXPECT_EQ(r[50], 44) << isa;
  }
}

TEST(HalfConversion, DecodesEveryBitPatternByTheFormula) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    ASSERT_TRUE(sameValue(halfToFloat(bits), decodeHalf(bits))) << std::hex << h;
    ASSERT_TRUE(sameValue(bf16ToFloat(bits), decodeBf16(bits))) << std::hex << h;
  }
}

TEST(HalfConversion, EveryBitPatternRoundTrips) {
  // NaN must stay NaN with its sign; every other pattern must come back bit for bit.
  auto roundTrips = [](std::uint16_t in, std::uint16_t out, std::uint16_t expMask) {
    auto isNan = [expMask](std::uint16_t v) { return (v & expMask) == expMask && (v & ~expMask & 0x7fff) != 0; };
    return isNan(in) ? isNan(out) && (out & 0x8000) == (in & 0x8000) : out == in;
  };
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    EXPECT_TRUE(roundTrips(bits, floatToHalf(halfToFloat(bits)), 0x7c00)) << std::hex << h;
    EXPECT_TRUE(roundTrips(bits, floatToBf16(bf16ToFloat(bits)), 0x7f80)) << std::hex << h;
  }
}

// Floats on a sweep of all 2^32 patterns, plus every midpoint between adjacent fp16/bf16 values
// and its two float neighbours: the ties and near-ties where round-to-nearest-even matters.
TEST(HalfConversion, FloatRoundingMatchesReference) {
  auto check = [](float f) {
    const double wantH = refHalf(f), wantB = refBf16(f);
    ASSERT_TRUE(sameValue(decodeHalf(floatToHalf(f)), wantH)) << std::hexfloat << f;
    ASSERT_TRUE(sameValue(decodeBf16(floatToBf16(f)), wantB)) << std::hexfloat << f;
  };
  for (std::uint64_t bits = 0; bits < (1ULL << 32); bits += 997) check(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    for (double sign : {1.0, -1.0}) {
      const auto mid = static_cast<float>(sign * (decodeHalf(static_cast<std::uint16_t>(h)) +
                                                  decodeHalf(static_cast<std::uint16_t>(h + 1))) / 2);
      for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f * static_cast<float>(sign))}) check(f);
    }
  }
  for (std::uint32_t h = 0; h < 0x7f80; ++h) {
    const auto mid = static_cast<float>((decodeBf16(static_cast<std::uint16_t>(h)) +
                                         decodeBf16(static_cast<std::uint16_t>(h + 1))) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e38f), -mid}) check(f);
  }
}

TEST(HalfConversion, RoundToNearestEvenCases) {
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);             // tie, even is below
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie, even is above
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just past the tie
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // the tie above the largest finite rounds to inf
  EXPECT_EQ(floatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);      // half the smallest subnormal: ties to 0
  EXPECT_EQ(floatToHalf(3 * 0x1p-25f), 0x0002);  // 1.5 ulp: ties to 2
  EXPECT_EQ(floatToHalf(0x1p-25f + 0x1p-40f), 0x0001);
  EXPECT_EQ(floatToHalf(1023.5f * 0x1p-24f), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBf16(std::bit_cast<float>(0x7f800001u)) & 0x7fc0, 0x7fc0);  // a signalling NaN comes out quiet
}

// The 8-bit floats: every code decodes by the formula and round-trips (NaN stays NaN with its
// sign), and every float between and around their values (each midpoint, its neighbours, and a
// sweep of all 2^32 patterns) rounds as the reference does: to nearest even, e4m3 saturating.
TEST(Fp8Conversion, EveryCodeAndEveryMidpointMatchTheReference) {
  for (std::uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    ASSERT_TRUE(sameValue(e4m3ToFloat(b), decodeE4m3(b))) << std::hex << c;
    ASSERT_TRUE(sameValue(e5m2ToFloat(b), decodeE5m2(b))) << std::hex << c;
    const bool nan4 = (c & 0x7f) == 0x7f, nan5 = (c & 0x7f) > 0x7c;
    EXPECT_TRUE(nan4 ? (floatToE4m3(e4m3ToFloat(b)) & 0x7f) == 0x7f : floatToE4m3(e4m3ToFloat(b)) == b) << std::hex << c;
    EXPECT_TRUE(nan5 ? (floatToE5m2(e5m2ToFloat(b)) & 0x7f) > 0x7c : floatToE5m2(e5m2ToFloat(b)) == b) << std::hex << c;
  }
  auto check = [](float f) {
    ASSERT_TRUE(sameValue(decodeE4m3(floatToE4m3(f)), refE4m3(f))) << std::hexfloat << f;
    ASSERT_TRUE(sameValue(decodeE5m2(floatToE5m2(f)), refE5m2(f))) << std::hexfloat << f;
  };
  for (std::uint64_t bits = 0; bits < (1ULL << 32); bits += 997) check(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  for (std::uint32_t c = 0; c < 0x7e; ++c)
    for (auto decode : {decodeE4m3, decodeE5m2}) {
      const auto mid = static_cast<float>((decode(static_cast<std::uint8_t>(c)) + decode(static_cast<std::uint8_t>(c + 1))) / 2);
      for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) check(f);
    }
  EXPECT_EQ(floatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(floatToE4m3(1e6f), 0x7e);  // saturates: e4m3 has no infinity
  EXPECT_EQ(floatToE4m3(-std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(floatToE5m2(57344.0f), 0x7b);
  EXPECT_EQ(floatToE5m2(61440.0f), 0x7c);  // the tie above the largest finite rounds to inf
  EXPECT_EQ(floatToE4m3(0x1p-10f), 0x00);  // half the smallest subnormal (2^-9): ties to 0
  EXPECT_EQ(floatToE4m3(3 * 0x1p-10f), 0x02);
}

TEST(ElementAccess, StoreRoundsDoubleOnceAndLoadIsExact) {
  std::uint16_t h = 0;
  storeFromDouble(&h, 0, DataType::kFloat16, 1.0 + 0x1p-11 + 0x1p-40);  // via a rounded float it would be a tie
  EXPECT_EQ(h, 0x3c01);
  storeFromDouble(&h, 0, DataType::kFloat16, 1.0 + 0x1p-11);
  EXPECT_EQ(h, 0x3c00);
  storeFromDouble(&h, 0, DataType::kBfloat16, 1.0 + 0x1p-8 + 0x1p-40);
  EXPECT_EQ(h, 0x3f81);
  storeFromDouble(&h, 0, DataType::kFloat16, 1e300);
  EXPECT_EQ(h, 0x7c00);
  unsigned char buf[4 * 8] = {};
  for (DataType t : kAllTypes) {
    const bool isUnsigned = t == DataType::kUint8 || t == DataType::kUint16 || t == DataType::kUint32 || t == DataType::kUint64;
    const double v = isUnsigned ? 77.0 : dataTypeSize(t) == 1 && isFloating(t) ? -80.0 : -77.0;  // (80: 1.25 x 2^6)
    storeFromDouble(buf + 1, 2, t, v);  // unaligned on purpose
    EXPECT_EQ(loadAsDouble(buf + 1, 2, t), v) << dataTypeName(t);
    EXPECT_EQ(decodeAt(buf + 1, 2, t), v) << dataTypeName(t);
  }
}

TEST(Names, TypesAndOps) {
  const char* types[] = {"int8",     "uint8",       "int32",       "uint32", "int64", "uint64", "float16",
                         "float32",  "float64",     "bfloat16",    "float8_e4m3", "float8_e5m2", "int16", "uint16"};
  for (int i = 0; i < kNumDataTypes; ++i) EXPECT_STREQ(dataTypeName(static_cast<DataType>(i)), types[i]);
  const char* ops[] = {"sum", "prod", "max", "min", "avg"};
  for (int i = 0; i < kNumReduceOps; ++i) EXPECT_STREQ(reduceOpName(static_cast<ReduceOp>(i)), ops[i]);
  EXPECT_STREQ(dataTypeName(static_cast<DataType>(42)), "?");
  EXPECT_STREQ(reduceOpName(static_cast<ReduceOp>(-1)), "?");
}

TEST(Dispatch, OverrideFallsBackToAuto) {
  setIsaOverride(nullptr);
  const std::string detected = isaName();
  EXPECT_TRUE(detected == "generic" || detected == "avx2" || detected == "avx512") << detected;
  setIsaOverride("generic");
  EXPECT_STREQ(isaName(), "generic");
  setIsaOverride("no-such-isa");
  EXPECT_EQ(isaName(), detected);
  setIsaOverride("auto");
  EXPECT_EQ(isaName(), detected);
}

TEST(Dispatch, InvalidTypeOrOpDoesNothing) {
  std::int32_t a[4] = {1, 2, 3, 4}, d[4] = {9, 9, 9, 9};
  reduce(d, a, a, 4, static_cast<DataType>(42), ReduceOp::kSum);
  reduce(d, a, a, 4, DataType::kInt32, static_cast<ReduceOp>(9));
  divide(d, 4, static_cast<DataType>(-3), 2);
  for (std::int32_t v : d) EXPECT_EQ(v, 9);
}

// A copy function: every byte of the destination between guard bytes, for every pair of source
// and destination offsets within a 16-byte line and sizes around its 16- and 64-byte steps and
// around kRepMovsbMinBytes.
void expectExactCopies(void (*copyFn)(void*, const void*, std::size_t), const char* name) {
  const std::size_t sizes[] = {0, 1, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1009, 4096,
                               kRepMovsbMinBytes - 1, kRepMovsbMinBytes, kRepMovsbMinBytes + 1, 65537};
  std::vector<unsigned char> src(65537 + 64), dst(65537 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (std::size_t so = 0; so < 16; ++so)
    for (std::size_t d = 0; d < 16; ++d)
      for (std::size_t n : sizes) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        copyFn(dst.data() + 16 + d, src.data() + so, n);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 16 + d && i < 16 + d + n;
          const unsigned char want = inside ? src[so + i - 16 - d] : 0xEE;
          ASSERT_EQ(dst[i], want) << name << ": byte " << i << ", size " << n << ", source offset " << so
                                  << ", destination offset " << d;
        }
      }
}

TEST(StreamingCopy, CopiesExactlyAtEveryAlignment) { expectExactCopies(streamingCopy, "streamingCopy"); }

// plainCopy as this machine chose it (braid info says which), and both of its ways whatever it chose.
TEST(PlainCopy, CopiesExactlyAtEveryAlignment) {
  std::printf("plainCopy here: %s\n", plainCopyName());
  expectExactCopies(plainCopy, "plainCopy");
  expectExactCopies(repMovsbCopy, "repMovsbCopy");
}

}  // namespace
}  // namespace braid::kernels
