// Connect on use (BRAID_CONNECT=used): at creation a rank connects only its host's ranks and the
// peers its algorithms reach; send/recv between ranks not connected yet (both directions at once),
// all-to-all, and broadcasts and reduces from every root then connect the rest, exactly. A call that would need
// more descriptors than a rank may open is refused there, and every rank fails within seconds
// with the numbers. Ranks on pretend hosts (BRAID_HOSTID): shm within, tcp or ib (the verbs
// emulation) across.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "base/fdlimit.h"
#include "braid/braid.h"
#include "comm/c_handle.h"
#include "tests/common/harness.h"

namespace braid::test {
namespace {

constexpr int kRanks = 12;  // 6 pretend hosts of 2
const Env kEnv = {{"BRAID_CONNECT", "used"}, {"BRAID_HOSTID", "h{rank/2}"}};

int connectedCount(braidComm_t comm, int n) {
  int k = 0;
  for (int p = 0; p < n; ++p) k += comm->impl->connectedTo(p);
  return k;
}

// Across the pretend hosts: tcp, or ib over the verbs emulation (queue pairs traded through the
// store on first use, the peer's address read from it).
class ConnectOnUseAcross : public ::testing::TestWithParam<std::string> {};

TEST_P(ConnectOnUseAcross, PeersNotConnectedAtCreationAreReachedExactly) {
  const std::string across = GetParam();
  Env env = kEnv;
  if (across == "ib") env.push_back({"BRAID_IBVERBS_LIB", fakeIbverbsLib()});
  else env.push_back({"BRAID_IB_DISABLE", "1"});
  auto outcome = runRanks(kRanks, [&](int rank, braidComm_t comm) {
    const int n = kRanks;
    const int atCreation = connectedCount(comm, n);
    const int elsewhere = (rank + 2) % n;
    if (comm->impl->transportOf(elsewhere) != across)
      return report(rank, "rank " + std::to_string(elsewhere) + " is reached over " + comm->impl->transportOf(elsewhere)), 12;
    // This host's other rank is connected; some peer on another host is not.
    if (!comm->impl->connectedTo(rank ^ 1)) return report(rank, "its host's other rank is not connected"), 1;
    if (atCreation >= n - 1) return report(rank, "every peer was connected at creation"), 2;
    std::vector<int> unreached;
    for (int p = 0; p < n; ++p)
      if (p != rank && !comm->impl->connectedTo(p)) unreached.push_back(p);
    // Broadcasts and reduces from every root: the trees of roots other than 0 connect on first use.
    for (int root = 0; root < n; ++root) {
      std::vector<double> b(13, root == rank ? root + 0.5 : -1);
      if (braidBroadcast(b.data(), b.data(), 13, braidFloat64, root, comm, nullptr) != braidSuccess) return 8;
      for (double v : b)
        if (v != root + 0.5) return report(rank, "broadcast from " + std::to_string(root) + " wrong"), 9;
    }
    for (int root = n - 1; root >= 0; --root) {
      std::vector<long> mine(11, rank + root), sum(11, -1);
      if (braidReduce(mine.data(), sum.data(), 11, braidInt64, braidSum, root, comm, nullptr) != braidSuccess)
        return report(rank, "reduce to " + std::to_string(root) + ": " + braidGetLastError(comm)), 10;
      for (long v : sum)
        if (rank == root && v != n * (n - 1) / 2 + n * root) return report(rank, "reduce to " + std::to_string(root) + " wrong"), 11;
    }
    // Every pair, both directions at once: a group of a send to and a receive from each other rank,
    // 1,009 ints whose values say who sent them to whom.
    const std::size_t count = 1009;
    std::vector<std::vector<int>> out(n, std::vector<int>(count)), in(n, std::vector<int>(count, -1));
    braidGroupStart();
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      for (std::size_t i = 0; i < count; ++i) out[p][i] = static_cast<int>(rank * 100000 + p * 1000 + i % 1000);
      braidSend(out[p].data(), count, braidInt32, p, comm, nullptr);
      braidRecv(in[p].data(), count, braidInt32, p, comm, nullptr);
    }
    if (braidGroupEnd() != braidSuccess) return report(rank, "send/recv group: " + std::string(braidGetLastError(comm))), 3;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; p != rank && i < count; ++i)
        if (in[p][i] != static_cast<int>(p * 100000 + rank * 1000 + i % 1000))
          return report(rank, "wrong element " + std::to_string(i) + " from rank " + std::to_string(p)), 4;
    if (connectedCount(comm, n) != n - 1) return report(rank, "not every peer connected after the group"), 5;
    // All-to-all (7 elements a block), exact, over the new connections.
    std::vector<float> a2aIn(7 * n), a2aOut(7 * n, -1);
    for (int d = 0; d < n; ++d)
      for (int i = 0; i < 7; ++i) a2aIn[d * 7 + i] = static_cast<float>(rank * 1000 + d * 10 + i);
    if (braidAllToAll(a2aIn.data(), a2aOut.data(), 7, braidFloat32, comm, nullptr) != braidSuccess) return 6;
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < 7; ++i)
        if (a2aOut[s * 7 + i] != static_cast<float>(s * 1000 + rank * 10 + i)) return report(rank, "all-to-all wrong"), 7;
    if (rank == 0)
      std::fprintf(stderr, "rank 0: %d of %d peers connected at creation, %zu reached on first use\n", atCreation, n - 1,
                   unreached.size());
    return 0;
  }, env, 180);
  expectEveryRankSucceeded(outcome);
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectOnUseAcross, ::testing::Values(std::string("tcp"), std::string("ib")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// 8 ranks on one host and 1 on another: the first host's ring neighbours of the lone rank connect
// every peer at creation, the others do not; every rank must still choose the same algorithm for a
// small all-reduce (the one-shot all-reduce is a candidate only where every rank knows every pair
// is connected).
TEST(ConnectOnUse, RanksThatConnectedDifferentPeersChooseTheSameAlgorithms) {
  auto outcome = runRanks(9, [&](int rank, braidComm_t comm) {
    for (int round = 0; round < 3; ++round) {
      long v = rank + round, sum = -1;
      if (braidAllReduce(&v, &sum, 1, braidInt64, braidSum, comm, nullptr) != braidSuccess)
        return report(rank, "all-reduce: " + std::string(braidGetLastError(comm))), 1;
      if (sum != 36 + 9 * round) return report(rank, "all-reduce gave " + std::to_string(sum)), 2;
      if (braidBarrier(comm) != braidSuccess) return report(rank, "barrier: " + std::string(braidGetLastError(comm))), 3;
    }
    return 0;
  }, {{"BRAID_HOSTID", "h{rank@8,1}"}, {"BRAID_TIMEOUT", "30"}}, 90);
  expectEveryRankSucceeded(outcome);
}

// The even ranks lower their own limit on open files after creation to what they have open plus
// 10: an all-to-all (2 sockets for each peer not reached yet) is refused there before anything is
// sent, and every rank (the odd ones, ready to connect, too) fails within seconds, not at
// BRAID_TIMEOUT, with the numbers: the refusal fails the communicator on every rank.
TEST(ConnectOnUse, CallBeyondTheDescriptorLimitIsRefusedOnEveryRankWithTheNumbers) {
  auto outcome = runRanks(kRanks, [&](int rank, braidComm_t comm) {
    const int n = kRanks;
    if (rank % 2 == 0) {
      const rlim_t cap = static_cast<rlim_t>(fdlimit::openNow() + 10);
      rlimit low{cap, cap};
      if (setrlimit(RLIMIT_NOFILE, &low) != 0) return report(rank, "setrlimit failed"), 1;
    }
    std::vector<int> in(3 * n, rank), out(3 * n, -1);
    const auto t0 = std::chrono::steady_clock::now();
    braidResult_t r = braidAllToAll(in.data(), out.data(), 3, braidInt32, comm, nullptr);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string why = braidGetLastError(comm);
    if (r == braidSuccess) return report(rank, "all-to-all succeeded"), 2;
    for (const char* must : {"open files", "ulimit -n", "refused before anything was sent", "alltoall"})
      if (why.find(must) == std::string::npos) return report(rank, "the error does not say '" + std::string(must) + "': " + why), 3;
    if (took > 10) return report(rank, "the refusal took " + std::to_string(took) + " s"), 4;
    long v = 1;
    if (braidAllReduce(&v, &v, 1, braidInt64, braidSum, comm, nullptr) == braidSuccess)
      return report(rank, "an all-reduce on the failed communicator succeeded"), 5;
    if (rank < 2) std::fprintf(stderr, "rank %d, after %.2f s: %s\n", rank, took, why.c_str());
    return 0;
  }, {{"BRAID_CONNECT", "used"}, {"BRAID_HOSTID", "h{rank/2}"}, {"BRAID_TIMEOUT", "60"}}, 120);
  expectEveryRankSucceeded(outcome);
}

}  // namespace
}  // namespace braid::test
