// braidCommSplit and Communicator::split over real processes: new ranks follow the keys (ties by
// parent rank), every element of collectives on the new communicators is checked against the CPU
// reference, the parent keeps working beside its children and after them, a split of a split
// works, BRAID_SPLIT_NOCOLOR gives NULL, and one rank's bad arguments make every rank fail
// naming it, without a wait and with the parent still usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "comm/c_handle.h"
#include "tests/common/harness.h"

namespace braid::test {
namespace {

std::string failure(braidComm_t comm, braidResult_t r) {
  return std::string(braidGetErrorString(r)) + ": " + braidGetLastError(comm);
}

// Sum over `ranks` (their ids in the parent) of value(parent rank, i), exact in float32.
float expected(const std::vector<int>& ranks, std::size_t i) {
  float sum = 0;
  for (int r : ranks) sum += static_cast<float>((r * 13 + static_cast<int>(i) * 7) % 1009);
  return sum;
}

// An all-reduce on `comm` (whose members are `ranks`, by parent rank, and this rank is `me`) at
// counts 0, 1, a prime and a non-multiple of the rank count and of a chunk, out of place and in
// place; returns the number of wrong elements, or -1 if a call failed.
long allReduceWrong(braidComm_t comm, const std::vector<int>& ranks, int me) {
  long wrong = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{262147}}) {
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      std::vector<float> send(count + 1), recv(count + 1, -1);
      for (std::size_t i = 0; i < count; ++i) send[i + 1] = static_cast<float>((me * 13 + static_cast<int>(i) * 7) % 1009);
      float* out = inPlace ? send.data() + 1 : recv.data() + 1;  // +1: unaligned by 4 bytes
      braidResult_t r = braidAllReduce(send.data() + 1, out, count, braidFloat32, braidSum, comm, nullptr);
      if (r != braidSuccess) {
        std::fprintf(stderr, "rank %d: all-reduce of %zu: %s\n", me, count, failure(comm, r).c_str());
        return -1;
      }
      for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expected(ranks, i);
    }
  }
  return wrong;
}

// The members of this rank's new communicator (parent ranks in new-rank order) gathered through it.
std::vector<int> gatherMembers(braidComm_t comm, int me) {
  int n = 0;
  if (braidCommCount(comm, &n) != braidSuccess) return {};
  std::vector<int> all(static_cast<std::size_t>(n), -1);
  if (braidAllGather(&me, all.data(), 1, braidInt32, comm, nullptr) != braidSuccess) return {};
  return all;
}

