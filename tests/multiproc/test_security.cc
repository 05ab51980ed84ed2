// The rendezvous under attack: 10,000 connections without the secret, with a wrong one, replayed,
// truncated or oversized, hammering the store while a real 4-rank job initializes. None may take a
// rank's slot or crash anything, and the job may not take more than 1 s longer than without them.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "comm/init.h"
#include "transport/socket.h"

namespace braid {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One bad client of the store at ip:port; `kind` picks the flavour.
void badClient(const std::string& ip, int port, int kind) {
  auto fd = net::connectTo(ip, port, Deadline::after(2));
  if (!fd.ok()) return;
  std::string junk;
  auto u32 = [&](std::uint32_t v) { junk.append(reinterpret_cast<const char*>(&v), 4); };
  switch (kind % 5) {
    case 0: break;                                   // connects and says nothing
    case 1: u32(0xffffffffu); break;                 // oversized frame
    case 2: u32(60); junk += 'H'; u32(16); junk += std::string(16, 'c'); break;  // truncated hello
    case 3:                                          // a well-formed hello with a wrong MAC
      u32(1 + 4 + 16 + 8 + 4 + 32); junk += 'H'; u32(16); junk += std::string(16, 'c');
      u32(static_cast<std::uint32_t>(kind % 4)); u32(4); u32(32); junk += std::string(32, 'm');
      break;
    default:                                         // a command before any hello
      u32(1 + 4 + 1 + 4 + 1); junk += 'S'; u32(1); junk += 'k'; u32(1); junk += 'v';
  }
  if (!junk.empty()) (void)net::sendAll(fd->get(), junk.data(), junk.size(), Deadline::after(1));
  ::shutdown(fd->get(), SHUT_RDWR);
}

// Starts 4 ranks on `id`; returns seconds until all of them finished init + all-reduce + destroy.
double runJob(const braidUniqueId& id, int* failures) {
  double t0 = now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      braidComm_t comm;
      if (braidCommInitRank(&comm, 4, id, r) != braidSuccess) _exit(1);
      float x = 1, y = 0;
      if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess || y != 4) _exit(2);
      _exit(braidCommDestroy(comm) == braidSuccess ? 0 : 3);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    *failures += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return now() - t0;
}

TEST(Security, TenThousandBadConnectionsNeitherTakeASlotNorDelayTheJob) {
  setenv("BRAID_TIMEOUT", "60", 1);
  int failures = 0;
  braidUniqueId quiet;
  ASSERT_EQ(braidGetUniqueId(&quiet), braidSuccess);
  double baseline = runJob(quiet, &failures);

  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  std::string where = uniqueIdToString(id);  // host:port/secret
  std::string ip = where.substr(0, where.find(':'));
  int port = std::atoi(where.c_str() + where.find(':') + 1);
  std::atomic<int> sent{0};
  std::thread hammer([&] {
    for (int i = 0; i < 10000; ++i) {
      badClient(ip, port, i);
      ++sent;
    }
  });
  while (sent < 2000) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // mid-attack
  double attacked = runJob(id, &failures);
  hammer.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(sent.load(), 10000);
  EXPECT_LT(attacked, baseline + 1.0) << "baseline " << baseline << " s, under attack " << attacked << " s";
  std::fprintf(stderr, "4-rank job: %.3f s alone, %.3f s while 10,000 bad connections hit its store\n", baseline, attacked);
}

}  // namespace
}  // namespace braid
