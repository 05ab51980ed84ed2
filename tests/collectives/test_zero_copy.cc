// Zero-copy all-reduce on braidMemAlloc buffers: exact results for every type and op, in place and
// out of place, odd sizes; and the fallback when only some ranks use Braid memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "comm/memory.h"
#include "tests/common/harness.h"
#include "tools/pattern.h"

namespace braid::test {
namespace {

TEST(BraidMemory, AllocateFindRelease) {
  void* p = nullptr;
  ASSERT_EQ(braidMemAlloc(&p, 1 << 20), braidSuccess);
  auto* b = static_cast<std::byte*>(p);
  EXPECT_EQ(b[12345], std::byte{0});  // zeroed
  EXPECT_TRUE(mem::find(b + 100, 1000).has_value());
  EXPECT_FALSE(mem::find(b + (1 << 20) - 10, 11).has_value());  // runs past the end
  EXPECT_EQ(mem::describe(b + 64, 8).offset, 64u);
  int local = 0;
  EXPECT_EQ(mem::describe(&local, sizeof(local)).fd, -1);
  EXPECT_EQ(braidMemFree(p), braidSuccess);
  EXPECT_FALSE(mem::find(b, 1).has_value());
  EXPECT_EQ(braidMemFree(&local), braidInvalidArgument);
  EXPECT_EQ(braidMemFree(nullptr), braidSuccess);
  EXPECT_EQ(braidMemAlloc(nullptr, 10), braidInvalidArgument);
  EXPECT_EQ(braidMemAlloc(&p, 0), braidInvalidArgument);
}

// A peer's memory is mapped through /proc/<pid>/fd/<fd>; if that path leads to another file (a pid
// seen from another PID namespace names another process), the mapping is refused, not made.
TEST(BraidMemory, MappingChecksThatTheFileIsThePeersAllocation) {
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(braidMemAlloc(&a, 1 << 16), braidSuccess);
  ASSERT_EQ(braidMemAlloc(&b, 1 << 16), braidSuccess);
  static_cast<std::byte*>(a)[100] = std::byte{42};
  mem::PeerMappings peers;
  const mem::RegionDesc right = mem::describe(static_cast<std::byte*>(a) + 100, 1);
  auto mapped = peers.map(static_cast<int>(getpid()), right);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_EQ(**mapped, std::byte{42});
  mem::RegionDesc wrong = right;
  wrong.fd = mem::describe(b, 1).fd;  // b's file where a's is expected
  wrong.id += 1;                      // (not in the cache)
  auto refused = peers.map(static_cast<int>(getpid()), wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("PID namespaces"), std::string::npos) << refused.status().message();
  peers.clear();
  EXPECT_EQ(braidMemFree(a), braidSuccess);
  EXPECT_EQ(braidMemFree(b), braidSuccess);
}

// useBraidMemory(rank) says which ranks allocate with braidMemAlloc.
void runAllReduces(int n, const std::function<bool(int)>& useBraidMemory, bool expectZeroCopy) {
  auto outcome = runRanks(n, [&](int rank, braidComm_t comm) {
    const std::size_t maxBytes = (1u << 20) * 8 + 64;
    std::byte *send = nullptr, *recv = nullptr;
    std::vector<std::byte> a, b;
    if (useBraidMemory(rank)) {
      void *s, *r;
      if (braidMemAlloc(&s, maxBytes) != braidSuccess || braidMemAlloc(&r, maxBytes) != braidSuccess) return 90;
      send = static_cast<std::byte*>(s);
      recv = static_cast<std::byte*>(r);
    } else {
      a.resize(maxBytes);
      b.resize(maxBytes);
      send = a.data();
      recv = b.data();
    }
    long wrong = 0;
    for (int ti = 0; ti < kNumDataTypes; ++ti)
      for (int oi = 0; oi < kNumReduceOps; ++oi)
        for (int inPlace = 0; inPlace < 2; ++inPlace) {
          auto t = static_cast<DataType>(ti);
          auto op = static_cast<ReduceOp>(oi);
          // At least 256 KiB (the zero-copy threshold), not a multiple of the rank count.
          std::size_t count = (256u << 10) / dataTypeSize(t) + 2 * static_cast<std::size_t>(ti) + 1;
          std::byte* s = send + ti % 4;  // unaligned too
          std::byte* r = inPlace ? s : recv + oi % 3;
          pattern::fill(s, count, t, op, rank);
          braidResult_t res = braidAllReduce(s, r, count, static_cast<braidDataType_t>(t), static_cast<braidRedOp_t>(op),
                                             comm, nullptr);
          if (res != braidSuccess) {
            report(rank, std::string("allreduce failed: ") + braidGetLastError(comm));
            return 1;
          }
          std::size_t w = pattern::countWrong(r, count, t, op, n, 0);
          if (w) report(rank, std::string(dataTypeName(t)) + " " + reduceOpName(op) + (inPlace ? " in-place: " : ": ") +
                                  std::to_string(w) + " wrong");
          wrong += static_cast<long>(w);
        }
    if (useBraidMemory(rank)) {
      braidMemFree(send);
      braidMemFree(recv);
    }
    const std::uint64_t direct = comm->impl->zeroCopyCalls(), calls = kNumDataTypes * kNumReduceOps * 2;
    if (expectZeroCopy != (direct == calls)) {
      report(rank, std::to_string(direct) + " of " + std::to_string(calls) + " all-reduces went zero-copy");
      return 3;
    }
    return wrong ? 2 : 0;
  }, {}, 300);
  expectEveryRankSucceeded(outcome);
}

class ZeroCopy : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCopy, EveryTypeAndOpIsExact) {
  runAllReduces(GetParam(), [](int) { return true; }, true);
}

TEST_P(ZeroCopy, RanksWithoutBraidMemoryMakeEveryoneFallBack) {
  runAllReduces(GetParam(), [](int rank) { return rank != 1; }, false);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopy, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace braid::test
