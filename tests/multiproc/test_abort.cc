// braidCommAbort from another thread while collectives are in flight: every pending call returns
// within 2 seconds, nothing leaks (file descriptors, /dev/shm), and a new communicator then works in
// the same process. Two ranks live as two threads of this process so the leak checks see both.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"

namespace braid {
namespace {

int countDir(const char* path, const char* prefix) {
  int n = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
    closedir(d);
  }
  return n;
}
int openFds() { return countDir("/proc/self/fd", ""); }
int shmSegments() { return countDir("/dev/shm", "braid-"); }

// Two communicators (rank 0 and rank 1) in this process.
std::pair<braidComm_t, braidComm_t> makePair() {
  braidUniqueId id;
  EXPECT_EQ(braidGetUniqueId(&id), braidSuccess);
  braidComm_t a = nullptr, b = nullptr;
  std::thread t([&] { EXPECT_EQ(braidCommInitRank(&b, 2, id, 1), braidSuccess); });
  EXPECT_EQ(braidCommInitRank(&a, 2, id, 0), braidSuccess);
  t.join();
  return {a, b};
}

class Abort : public ::testing::TestWithParam<std::string> {};

TEST_P(Abort, PendingCallsEndQuicklyNothingLeaksAndANewCommunicatorWorks) {
  setenv("BRAID_SHM_DISABLE", GetParam() == "tcp" ? "1" : "0", 1);
  setenv("BRAID_IB_DISABLE", "1", 1);
  setenv("BRAID_TIMEOUT", "30", 1);
  // Warm up once so that lazily created process-wide state (hwloc, logging) is not counted as a leak.
  {
    auto pair = makePair();
    std::thread t([&] { braidCommDestroy(pair.second); });
    braidCommDestroy(pair.first);
    t.join();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // detached store threads wind down
  const int fdsBefore = openFds(), shmBefore = shmSegments();

  auto [a0, b0] = makePair();
  braidComm_t a = a0, b = b0;  // plain variables: lambdas below capture them
  std::atomic<bool> stop{false};
  std::vector<braidResult_t> last(2, braidSuccess);
  std::vector<double> returnedAt(2, 0);
  auto loop = [&](braidComm_t c, int i) {
    std::vector<float> x(1 << 18, 1.0f), y(1 << 18);
    while (!stop) {
      braidResult_t r = braidAllReduce(x.data(), y.data(), x.size(), braidFloat32, braidSum, c, nullptr);
      if (r != braidSuccess) {
        last[static_cast<std::size_t>(i)] = r;
        returnedAt[static_cast<std::size_t>(i)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        return;
      }
    }
  };
  std::thread t0(loop, a, 0), t1(loop, b, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double abortAt = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  EXPECT_EQ(braidCommAbort(a), braidSuccess);  // while t0 is inside a collective on `a`
  t0.join();
  t1.join();
  stop = true;
  // In flight: aborted. (A call that starts just after the abort gets invalid usage instead.)
  EXPECT_TRUE(last[0] == braidAborted || last[0] == braidInvalidUsage) << braidGetErrorString(last[0]);
  EXPECT_NE(last[1], braidSuccess);  // the peer learns of it too
  EXPECT_LT(returnedAt[0] - abortAt, 2.0);
  EXPECT_LT(returnedAt[1] - abortAt, 2.0);
  EXPECT_EQ(braidCommAbort(b), braidSuccess);
  // The handles stay valid: calls on them say what happened instead of touching freed memory.
  float z = 0;
  EXPECT_EQ(braidAllReduce(&z, &z, 1, braidFloat32, braidSum, a, nullptr), braidInvalidUsage);
  EXPECT_NE(std::string(braidGetLastError(a)).find("destroyed or aborted"), std::string::npos);
  EXPECT_EQ(braidBarrier(b), braidInvalidUsage);

  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(openFds(), fdsBefore) << "file descriptors leaked";
  EXPECT_EQ(shmSegments(), shmBefore) << "shared memory left in /dev/shm";

  auto [c0, d0] = makePair();
  braidComm_t c = c0, d = d0;
  float one = 1, sum0 = 0, sum1 = 0;
  std::thread t([&] { EXPECT_EQ(braidAllReduce(&one, &sum1, 1, braidFloat32, braidSum, d, nullptr), braidSuccess); });
  EXPECT_EQ(braidAllReduce(&one, &sum0, 1, braidFloat32, braidSum, c, nullptr), braidSuccess);
  t.join();
  EXPECT_EQ(sum0, 2);
  EXPECT_EQ(sum1, 2);
  std::thread td([&] { braidCommDestroy(d); });
  braidCommDestroy(c);
  td.join();
  unsetenv("BRAID_SHM_DISABLE");
  unsetenv("BRAID_IB_DISABLE");
}

INSTANTIATE_TEST_SUITE_P(Transports, Abort, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace braid