class Split : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// color = rank % 3, key = -rank: each color's ranks in reverse order; the parent all-reduces
// between the children's calls; each child splits again (all one color, keys equal: ties keep the
// child's order) and that grandchild all-reduces too.
TEST_P(Split, NewRanksFollowTheKeysAndEveryCollectiveIsExact) {
  const auto [transport, n] = GetParam();
  auto outcome = runRanks(n, [n = n](int rank, braidComm_t comm) {
    const int color = rank % 3;
    std::vector<int> members;
    for (int r = n - 1; r >= 0; --r)
      if (r % 3 == color) members.push_back(r);
    braidComm_t child = nullptr;
    braidResult_t r = braidCommSplit(comm, color, -rank, &child);
    if (r != braidSuccess || !child) {
      std::fprintf(stderr, "rank %d: split: %s\n", rank, failure(comm, r).c_str());
      return 1;
    }
    int size = 0, childRank = -1;
    braidCommCount(child, &size);
    braidCommUserRank(child, &childRank);
    const int want = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    if (size != static_cast<int>(members.size()) || childRank != want) {
      std::fprintf(stderr, "rank %d: child rank %d of %d, expected %d of %zu\n", rank, childRank, size, want, members.size());
      return 2;
    }
    if (gatherMembers(child, rank) != members) return 3;
    std::vector<int> everyone(static_cast<std::size_t>(n));
    std::iota(everyone.begin(), everyone.end(), 0);
    if (allReduceWrong(child, members, rank) != 0) return 4;
    if (allReduceWrong(comm, everyone, rank) != 0) return 5;  // the parent, between the child's calls
    braidComm_t grandchild = nullptr;
    if ((r = braidCommSplit(child, 7, 0, &grandchild)) != braidSuccess || !grandchild) {
      std::fprintf(stderr, "rank %d: split of the split: %s\n", rank, failure(child, r).c_str());
      return 6;
    }
    if (gatherMembers(grandchild, rank) != members) return 7;
    if (allReduceWrong(grandchild, members, rank) != 0 || allReduceWrong(child, members, rank) != 0) return 8;
    if (braidCommDestroy(grandchild) != braidSuccess || braidCommDestroy(child) != braidSuccess) return 9;
    return allReduceWrong(comm, everyone, rank) == 0 ? 0 : 10;  // the parent, after its children
  }, transportEnv(transport));
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Split,
                         ::testing::Values(std::make_tuple("shm", 1), std::make_tuple("shm", 5), std::make_tuple("tcp", 4),
                                           std::make_tuple("hosts/2", 4)),
                         [](const auto& info) {
                           std::string t = std::get<0>(info.param);
                           std::replace(t.begin(), t.end(), '/', '_');
                           return t + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

TEST(SplitNoColor, GivesNullAndTheOthersFormTheirCommunicator) {
  auto outcome = runRanks(4, [](int rank, braidComm_t comm) {
    braidComm_t child = reinterpret_cast<braidComm_t>(&comm);  // must be overwritten with NULL
    braidResult_t r = braidCommSplit(comm, rank == 1 ? BRAID_SPLIT_NOCOLOR : 0, rank, &child);
    if (r != braidSuccess) {
      std::fprintf(stderr, "rank %d: split: %s\n", rank, failure(comm, r).c_str());
      return 1;
    }
    if (rank == 1) return child == nullptr ? 0 : 2;
    if (!child) return 3;
    if (gatherMembers(child, rank) != std::vector<int>{0, 2, 3}) return 4;
    if (allReduceWrong(child, {0, 2, 3}, rank) != 0) return 5;
    return braidCommDestroy(child) == braidSuccess ? 0 : 6;
  });
  expectEveryRankSucceeded(outcome);
}

// One rank's bad color, then another's NULL newcomm: every rank returns invalid argument at once,
// the bad rank saying what it passed and the others naming it; then the parent all-reduces and a
// good split works.
TEST(SplitBadArguments, EveryRankFailsNamingTheBadOneAndTheParentStaysUsable) {
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    braidComm_t child = nullptr;
    braidResult_t r = braidCommSplit(comm, rank == 1 ? -5 : 0, 0, &child);
    std::string said = braidGetLastError(comm);
    if (r != braidInvalidArgument || child) return 1;
    if (said.find(rank == 1 ? "color -5" : "rank 1 passed bad arguments") == std::string::npos) {
      std::fprintf(stderr, "rank %d said: %s\n", rank, said.c_str());
      return 2;
    }
    r = braidCommSplit(comm, 0, 0, rank == 2 ? nullptr : &child);
    said = braidGetLastError(comm);
    if (r != braidInvalidArgument || child) return 3;
    if (said.find(rank == 2 ? "newcomm is NULL" : "rank 2 passed bad arguments") == std::string::npos) {
      std::fprintf(stderr, "rank %d said: %s\n", rank, said.c_str());
      return 4;
    }
    if (allReduceWrong(comm, {0, 1, 2}, rank) != 0) return 5;
    if (braidGroupStart() != braidSuccess) return 6;
    r = braidCommSplit(comm, 0, 0, &child);
    if (braidGroupEnd() != braidSuccess || r != braidInvalidUsage) return 7;
    if (braidCommSplit(comm, 0, 0, &child) != braidSuccess || !child) return 8;
    if (allReduceWrong(child, {0, 1, 2}, rank) != 0) return 9;
    return braidCommDestroy(child) == braidSuccess ? 0 : 10;
  }, {}, 60);
  expectEveryRankSucceeded(outcome);
}

// The C++ API: split with a timeout of its own; nullopt for BRAID_SPLIT_NOCOLOR.
TEST(SplitCpp, CommunicatorSplit) {
  auto outcome = runRanks(4, [](int rank, braidComm_t comm) {
    Communicator parent(comm->impl);
    CommOptions options;
    options.timeoutSec = 30;
    auto child = parent.split(rank == 3 ? BRAID_SPLIT_NOCOLOR : rank / 2, rank, options);
    if (!child.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, child.status().toString().c_str());
      return 1;
    }
    if (rank == 3) return child->has_value() ? 2 : 0;
    if (!child->has_value()) return 3;
    Communicator& c = **child;
    const int wantSize = rank < 2 ? 2 : 1;
    if (c.size() != wantSize || c.rank() != rank % 2) return 4;
    std::vector<int> members = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2};
    std::vector<float> x(1031), y(1031, -1);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((rank * 13 + static_cast<int>(i) * 7) % 1009);
    Status s = c.allReduce(x.data(), y.data(), x.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    if (!s.ok()) return 5;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (y[i] != expected(members, i)) return 6;
    return 0;
  });
  expectEveryRankSucceeded(outcome);
}

}  // namespace
}  // namespace braid::test
