#include "tests/common/harness.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "base/config.h"
#include "comm/c_handle.h"
#include "comm/communicator.h"
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace braid::test {
namespace {

bool readAll(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

std::vector<RankOutcome> waitAll(const std::vector<pid_t>& pids, double timeoutSec) {
  std::vector<RankOutcome> out(pids.size());
  std::vector<bool> done(pids.size(), false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec);
  std::size_t left = pids.size();
  while (left) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        out[i].exitStatus = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        done[i] = true;
        --left;
      }
    }
    if (!left) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          out[i].timedOut = true;
          std::fprintf(stderr, "harness: rank %zu did not finish within %.0f s and was killed\n", i, timeoutSec);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

}  // namespace

void report(int rank, const std::string& message) { std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str()); }

std::string fakeIbverbsLib() { return BRAID_FAKEIBV_LIB; }

bool lowerMemlock(std::uint64_t bytes) {
  rlimit r{bytes, bytes};
  if (setrlimit(RLIMIT_MEMLOCK, &r) != 0) return false;
  // Without CAP_IPC_LOCK, as an unprivileged user runs: the limit then binds registrations.
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (syscall(SYS_capget, &h, d) != 0) return false;
  d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  return syscall(SYS_capset, &h, d) == 0;
}

Env transportEnv(const std::string& transport) {
  // (ib off too: where a verbs library is found, tcp would otherwise lose the pairs to ib)
  if (transport == "tcp") return {{"BRAID_SHM_DISABLE", "1"}, {"BRAID_IB_DISABLE", "1"}};
  // ib between ranks of this host, over the verbs emulation (tests/fakeibv); runRanks checks
  // that every pair got it rather than falling back to tcp.
  // "ibzc": the same with its zero-copy pieces on (BRAID_IB_ZCOPY_BYTES), from 64 KiB.
  if (transport == "ib" || transport == "ibzc") {
    Env env{{"BRAID_SHM_DISABLE", "1"}, {"BRAID_IBVERBS_LIB", fakeIbverbsLib()}, {"TEST_EXPECT_TRANSPORT", "ib"}};
    if (transport == "ibzc") env.push_back({"BRAID_IB_ZCOPY_BYTES", "64K"});
    return env;
  }
  // Pretend hosts on this machine: shm within each, tcp across.
  if (transport.rfind("hosts/", 0) == 0) return {{"BRAID_HOSTID", "h{rank/" + transport.substr(6) + "}"}};
  if (transport.rfind("hosts%", 0) == 0) return {{"BRAID_HOSTID", "h{rank%" + transport.substr(6) + "}"}};
  // "hosts=3,4,5,4": consecutive ranks on hosts of those sizes.
  if (transport.rfind("hosts=", 0) == 0) return {{"BRAID_HOSTID", "h{rank@" + transport.substr(6) + "}"}};
  return {};
}

std::string forRank(std::string value, int rank) {
  for (std::size_t at; (at = value.find("{rank")) != std::string::npos;) {
    const std::size_t end = value.find('}', at);
    if (end == std::string::npos) break;
    const char how = value[at + 5];
    const int k = how == '/' || how == '%' ? std::atoi(value.c_str() + at + 6) : 0;
    int v = k <= 0 ? rank : how == '/' ? rank / k : rank % k;
    if (how == '@') {  // {rank@3,4,5}: the index of the host, of those sizes in order, that holds the rank
      v = 0;
      int first = 0;
      for (std::size_t p = at + 6; p < end; p = value.find(',', p) + 1) {
        first += std::atoi(value.c_str() + p);
        if (rank < first || value.find(',', p) > end) break;
        ++v;
      }
    }
    value.replace(at, end - at + 1, std::to_string(v));
  }
  return value;
}

std::vector<RankOutcome> forkRanks(int n, const std::function<int(int)>& body, double timeoutSec) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  return waitAll(pids, timeoutSec);
}

void expectEveryRankSucceeded(const std::vector<RankOutcome>& outcome) {
  for (std::size_t r = 0; r < outcome.size(); ++r) {
    EXPECT_FALSE(outcome[r].timedOut) << "rank " << r;
    EXPECT_EQ(outcome[r].exitStatus, 0) << "rank " << r;
  }
}

std::vector<RankOutcome> runRanks(int n, const std::function<int(int, braidComm_t)>& body, const Env& env,
                                  double timeoutSec) {
  std::vector<int> readEnds(static_cast<std::size_t>(n), -1), writeEnds(static_cast<std::size_t>(n), -1);
  for (int r = 1; r < n; ++r) {
    int fds[2];
    if (pipe(fds) != 0) std::abort();
    readEnds[static_cast<std::size_t>(r)] = fds[0];
    writeEnds[static_cast<std::size_t>(r)] = fds[1];
  }
  auto outcome = forkRanks(
      n,
      [&](int rank) {
        for (auto& [k, v] : env) setenv(k.c_str(), forRank(v, rank).c_str(), 1);
        braidUniqueId id;
        if (rank == 0) {
          if (braidGetUniqueId(&id) != braidSuccess) {
            report(rank, std::string("braidGetUniqueId failed: ") + braidGetLastError(nullptr));
            return 90;
          }
          for (int r = 1; r < n; ++r)
            if (write(writeEnds[static_cast<std::size_t>(r)], &id, sizeof(id)) != sizeof(id)) return 91;
        } else if (!readAll(readEnds[static_cast<std::size_t>(rank)], &id, sizeof(id))) {
          return 92;
        }
        if (const char* memlock = environmentValue("TEST_MEMLOCK_BYTES"))
          if (!lowerMemlock(std::strtoull(memlock, nullptr, 10))) return 96;
        braidComm_t comm = nullptr;
        if (braidCommInitRank(&comm, n, id, rank) != braidSuccess) {
          report(rank, std::string("braidCommInitRank failed: ") + braidGetLastError(nullptr));
          return 93;
        }
        if (const char* want = environmentValue("TEST_EXPECT_TRANSPORT"))
          for (int p = 0; p < n; ++p)
            if (p != rank && comm->impl->transportOf(p) != want) {
              report(rank, "uses " + comm->impl->transportOf(p) + " to rank " + std::to_string(p) + ", not " + want);
              return 95;
            }
        int rc = body(rank, comm);
        if (rc < 0) return rc == kAlreadyDestroyed ? 0 : -rc;
        braidResult_t d = braidCommDestroy(comm);
        return rc ? rc : (d == braidSuccess ? 0 : 94);
      },
      timeoutSec);
  for (int fd : readEnds) if (fd >= 0) close(fd);
  for (int fd : writeEnds) if (fd >= 0) close(fd);
  return outcome;
}

pid_t spawnSelf(const std::string& variable) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(variable);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char name[] = "braid-test-child";
  char* argv[] = {name, nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

}  // namespace braid::test
