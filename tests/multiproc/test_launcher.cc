// Tests for `braid run`. Each runs the launcher binary as a child process, the way users and
// scripts do, and checks the contract they rely on: the environment ranks see, tagged output,
// and that one failed rank (or a signal to the launcher) ends the whole job quickly and cleanly.
// The launcher under test comes from --launcher=PATH (the build passes it).
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "topology/topology.h"

namespace {

using Clock = std::chrono::steady_clock;

// Past this the launcher is SIGKILLed and the test fails; its ranks follow via PR_SET_PDEATHSIG.
constexpr auto kRunLimit = std::chrono::seconds(30);
constexpr std::string_view kLauncherFlag = "--launcher=";

std::string& launcherPath() {
  static std::string path;
  return path;
}

struct Outcome {
  bool finished = false;  // false: it hit kRunLimit and was killed.
  int waitStatus = 0;
  std::string out;
  std::string err;
  double seconds = 0;  // From start until the launcher exited.

  int exitCode() const { return WIFEXITED(waitStatus) ? WEXITSTATUS(waitStatus) : -1; }
};

// Called after each chunk of output with the launcher's pid and what it has printed so far.
using OutputHook = std::function<void(pid_t, const Outcome&)>;

// Runs the launcher with `args` and collects its output until it exits: the end is the launcher's
// exit, not EOF (a rank's descendant may hold a pipe after it). With `stdoutFile`, the launcher's
// stdout is that file instead of a pipe.
Outcome launch(const std::vector<std::string>& args, const OutputHook& hook = {}, const std::string& stdoutFile = "") {
  Outcome result;
  std::vector<char*> argv{launcherPath().data()};
  std::vector<std::string> words = args;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);

  int outPipe[2];
  int errPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return result;
  }
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = stdoutFile.empty() ? outPipe[1] : ::open(stdoutFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(errPipe[1], STDERR_FILENO);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(126);
  }
  ::close(outPipe[1]);
  ::close(errPipe[1]);
  for (int fd : {outPipe[0], errPipe[0]}) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    ::close(outPipe[0]);
    ::close(errPipe[0]);
    return result;
  }

  auto drain = [&] {
    char buffer[4096];
    bool got = false;
    for (auto [fd, sink] : {std::pair{outPipe[0], &result.out}, std::pair{errPipe[0], &result.err}}) {
      for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0; got = true) sink->append(buffer, n);
    }
    if (got && hook) hook(pid, result);
  };
  for (;;) {
    pollfd fds[2] = {{outPipe[0], POLLIN, 0}, {errPipe[0], POLLIN, 0}};
    ::poll(fds, 2, 20);
    drain();
    if (::waitpid(pid, &result.waitStatus, WNOHANG) == pid) {
      result.finished = true;
      break;
    }
    if (Clock::now() - start > kRunLimit) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &result.waitStatus, 0);
      ADD_FAILURE() << "launcher still running after " << kRunLimit.count() << " s; killed it";
      break;
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  drain();
  ::close(outPipe[0]);
  ::close(errPipe[0]);
  return result;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

// Pids that ranks printed as "pid N" lines (tagged or not).
std::vector<pid_t> printedPids(const std::string& out) {
  std::vector<pid_t> pids;
  for (const std::string& line : lines(out)) {
    const std::size_t at = line.find("pid ");
    if (at != std::string::npos) pids.push_back(static_cast<pid_t>(std::stol(line.substr(at + 4))));
  }
  return pids;
}

bool isGone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

// Whether `pid` has ended: gone, or a zombie left for whichever process adopted it to reap.
bool hasEnded(pid_t pid) {
  if (isGone(pid)) return true;
  std::FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (stat == nullptr) return isGone(pid);
  char state = '?';
  const int fields = std::fscanf(stat, "%*d (%*[^)]) %c", &state);
  std::fclose(stat);
  return fields == 1 && (state == 'Z' || state == 'X');
}

