// The flight recorder over real processes: a stopped rank, a killed rank and an abort each leave
// the files that `braid trace` (the built binary, run as users run it) turns into a verdict naming
// the rank the others waited for; without BRAID_TRACE_DIR nothing is written.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "comm/c_handle.h"
#include "tests/common/harness.h"
#include "tools/trace.h"

namespace braid::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string makeTempDir() {
  char tmpl[] = "/tmp/braid-trace-mp-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

void removeDir(const std::string& dir) { std::system(("rm -rf '" + dir + "'").c_str()); }

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// A rank whose communicator failed aborts it (which joins its threads: clean under TSan) and exits
// with `code` (runRanks reads a negative value as "already destroyed or aborted").
int abortAndExit(braidComm_t comm, int code) {
  braidCommAbort(comm);
  return code;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }
std::string rankFile(const std::string& dir, int r) { return dir + "/braid-trace-rank" + std::to_string(r) + ".json"; }

// The `braid` binary beside the tests directory of the build.
std::string braidBinary() {
  char buf[4096] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  return self.substr(0, self.rfind('/')) + "/../braid";
}

// Runs `braid trace DIR` and returns what it printed.
std::string braidTrace(const std::string& dir, int* status = nullptr) {
  std::string cmd = "'";  // built piece by piece: GCC 12 warns (-Wrestrict) on the one-line concatenation
  cmd += braidBinary();
  cmd += "' trace '";
  cmd += dir;
  cmd += "' 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t k;
    while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
    int st = pclose(p);
    if (status) *status = st;
  }
  return out;
}

TEST(Trace, StoppedRankIsNamedAsTheOneThatNeverEntered) {
  const std::string dir = makeTempDir();
  Env env = {{"BRAID_TIMEOUT", "3"}, {"BRAID_TRACE_DIR", dir}};
  const int silent = 2;
  auto outcome = runRanks(4, [&](int rank, braidComm_t comm) {
    std::vector<float> a(1024, 1.0f), b(1024);
    for (int it = 0;; ++it) {
      if (rank == silent && it == 20) {
        raise(SIGSTOP);  // hung outside Braid until rank 0 lets it go
        braidCommAbort(comm);  // then gives up: the abort writes its file (#20 was its last call)
        return -100;
      }
      braidResult_t r = braidAllReduce(a.data(), b.data(), a.size(), braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      if (r != braidTimeout) report(rank, std::string("expected a timeout: ") + braidGetLastError(comm));
      // The file is written before the call returns.
      if (!exists(rankFile(dir, rank))) { report(rank, "no trace file after the failure"); return -1; }
      if (rank == 0) kill(comm->impl->pidOf(silent), SIGCONT);
      return abortAndExit(comm, r == braidTimeout ? -100 : -2);
    }
  }, env, 60);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(outcome[static_cast<std::size_t>(r)].exitStatus, 100) << "rank " << r;
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(exists(rankFile(dir, r))) << "rank " << r;
  int status = -1;
  std::string out = braidTrace(dir, &status);
  std::fprintf(stderr, "braid trace %s:\n%s", dir.c_str(), out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "verdict: rank ")) << out;
  EXPECT_TRUE(contains(out, " is stuck in allreduce #21 step ")) << out;
  EXPECT_TRUE(contains(out, "waiting for rank 2; rank 2 never entered #21 (last completed #20)")) << out;
  EXPECT_TRUE(contains(out, "rank 2 is silent")) << out;  // the survivors' error, quoted from their files
  removeDir(dir);
}

TEST(Trace, KilledRankWroteNoTrace) {
  const std::string dir = makeTempDir();
  Env env = {{"BRAID_TIMEOUT", "30"}, {"BRAID_TRACE_DIR", dir}, {"BRAID_SHM_DISABLE", "1"}, {"BRAID_IB_DISABLE", "1"}};
  const int victim = 1;
  auto outcome = runRanks(3, [&](int rank, braidComm_t comm) {
    std::vector<float> a(4096, 1.0f), b(4096);
    for (int it = 0;; ++it) {
      if (rank == victim && it == 10) raise(SIGKILL);
      braidResult_t r = braidAllReduce(a.data(), b.data(), a.size(), braidFloat32, braidSum, comm, nullptr);
      if (r == braidSuccess) continue;
      if (r != braidRemoteError) report(rank, braidGetLastError(comm));
      return abortAndExit(comm, r == braidRemoteError ? -100 : -1);
    }
  }, env, 60);
  EXPECT_EQ(outcome[0].exitStatus, 100);
  EXPECT_EQ(outcome[1].exitStatus, 128 + SIGKILL);
  EXPECT_EQ(outcome[2].exitStatus, 100);
  EXPECT_TRUE(exists(rankFile(dir, 0)));
  EXPECT_FALSE(exists(rankFile(dir, 1)));
  EXPECT_TRUE(exists(rankFile(dir, 2)));
  std::string out = braidTrace(dir);
  EXPECT_TRUE(contains(out, "rank 1 wrote no trace (killed?)\n")) << out;
  EXPECT_TRUE(contains(out, " is stuck in allreduce #11 step ")) << out;
  EXPECT_TRUE(contains(out, "waiting for rank 1; rank 1 wrote no trace (killed?)")) << out;
  removeDir(dir);
}

