// Connect on use (BRAID_CONNECT=used): at creation a rank connects only its host's ranks and the
// peers its algorithms reach; send/recv between ranks not connected yet (both directions at once),
// all-to-all, and broadcasts from every root then connect the rest, exactly. A call that would need
// more descriptors than the process may open is refused on every rank with the numbers, and the
// communicator stays usable. Ranks on pretend hosts (BRAID_HOSTID): shm within, tcp across.
#include <gtest/gtest.h>
#include <sys/resource.h>

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

TEST(ConnectOnUse, PeersNotConnectedAtCreationAreReachedExactly) {
  auto outcome = runRanks(kRanks, [&](int rank, braidComm_t comm) {
    const int n = kRanks;
    const int atCreation = connectedCount(comm, n);
    // This host's other rank is connected; some peer on another host is not.
    if (!comm->impl->connectedTo(rank ^ 1)) return report(rank, "its host's other rank is not connected"), 1;
    if (atCreation >= n - 1) return report(rank, "every peer was connected at creation"), 2;
    std::vector<int> unreached;
    for (int p = 0; p < n; ++p)
      if (p != rank && !comm->impl->connectedTo(p)) unreached.push_back(p);
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
    // All-to-all (7 elements a block) and a broadcast from every root, exact, over the new connections.
    std::vector<float> a2aIn(7 * n), a2aOut(7 * n, -1);
    for (int d = 0; d < n; ++d)
      for (int i = 0; i < 7; ++i) a2aIn[d * 7 + i] = static_cast<float>(rank * 1000 + d * 10 + i);
    if (braidAllToAll(a2aIn.data(), a2aOut.data(), 7, braidFloat32, comm, nullptr) != braidSuccess) return 6;
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < 7; ++i)
        if (a2aOut[s * 7 + i] != static_cast<float>(s * 1000 + rank * 10 + i)) return report(rank, "all-to-all wrong"), 7;
    for (int root = 0; root < n; ++root) {
      std::vector<double> b(13, root == rank ? root + 0.5 : -1);
      if (braidBroadcast(b.data(), b.data(), 13, braidFloat64, root, comm, nullptr) != braidSuccess) return 8;
      for (double v : b)
        if (v != root + 0.5) return report(rank, "broadcast from " + std::to_string(root) + " wrong"), 9;
    }
    if (rank == 0)
      std::fprintf(stderr, "rank 0: %d of %d peers connected at creation, %zu reached on first use\n", atCreation, n - 1,
                   unreached.size());
    return 0;
  }, kEnv, 180);
  expectEveryRankSucceeded(outcome);
}

// Each rank lowers its own limit on open files after creation to what it has open plus 10: an
// all-to-all (2 sockets for each peer not reached yet) is refused on every rank with the numbers,
// before anything is sent; the same communicator then runs an all-reduce exactly.
TEST(ConnectOnUse, CallBeyondTheDescriptorLimitIsRefusedAndTheCommunicatorStaysUsable) {
  auto outcome = runRanks(kRanks, [&](int rank, braidComm_t comm) {
    const int n = kRanks;
    const rlim_t cap = static_cast<rlim_t>(fdlimit::openNow() + 10);
    rlimit low{cap, cap};
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return report(rank, "setrlimit failed"), 1;
    std::vector<int> in(3 * n, rank), out(3 * n, -1);
    braidResult_t r = braidAllToAll(in.data(), out.data(), 3, braidInt32, comm, nullptr);
    const std::string why = braidGetLastError(comm);
    if (r != braidInvalidUsage) return report(rank, "all-to-all returned " + std::to_string(r) + ": " + why), 2;
    for (const char* must : {"open files", "ulimit -n", "refused before anything was sent", "alltoall"})
      if (why.find(must) == std::string::npos) return report(rank, "the refusal does not say '" + std::string(must) + "': " + why), 3;
    std::vector<long> sum(5, rank + 1), got(5, 0);
    if (braidAllReduce(sum.data(), got.data(), 5, braidInt64, braidSum, comm, nullptr) != braidSuccess)
      return report(rank, "all-reduce after the refusal: " + std::string(braidGetLastError(comm))), 4;
    for (long v : got)
      if (v != n * (n + 1) / 2) return report(rank, "all-reduce after the refusal is wrong"), 5;
    if (rank == 0) std::fprintf(stderr, "rank 0 refused: %s\n", why.c_str());
    return 0;
  }, kEnv, 120);
  expectEveryRankSucceeded(outcome);
}

}  // namespace
}  // namespace braid::test