// A scratch directory where ranks leave marker files, so a rank can fail only once the others
// are known to be up (and have printed their pids).
class TempDir {
 public:
  TempDir() {
    // Not temp_directory_path(): that consults TMPDIR, and tests take no configuration from the
    // environment.
    std::string pattern = "/tmp/braid-launcher-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> shell(const std::string& script) { return {"/bin/sh", "-c", script}; }

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Launcher, SetsTorchrunEnvironmentAndTagsLines) {
  const Outcome r = launch(concat(
      {"-n", "3", "--tag-output", "--"},
      shell("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
            "$GROUP_RANK $BRAID_LAUNCHER\"")));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  const auto got = lines(r.out);
  ASSERT_EQ(got.size(), 3u) << r.out;
  std::set<int> ranks;
  std::set<std::string> ports;
  for (const std::string& line : got) {
    int tag = -1, rank = -1, world = -1, local = -1, localWorld = -1, group = -1, marker = -1;
    long port = -1;
    char addr[64] = {};
    ASSERT_EQ(std::sscanf(line.c_str(), "[%d] %d %d %d %d %63s %ld %d %d", &tag, &rank, &world, &local,
                          &localWorld, addr, &port, &group, &marker),
              9)
        << line;
    EXPECT_EQ(tag, rank) << line;
    EXPECT_EQ(world, 3) << line;
    EXPECT_EQ(local, rank) << line;
    EXPECT_EQ(localWorld, 3) << line;
    EXPECT_STREQ(addr, "127.0.0.1") << line;
    EXPECT_GE(port, 1) << line;
    EXPECT_LE(port, 65535) << line;
    EXPECT_EQ(group, 0) << line;
    EXPECT_EQ(marker, 1) << line;
    ranks.insert(rank);
    ports.insert(std::to_string(port));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(ports.size(), 1u) << "ranks disagree on MASTER_PORT:\n" << r.out;
}

TEST(Launcher, SecondNodeOfTwoGetsRanksTwoAndThree) {
  const Outcome r = launch(concat(
      {"--nnodes", "2", "--node-rank", "1", "-n", "2", "--master-addr", "10.1.2.3", "--master-port",
       "29500", "--tag-output", "--"},
      shell("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"")));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_NE(r.out.find("[2] 2 4 0 1 10.1.2.3 29500\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[3] 3 4 1 1 10.1.2.3 29500\n"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out).size(), 2u) << r.out;
}

TEST(Launcher, AcceptsEqualsFormsAliasAndProgramWithoutDashes) {
  const Outcome r = launch(concat({"--nproc-per-node=2", "--master-port=12345", "--tag-output"},
                                       shell("echo $LOCAL_WORLD_SIZE $MASTER_PORT")));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_NE(r.out.find("[0] 2 12345\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] 2 12345\n"), std::string::npos) << r.out;
}

TEST(Launcher, UntaggedOutputArrivesUntouched) {
  const Outcome r = launch(concat({"-n", "2", "--"}, shell("echo hello $RANK; echo oops $RANK >&2")));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_NE(r.out.find("hello 0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hello 1\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('['), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("oops 1\n"), std::string::npos) << r.err;
}

// Where the launcher's stdout is a file, nothing can hold a reader waiting: ranks write to it
// directly (fd 1 is the file, not a pipe of the launcher's), in the launcher's order of lines.
TEST(Launcher, UntaggedRanksWriteStraightToAFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string file = dir.path() + "/out";
  const Outcome r = launch(concat({"-n", "2", "--"}, shell("echo rank $RANK fd1 $(readlink /proc/$$/fd/1)")), {}, file);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("rank 0 fd1 " + file + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 fd1 " + file + "\n"), std::string::npos) << text;
}

TEST(Launcher, TagsStderrSeparatelyAndFlushesPartialLastLine) {
  const Outcome r = launch(
      concat({"-n", "1", "--tag-output", "--"}, shell("echo to-err >&2; printf 'first\\npartial'")));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_NE(r.out.find("[0] first\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0] partial"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("to-err"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[0] to-err\n"), std::string::npos) << r.err;
}

TEST(Launcher, ManyLinesArriveWholeTaggedAndInOrder) {
  constexpr int kLines = 20000;
  const Outcome r = launch(
      concat({"-n", "4", "--tag-output", "--"}, shell("seq 1 " + std::to_string(kLines))));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  std::vector<int> next(4, 1);
  for (const std::string& line : lines(r.out)) {
    int tag = -1, value = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "[%d] %d", &tag, &value), 2) << line;
    ASSERT_TRUE(tag >= 0 && tag < 4) << line;
    ASSERT_EQ(value, next[tag]) << line;
    ++next[tag];
  }
  EXPECT_EQ(next, std::vector<int>(4, kLines + 1));
}

TEST(Launcher, AllRanksSucceedingMeansSuccess) {
  const Outcome r = launch({"-n", "4", "--", "/bin/true"});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST(Launcher, FailedRankStopsTheOthersAndSetsTheStatus) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string d = dir.path();
  const Outcome r = launch(concat(
      {"-n", "3", "--tag-output", "--"},
      shell("echo pid $$; if [ \"$RANK\" = 1 ]; then "
            "while [ ! -e " + d + "/0 ] || [ ! -e " + d + "/2 ]; do sleep 0.05; done; exit 7; fi; "
            "touch " + d + "/$RANK; exec sleep 60")));
  ASSERT_TRUE(r.finished);
  EXPECT_LT(r.seconds, 6.0);
  EXPECT_EQ(r.exitCode(), 7) << r.err;
  EXPECT_NE(r.err.find("braid run: rank 1 exited with status 7\n"), std::string::npos) << r.err;
  // Ranks the launcher stopped are not failures.
  EXPECT_EQ(r.err.find("rank 0 killed"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 2 killed"), std::string::npos) << r.err;
  const auto pids = printedPids(r.out);
  EXPECT_EQ(pids.size(), 3u) << r.out;
  for (pid_t pid : pids) EXPECT_TRUE(isGone(pid)) << "pid " << pid << " survived the launcher";
}

// The launcher's grace period between SIGTERM and SIGKILL (kStopGrace in tools/launcher.cc; the
// usage text states it).
constexpr double kGraceSeconds = 3.0;

// A rank that fails stops what every rank started, not only the ranks: each rank forks a child
// that holds its stdout and stderr (as data-loader workers or a logging subprocess do), with
// SIGTERM ignored or not. `braid run` returns within the grace period + 1 s of the failure with
// the failed rank's status, and no descendant is left.
void expectFailureStopsDescendants(bool descendantsIgnoreSigterm) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string d = dir.path();
  Clock::time_point failedAt{};
  const Outcome r = launch(
      concat({"-n", "3", "--tag-output", "--"},
             shell(std::string(descendantsIgnoreSigterm ? "trap '' TERM; " : "") + "sleep 60 & echo pid $!; touch " + d +
                   "/$RANK; if [ \"$RANK\" = 1 ]; then while [ ! -e " + d + "/0 ] || [ ! -e " + d +
                   "/2 ]; do sleep 0.05; done; exit 7; fi; wait")),
      [&](pid_t, const Outcome& soFar) {
        if (failedAt == Clock::time_point{} && soFar.err.find("exited with status 7") != std::string::npos)
          failedAt = Clock::now();
      });
  const auto end = Clock::now();
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 7) << r.err;
  EXPECT_NE(r.err.find("braid run: rank 1 exited with status 7\n"), std::string::npos) << r.err;
  ASSERT_NE(failedAt, Clock::time_point{}) << r.err;
  const double afterFailure = std::chrono::duration<double>(end - failedAt).count();
  EXPECT_LT(afterFailure, (descendantsIgnoreSigterm ? kGraceSeconds : 0.0) + 1.0) << r.err;
  const auto pids = printedPids(r.out);
  EXPECT_EQ(pids.size(), 3u) << r.out;
  for (pid_t pid : pids) EXPECT_TRUE(hasEnded(pid)) << "descendant " << pid << " survived the launcher";
}

TEST(Launcher, FailedRankStopsWhatEveryRankStarted) { expectFailureStopsDescendants(false); }

TEST(Launcher, FailedRankStopsDescendantsThatIgnoreSigtermWithinTheGracePeriod) { expectFailureStopsDescendants(true); }

// Every rank exits 0, one leaving a child in its process group: the launcher stops the child,
// says so, and still succeeds.
TEST(Launcher, ProcessesARankLeavesInItsGroupAreStopped) {
  const Outcome r = launch(concat({"-n", "2", "--tag-output", "--"},
                                  shell("if [ \"$RANK\" = 1 ]; then sleep 60 & echo pid $!; fi; exit 0")));
  ASSERT_TRUE(r.finished);
  EXPECT_LT(r.seconds, 3.0) << r.err;
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_NE(r.err.find("braid run: rank 1 exited, leaving processes running in its process group "), std::string::npos)
      << r.err;
  const auto pids = printedPids(r.out);
  ASSERT_EQ(pids.size(), 1u) << r.out;
  EXPECT_TRUE(hasEnded(pids[0])) << "pid " << pids[0];
}

// A rank exits 0 while a daemon it started (double fork, new session: outside its process group)
// keeps the rank's output pipe: the launcher returns at once and says which rank's output is held.
TEST(Launcher, ADaemonHoldingARanksOutputDoesNotKeepTheLauncher) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string pidFile = dir.path() + "/daemon";
  for (const bool tagged : {true, false}) {
    std::filesystem::remove(pidFile);
    std::vector<std::string> args{"-n", "2"};
    if (tagged) args.push_back("--tag-output");
    args.push_back("--");
    const Outcome r = launch(concat(args, shell("if [ \"$RANK\" = 0 ]; then (setsid sh -c 'echo $$ > " + pidFile +
                                                ".tmp; mv " + pidFile + ".tmp " + pidFile + "; exec sleep 60' &); " +
                                                "while [ ! -e " + pidFile + " ]; do sleep 0.02; done; fi; echo done $RANK")));
    std::ifstream in(pidFile);
    pid_t daemon = 0;
    in >> daemon;
    ASSERT_TRUE(r.finished);
    EXPECT_LT(r.seconds, 1.5) << r.err;
    EXPECT_EQ(r.exitCode(), 0) << r.err;
    EXPECT_NE(r.out.find(tagged ? "[0] done 0\n" : "done 0\n"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("braid run: something rank 0 started still holds its stdout and stderr (a process outside its "
                         "process group, such as a daemon)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("rank 1 started"), std::string::npos) << r.err;
    ASSERT_GT(daemon, 0) << "the daemon did not start";
    EXPECT_FALSE(hasEnded(daemon)) << "the launcher may not reach it, and did not";
    ::kill(daemon, SIGKILL);
  }
}

TEST(Launcher, RankThatIgnoresSigtermIsKilledWithinFiveSeconds) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string marker = dir.path() + "/up";
  const Outcome r = launch(concat(
      {"-n", "2", "--tag-output", "--"},
      shell("if [ \"$RANK\" = 0 ]; then while [ ! -e " + marker + " ]; do sleep 0.05; done; exit 3; fi; "
            "trap '' TERM; echo pid $$; touch " + marker + "; exec sleep 60")));
  ASSERT_TRUE(r.finished);
  EXPECT_LT(r.seconds, 5.5);
  EXPECT_EQ(r.exitCode(), 3) << r.err;
  EXPECT_NE(r.err.find("braid run: rank 0 exited with status 3\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 1 killed"), std::string::npos) << r.err;
  const auto pids = printedPids(r.out);
  ASSERT_EQ(pids.size(), 1u) << r.out;
  EXPECT_TRUE(isGone(pids[0]));
}

TEST(Launcher, RankKilledBySignalIsReported) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string marker = dir.path() + "/up";
  const Outcome r = launch(concat(
      {"-n", "2", "--tag-output", "--"},
      shell("echo pid $$; if [ \"$RANK\" = 0 ]; then while [ ! -e " + marker +
            " ]; do sleep 0.05; done; kill -9 $$; fi; touch " + marker + "; exec sleep 60")));
  ASSERT_TRUE(r.finished);
  EXPECT_LT(r.seconds, 6.0);
  EXPECT_EQ(r.exitCode(), 128 + SIGKILL) << r.err;
  EXPECT_NE(r.err.find("braid run: rank 0 killed by signal 9 ("), std::string::npos) << r.err;
  for (pid_t pid : printedPids(r.out)) EXPECT_TRUE(isGone(pid)) << "pid " << pid;
}

TEST(Launcher, ProgramThatCannotRunExits127) {
  const Outcome r = launch({"-n", "2", "--", "/nonexistent/braid-program"});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode(), 127) << r.err;
  EXPECT_NE(r.err.find("braid run: cannot execute /nonexistent/braid-program: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with status 127\n"), std::string::npos) << r.err;
}

void expectSignalStopsEverything(int sig) {
  bool sent = false;
  Clock::time_point sentAt;
  // Each rank prints its own pid and its child's, which the signal must reach too.
  const Outcome r = launch(concat({"-n", "2", "--tag-output", "--"}, shell("sleep 60 & echo pid $!; echo pid $$; wait")),
                                [&](pid_t launcher, const Outcome& soFar) {
                                  if (sent || printedPids(soFar.out).size() < 4) return;
                                  ::kill(launcher, sig);
                                  sent = true;
                                  sentAt = Clock::now();
                                });
  ASSERT_TRUE(r.finished);
  ASSERT_TRUE(sent) << r.out << r.err;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - sentAt).count(), 5.0);
  EXPECT_FALSE(WIFEXITED(r.waitStatus) && WEXITSTATUS(r.waitStatus) == 0) << r.err;
  EXPECT_EQ(r.err.find("exited with status"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("killed by signal"), std::string::npos) << r.err;
  const auto pids = printedPids(r.out);
  EXPECT_EQ(pids.size(), 4u) << r.out;
  for (pid_t pid : pids) EXPECT_TRUE(hasEnded(pid)) << "pid " << pid;
}

TEST(Launcher, SigtermToLauncherStopsAllRanks) { expectSignalStopsEverything(SIGTERM); }

TEST(Launcher, SigintToLauncherStopsAllRanks) { expectSignalStopsEverything(SIGINT); }

TEST(Launcher, RanksDieWhenTheLauncherIsKilled) {
  const Outcome r = launch(concat({"-n", "2", "--tag-output", "--"}, shell("echo pid $$; exec sleep 60")),
                                [sent = false](pid_t launcher, const Outcome& soFar) mutable {
                                  if (sent || printedPids(soFar.out).size() < 2) return;
                                  ::kill(launcher, SIGKILL);
                                  sent = true;
                                });
  ASSERT_TRUE(r.finished);
  ASSERT_TRUE(WIFSIGNALED(r.waitStatus)) << r.err;
  const auto pids = printedPids(r.out);
  ASSERT_EQ(pids.size(), 2u) << r.out;
  // Nobody is left to reap them at once, so give the kernel a moment to deliver PR_SET_PDEATHSIG.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (pid_t pid : pids) {
    while (!hasEnded(pid) && Clock::now() < deadline) ::usleep(10'000);
    EXPECT_TRUE(hasEnded(pid)) << "pid " << pid << " outlived its launcher";
  }
}

TEST(Launcher, BadArgumentsExitTwoWithUsage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0", "--", "/bin/true"}, "-n"},
      {{"-n", "abc", "/bin/true"}, "-n"},
      {{"-n"}, "missing value"},
      {{"-n", "1"}, "PROGRAM"},
      {{"-n", "1", "--"}, "PROGRAM"},
      {{"/bin/true"}, "-n"},
      {{"--bogus", "-n", "1", "/bin/true"}, "--bogus"},
      {{"--master-port", "70000", "-n", "1", "/bin/true"}, "--master-port"},
      {{"--nnodes", "2", "--node-rank", "0", "-n", "1", "--", "/bin/true"}, "--master-addr"},
      {{"--nnodes", "2", "--node-rank", "0", "-n", "1", "--master-addr", "h", "/bin/true"}, "--master-port"},
      {{"--nnodes", "2", "--node-rank", "2", "-n", "1", "--master-addr", "h", "--master-port", "9", "/bin/true"},
       "--node-rank"},
      {{"--nnodes", "0", "-n", "1", "/bin/true"}, "--nnodes"},
      {{"--tag-output=yes", "-n", "1", "/bin/true"}, "--tag-output"},
      {{"--bind-to", "socket", "-n", "1", "/bin/true"}, "--bind-to"},
  };
  for (const auto& [args, mention] : cases) {
    std::string joined;
    for (const std::string& a : args) joined += a + " ";
    const Outcome r = launch(args);
    ASSERT_TRUE(r.finished) << joined;
    EXPECT_EQ(r.exitCode(), 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("braid run: ", 0), 0u) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find("usage: braid run"), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

// CPU binding. Ranks print the CPUs they may run on; the test knows its own, but not which of them
// share a core (the launcher asks hwloc), so it checks the relations the contract promises. Lists
// are read with topology's parser, whose own test is in the unit suite.
using CpuSet = std::set<int>;

CpuSet toSet(const std::vector<int>& cpus) { return CpuSet(cpus.begin(), cpus.end()); }

CpuSet ownCpus() { return toSet(braid::topology::allowedCpus()); }

// Each rank's allowed CPUs by global rank, from a run of `n` ranks with `extra` options.
std::map<int, CpuSet> rankCpus(int n, const std::vector<std::string>& extra, Outcome* outcome) {
  *outcome = launch(concat(concat({"-n", std::to_string(n)}, extra),
                           concat({"--"}, shell("echo \"$RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)\""))));
  std::map<int, CpuSet> out;
  for (const std::string& line : lines(outcome->out)) {
    const std::size_t space = line.find(' ');
    if (space != std::string::npos) out[std::stoi(line.substr(0, space))] = toSet(braid::topology::parseCpuList(line.substr(space + 1)));
  }
  return out;
}

// Pinned ranks: K distinct sets (K = the cores this process may use), rank i's the same as rank
// i mod K's, the first K pairwise disjoint, all within this process's CPUs.
void expectDealtOutByCore(const std::map<int, CpuSet>& ranks, int n, const CpuSet& all) {
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(n));
  std::set<CpuSet> distinct;
  for (const auto& [rank, cpus] : ranks) distinct.insert(cpus);
  const int k = static_cast<int>(distinct.size());
  CpuSet seen;
  for (int i = 0; i < n; ++i) {
    const CpuSet& cpus = ranks.at(i);
    EXPECT_FALSE(cpus.empty()) << "rank " << i;
    EXPECT_EQ(cpus, ranks.at(i % k)) << "rank " << i << " should share rank " << i % k << "'s core";
    for (int c : cpus) {
      EXPECT_TRUE(all.count(c)) << "rank " << i << " got CPU " << c << ", which the launcher may not use";
      if (i < k) {
        EXPECT_TRUE(seen.insert(c).second) << "rank " << i << " shares CPU " << c << " with a lower rank";
      }
    }
  }
}

TEST(Launcher, PinsRanksToCoresRoundRobinByDefault) {
  const CpuSet all = ownCpus();
  ASSERT_FALSE(all.empty());
  for (int n : {1, 2, static_cast<int>(all.size()) + 1, 2 * static_cast<int>(all.size()) + 1}) {
    Outcome r;
    const auto byDefault = rankCpus(n, {}, &r);
    ASSERT_TRUE(r.finished);
    ASSERT_EQ(r.exitCode(), 0) << r.err;
    expectDealtOutByCore(byDefault, n, all);
    // The same rule, though not always the same cores: a job that leaves cores over takes the
    // idle ones first, and which are idle may change between two launches on a busy host.
    const auto explicitly = rankCpus(n, {"--bind-to", "core"}, &r);
    ASSERT_EQ(r.exitCode(), 0) << r.err;
    expectDealtOutByCore(explicitly, n, all);
  }
  // More ranks than CPUs: some ranks must share a core, and then every core is used.
  Outcome r;
  const int many = static_cast<int>(all.size()) + 1;
  CpuSet used;
  for (const auto& [rank, cpus] : rankCpus(many, {}, &r)) used.insert(cpus.begin(), cpus.end());
  EXPECT_EQ(used, all);
}

TEST(Launcher, AJobThatLeavesCoresOverTakesIdleOnesFirst) {
  Outcome r;
  const CpuSet first = rankCpus(1, {}, &r).at(0);  // the core an idle host gives a 1-rank job
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  if (first == ownCpus()) GTEST_SKIP() << "one core only: there is no idle core to prefer";
  // Keep that core busy, as another job's rank would.
  const pid_t busy = ::fork();
  if (busy == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : first) CPU_SET(c, &set);
    ::sched_setaffinity(0, sizeof(set), &set);
    for (;;) asm volatile("" ::: "memory");  // spin
  }
  ASSERT_GT(busy, 0);
  ::usleep(200 * 1000);
  // Up to three tries: unrelated work that keeps the other cores busy too during one launcher's
  // 100 ms look would leave it no idle core to prefer.
  CpuSet moved;
  for (int attempt = 0; attempt < 3; ++attempt) {
    moved = rankCpus(1, {}, &r).at(0);
    if (r.exitCode() != 0 || std::none_of(moved.begin(), moved.end(), [&](int c) { return first.count(c) > 0; })) break;
  }
  ::kill(busy, SIGKILL);
  ::waitpid(busy, nullptr, 0);
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  for (int c : moved) EXPECT_FALSE(first.count(c)) << "the rank was pinned to CPU " << c << ", which another process keeps busy";
}

TEST(Launcher, BindToNoneLeavesRanksFree) {
  const CpuSet all = ownCpus();
  Outcome r;
  const auto none = rankCpus(2, {"--bind-to", "none"}, &r);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  ASSERT_EQ(none.size(), 2u) << r.out;
  for (const auto& [rank, cpus] : none) EXPECT_EQ(cpus, all) << "rank " << rank;
}

TEST(Launcher, HelpPrintsUsageAndSucceeds) {
  for (const char* flag : {"-h", "--help"}) {
    const Outcome r = launch({flag});
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.exitCode(), 0) << flag;
    EXPECT_NE(r.out.find("usage: braid run"), std::string::npos) << flag;
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with(kLauncherFlag)) launcherPath() = std::string(arg.substr(kLauncherFlag.size()));
  }
  if (launcherPath().empty() || ::access(launcherPath().c_str(), X_OK) != 0) {
    std::fprintf(stderr, "test_launcher: pass --launcher=PATH to an executable braid-launcher-test\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