TEST(Trace, AbortWritesTheFileAndThePeerNamesTheAbortingRank) {
  const std::string dir = makeTempDir();
  Env env = {{"BRAID_TIMEOUT", "30"}, {"BRAID_TRACE_DIR", dir}, {"BRAID_TRACE_BUFFER", "3"}};
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    float x = 1, y = 0;
    for (int i = 0; i < 5; ++i)
      if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 1;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 is inside #6 by now
      braidCommAbort(comm);
      return exists(rankFile(dir, 0)) ? -100 : (report(rank, "abort wrote no file"), 2);
    }
    braidResult_t r = braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr);
    return r != braidSuccess ? abortAndExit(comm, -100) : 3;
  }, env, 60);
  for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100);
  std::ifstream in(rankFile(dir, 0));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = tools::parseRankTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().message() << "\n" << text;
  EXPECT_EQ(t->reason, "aborted");
  EXPECT_EQ(t->error, "rank 0 aborted the communicator");
  EXPECT_EQ(t->recorded, 5u);
  ASSERT_EQ(t->calls.size(), 3u);  // BRAID_TRACE_BUFFER=3: the last three
  EXPECT_EQ(t->calls.front().seq, 3u);
  EXPECT_EQ(t->calls.back().seq, 5u);
  EXPECT_EQ(t->calls.back().state, "done");
  ASSERT_EQ(t->calls.back().peers.size(), 1u);
  EXPECT_EQ(t->calls.back().peers[0].peer, 1);
  EXPECT_GT(t->calls.back().peers[0].recv, 0u);
  std::string out = braidTrace(dir);
  EXPECT_TRUE(contains(out, "verdict: rank 1 is stuck in allreduce #6 step 0 waiting for rank 0; rank 0 never entered "
                            "#6 (last completed #5)"))
      << out;
  removeDir(dir);
}

TEST(Trace, MismatchedCallsAreTheVerdict) {
  const std::string dir = makeTempDir();
  Env env = {{"BRAID_TIMEOUT", "30"}, {"BRAID_TRACE_DIR", dir}};
  auto outcome = runRanks(3, [](int rank, braidComm_t comm) {
    std::vector<float> a(1024 * 3, 1.0f), b(1024 * 3);
    if (braidAllReduce(a.data(), b.data(), 16, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 1;
    braidResult_t r = rank == 1 ? braidAllGather(a.data(), b.data(), 256, braidFloat32, comm, nullptr)
                                : braidAllReduce(a.data(), b.data(), 1024, braidFloat32, braidSum, comm, nullptr);
    if (r != braidInvalidUsage) report(rank, braidGetLastError(comm));
    return abortAndExit(comm, r == braidInvalidUsage ? -100 : -2);
  }, env, 60);
  for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100);
  std::string out = braidTrace(dir);
  EXPECT_TRUE(contains(out, "verdict: the ranks called different collectives as #2: rank 1 called allgather(count=256, "
                            "float32); ranks 0, 2 called allreduce(count=1024, float32, sum)"))
      << out;
  removeDir(dir);
}

TEST(Trace, NothingIsWrittenWithoutTraceDir) {
  const std::string dir = makeTempDir();
  Env env = {{"BRAID_TIMEOUT", "30"}};
  auto outcome = runRanks(2, [&](int rank, braidComm_t comm) {
    if (chdir(dir.c_str()) != 0) return 1;
    float x = 1, y = 0;
    if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess) return 2;
    if (rank == 0) braidCommAbort(comm);
    else if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess)  // the peer aborted
      braidCommAbort(comm);  // (a failure: would write the file if BRAID_TRACE_DIR were set)
    return -100;
  }, env, 60);
  for (auto& o : outcome) EXPECT_EQ(o.exitStatus, 100);
  EXPECT_TRUE(listDir(dir).empty()) << listDir(dir).front();
  int status = 0;
  std::string out = braidTrace(dir, &status);
  EXPECT_TRUE(contains(out, "verdict: no flight recorder files")) << out;
  EXPECT_NE(status, 0);
  removeDir(dir);
}

}  // namespace
}  // namespace braid::test
