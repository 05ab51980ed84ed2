// The rendezvous and the tcp transport under attack: 10,000 connections without the secret, with a
// wrong one, replayed, truncated, oversized or silent, hammering the store, and then the ranks' tcp
// listeners, while a real 4-rank job initializes. None may take a rank's slot or crash anything, and
// the job may not take more than 1 s longer than under the same load aimed elsewhere (a decoy
// listener) or, for the tcp listeners, than without them. Also: which address the listeners
// bind (BRAID_SOCKET_BIND_ALL).
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "base/auth.h"
#include "base/config.h"
#include "comm/bootstrap/init.h"
#include "tests/common/harness.h"
#include "base/socket.h"
#include "transport/tcp/tcp_transport.h"

namespace braid {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The jobs' ranks are this very binary, started with posix_spawn rather than fork: the test process
// has threads (the rendezvous store, the attacker) whose locks a forked child would inherit held (a
// child once hung in the sanitizer's allocator that way). A rank finds its rank and the job's id in
// SECURITY_TEST_RANK ("RANK ID") and runs before main: init, one all-reduce, destroy.
const bool kRankChild = [] {
  const char* spec = environmentValue("SECURITY_TEST_RANK");
  if (!spec) return false;
  const char* space = std::strchr(spec, ' ');
  auto id = space ? uniqueIdFromString(space + 1) : Result<braidUniqueId>(Status::InvalidArgument("no id"));
  if (!id.ok()) _exit(4);
  braidComm_t comm;
  if (braidCommInitRank(&comm, 4, *id, std::atoi(spec)) != braidSuccess) _exit(1);
  float x = 1, y = 0;
  if (braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess || y != 4) _exit(2);
  _exit(braidCommDestroy(comm) == braidSuccess ? 0 : 3);
}();

pid_t startRank(const braidUniqueId& id, int rank) {
  return test::spawnSelf("SECURITY_TEST_RANK=" + std::to_string(rank) + " " + uniqueIdToString(id));
}

// Waits for every rank, at most `seconds` in all (then kills the rest); counts the ranks that did
// not exit with 0.
void waitRanks(const std::vector<pid_t>& pids, int* failures, double seconds = 120) {
  const double until = now() + seconds;
  for (pid_t p : pids) {
    if (p < 0) {
      ++*failures;
      continue;
    }
    int st = 0;
    pid_t r = 0;
    while ((r = waitpid(p, &st, WNOHANG)) == 0 && now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (r == 0) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
      ADD_FAILURE() << "rank pid " << p << " did not finish within " << seconds << " s";
    }
    *failures += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

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
  for (int r = 0; r < 4; ++r) pids.push_back(startRank(id, r));
  waitRanks(pids, failures);
  return now() - t0;
}

// A listener that is not the store: it accepts each connection, reads it to its end and closes it.
// The baseline job runs while the same 10,000 bad clients hit this decoy instead of the store, so
// both runs carry the same attacker CPU load (2 cores, 4 ranks, sanitizers) and the difference
// between them is what the store itself spends on the bad connections.
class Decoy {
 public:
  explicit Decoy(const std::string& ip) : fd_(net::listenOn(ip, 0)) {
    if (!fd_.ok()) return;
    port_ = net::localPort(fd_->get());
    thread_ = std::thread([this] {
      while (!stop_) {
        auto c = net::acceptOne(fd_->get(), Deadline::after(0.05));
        if (!c.ok()) continue;
        timeval bound{1, 0};  // a client that never closes cannot stall the decoy
        ::setsockopt(c->get(), SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
        char sink[512];
        while (::recv(c->get(), sink, sizeof(sink), 0) > 0) {}
      }
    });
  }
  ~Decoy() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }

 private:
  Result<net::Fd> fd_;
  int port_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Runs the 4-rank job on `id` while 10,000 bad clients hit ip:port, starting once 2,000 have gone.
double jobUnderFire(const braidUniqueId& id, const std::string& ip, int port, int* failures, int* sent) {
  std::atomic<int> count{0};
  std::thread hammer([&] {
    for (int i = 0; i < 10000; ++i) {
      badClient(ip, port, i);
      ++count;
    }
  });
  while (count < 2000) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // mid-attack
  double took = runJob(id, failures);
  hammer.join();
  *sent = count.load();
  return took;
}

TEST(Security, TenThousandBadConnectionsNeitherTakeASlotNorDelayTheJob) {
  setenv("BRAID_TIMEOUT", "60", 1);
  int failures = 0, sent = 0;
  braidUniqueId quiet;
  ASSERT_EQ(braidGetUniqueId(&quiet), braidSuccess);
  double alone = runJob(quiet, &failures);
  EXPECT_EQ(failures, 0) << "the job failed without any attack";

  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  std::string where = uniqueIdToString(id);  // host:port/secret
  std::string ip = where.substr(0, where.find(':'));
  int port = std::atoi(where.c_str() + where.find(':') + 1);

  Decoy decoy(ip);
  ASSERT_GT(decoy.port(), 0);
  braidUniqueId loadedId;
  ASSERT_EQ(braidGetUniqueId(&loadedId), braidSuccess);
  double loaded = jobUnderFire(loadedId, ip, decoy.port(), &failures, &sent);
  EXPECT_EQ(failures, 0) << "the job failed while a decoy listener was hammered";
  EXPECT_EQ(sent, 10000);

  double attacked = jobUnderFire(id, ip, port, &failures, &sent);
  EXPECT_EQ(failures, 0) << "a rank failed while its store was attacked";
  EXPECT_EQ(sent, 10000);
  // The store may spend up to a second on the flood; and a rank's SYN that the kernel drops while
  // 10,000 others arrive is sent again after its initial RTO, 1 s (seen once in CI: 1.20 s against
  // 0.16, where 0.21-0.35 is usual). A store that stalled on a bad connection (its 5 s challenge
  // window, or BRAID_TIMEOUT) stays far past this.
  EXPECT_LT(attacked, loaded + 2.0) << "with the same load on a decoy " << loaded << " s, under attack " << attacked
                                    << " s (alone " << alone << " s)";
  std::fprintf(stderr, "4-rank job: %.3f s alone, %.3f s while 10,000 bad connections hit a decoy, %.3f s while "
               "they hit its store\n", alone, loaded, attacked);
}

// The IPv4 listening sockets of process `pid` as (address, port), from /proc/<pid>/fd and /proc/net/tcp.
std::vector<std::pair<std::string, int>> listeners(pid_t pid) {
  std::set<unsigned long> inodes;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[64] = {};
      if (readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1) > 0 &&
          std::strncmp(target, "socket:[", 8) == 0)
        inodes.insert(std::strtoul(target + 8, nullptr, 10));
    }
    closedir(d);
  }
  std::vector<std::pair<std::string, int>> out;
  std::ifstream tcp("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
    unsigned long inode = 0;
    in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
    in_addr a{};
    a.s_addr = static_cast<in_addr_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    out.push_back({inet_ntoa(a), static_cast<int>(std::stoul(local.substr(9), nullptr, 16))});
  }
  return out;
}

std::string boundAddress(int port) {
  for (auto& [ip, p] : listeners(getpid()))
    if (p == port) return ip;
  return "(no listener on port " + std::to_string(port) + ")";
}

// Each listener binds only the address it advertises unless BRAID_SOCKET_BIND_ALL=1: the store of a
// unique id, the store of environment mode (MASTER_ADDR), and the tcp transport's listener.
TEST(Bind, ListenersBindTheAdvertisedAddressUnlessBindAllIsSet) {
  for (const char* bindAll : {"0", "1"}) {
    auto outcome = test::forkRanks(1, [&](int) {
      setenv("BRAID_SOCKET_BIND_ALL", bindAll, 1);
      setenv("BRAID_TIMEOUT", "20", 1);
      const bool all = bindAll[0] == '1';
      int bad = 0;
      auto expect = [&](const std::string& what, const std::string& advertised, int port) {
        std::string bound = boundAddress(port);
        std::string want = all ? "0.0.0.0" : advertised;
        std::fprintf(stderr, "BRAID_SOCKET_BIND_ALL=%s: %s advertises %s:%d, bound to %s\n", bindAll, what.c_str(),
                     advertised.c_str(), port, bound.c_str());
        if (bound != want || advertised == "0.0.0.0") { test::report(0, what + ": expected " + want); ++bad; }
      };
      // 1. The unique id's store.
      braidUniqueId id;
      if (braidGetUniqueId(&id) != braidSuccess) return 90;
      std::string where = uniqueIdToString(id);
      expect("unique-id store", where.substr(0, where.find(':')), std::atoi(where.c_str() + where.find(':') + 1));
      // 2. The tcp transport's listener.
      auto cfg = Config::fromEnvironment();
      if (!cfg.ok()) return 91;
      TcpTransport tcp(*cfg);
      auto listening = tcp.localAddress("127.0.0.1");
      if (!listening.ok()) return 92;
      const std::string& addr = *listening;
      expect("tcp listener", addr.substr(0, addr.rfind(':')), std::atoi(addr.c_str() + addr.rfind(':') + 1));
      // 3. Environment mode: rank 0 hosts the store on MASTER_ADDR:MASTER_PORT.
      int port = 0;
      {
        auto probe = net::listenOn("127.0.0.1", 0);
        if (!probe.ok()) return 93;
        port = net::localPort(probe->get());
      }
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", "1", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("BRAID_SECRET", "0123456789abcdef0123456789abcdef", 1);
      braidComm_t comm;
      if (braidCommInitFromEnv(&comm) != braidSuccess) {
        test::report(0, std::string("env init: ") + braidGetLastError(nullptr));
        return 94;
      }
      expect("environment-mode store", "127.0.0.1", port);
      braidCommDestroy(comm);
      return bad;
    }, 60);
    EXPECT_EQ(outcome[0].exitStatus, 0) << "BRAID_SOCKET_BIND_ALL=" << bindAll;
  }
}

// The tcp transport's hello, as a rank computes it (transport/tcp/tcp_transport.cc), for the replay case.
struct TcpHello {
  std::int32_t rank;
  std::int32_t channel;
  std::uint8_t mac[32];
};

// One bad connection to a rank's tcp listener. It never reads the listener's challenge (a listener
// that has not reached its accept loop yet must not stall the attacker). Silent ones are kept open.
// Returns whether the connection was made.
bool badTcpClient(const std::pair<std::string, int>& at, int i, const std::string& secret, std::vector<net::Fd>* held) {
  auto fd = net::connectTo(at.first, at.second, Deadline::after(2));
  if (!fd.ok()) return false;
  TcpHello h{};
  h.rank = 3;      // a real rank and channel: a hello that got through would take rank 3's slot
  h.channel = i % 2;
  std::string junk;
  switch (i % 6) {
    case 0:  // silent: connects and keeps the connection open without a word
      held->push_back(std::move(fd.value()));
      return true;
    case 1:  // no secret: connects and hangs up
      break;
    case 2:  // wrong secret
      std::memset(h.mac, 0x5a, sizeof(h.mac));
      junk.assign(reinterpret_cast<const char*>(&h), sizeof(h));
      break;
    case 3: {  // replayed: right secret, but proof for another (old) challenge
      std::string old(16, static_cast<char>(i));
      auto mac = auth::hmacSha256(secret, "braid-tcp-hello" + old + "3>" + std::to_string(i % 3) + "#" +
                                              std::to_string(h.channel));
      std::memcpy(h.mac, mac.data(), sizeof(h.mac));
      junk.assign(reinterpret_cast<const char*>(&h), sizeof(h));
      break;
    }
    case 4:  // truncated hello
      junk.assign(reinterpret_cast<const char*>(&h), sizeof(h) / 2);
      break;
    default:  // oversized: a hello followed by 64 KiB more
      junk.assign(reinterpret_cast<const char*>(&h), sizeof(h));
      junk += std::string(64 << 10, 'x');
  }
  if (!junk.empty()) (void)net::sendAll(fd->get(), junk.data(), junk.size(), Deadline::after(1));
  return true;
}

// The tcp listeners of the ranks (not the stores, which live in this process and are inherited).
std::vector<std::pair<std::string, int>> rankListeners(const std::vector<pid_t>& pids, int storePort) {
  std::set<int> ours{storePort};
  for (auto& [ip, port] : listeners(getpid())) ours.insert(port);
  std::vector<std::pair<std::string, int>> ports;
  for (pid_t p : pids)
    for (auto& [ip, port] : listeners(p))
      if (!ours.count(port)) ports.push_back({ip, port});
  std::sort(ports.begin(), ports.end());
  ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
  return ports;
}

// A 4-rank tcp job whose rank 3 starts late: ranks 0..2 are already listening (and waiting for rank 3
// in the store) while `attack` runs against their listeners; once it says go, rank 3 starts. Returns
// the seconds from rank 3's start until every rank finished init + all-reduce + destroy.
double stagedJob(const std::function<void(const std::vector<pid_t>&, int, const std::string&,
                                          std::atomic<bool>*)>& attack, int* failures) {
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) { ++*failures; return 0; }
  std::string where = uniqueIdToString(id);
  int storePort = std::atoi(where.c_str() + where.find(':') + 1);
  std::string secret = where.substr(where.find('/') + 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) pids.push_back(startRank(id, r));
  std::atomic<bool> go{false};
  std::thread attacker([&] { attack(pids, storePort, secret, &go); });
  while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  double t0 = now();
  pids.push_back(startRank(id, 3));
  waitRanks(pids, failures);
  double took = now() - t0;
  attacker.join();
  return took;
}

TEST(Security, TenThousandBadConnectionsToTheTcpListenersNeitherTakeASlotNorDelayTheJob) {
  setenv("BRAID_TIMEOUT", "60", 1);
  setenv("BRAID_SHM_DISABLE", "1", 1);
  setenv("BRAID_IB_DISABLE", "1", 1);  // the tcp listeners are under test
  // Ranks 0..2's tcp listeners, and rank 0's in the set-up tree (open until its child rank 3 comes;
  // ranks 1 and 2 have no children there).
  auto waitForListeners = [](const std::vector<pid_t>& pids, int storePort) {
    std::vector<std::pair<std::string, int>> ports;
    for (int i = 0; i < 20000 && (ports = rankListeners(pids, storePort)).size() < 4; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ports;
  };
  int failures = 0;
  double baseline = stagedJob([&](const std::vector<pid_t>& pids, int storePort, const std::string&,
                                  std::atomic<bool>* go) {
    waitForListeners(pids, storePort);
    *go = true;
  }, &failures);
  EXPECT_EQ(failures, 0) << "the job failed without any attack";

  const int total = 10000, beforeRank3 = 9000;
  int connected = 0, refused = 0, listenersSeen = 0;
  std::vector<net::Fd> held;  // the silent connections, open until the job is over
  double attacked = stagedJob([&](const std::vector<pid_t>& pids, int storePort, const std::string& secret,
                                  std::atomic<bool>* go) {
    auto ports = waitForListeners(pids, storePort);
    listenersSeen = static_cast<int>(ports.size());
    for (int i = 0; i < total && !ports.empty(); ++i) {
      if (i == beforeRank3) *go = true;  // the rest races with the real ranks' connections
      // Every listener gets every kind (kinds cycle with i, listeners with i / 6).
      if (badTcpClient(ports[static_cast<std::size_t>(i / 6) % ports.size()], i, secret, &held)) ++connected;
      else ++refused;
    }
    *go = true;
  }, &failures);
  held.clear();
  EXPECT_EQ(listenersSeen, 4);
  EXPECT_EQ(failures, 0) << "a rank failed while its listeners were attacked";
  EXPECT_GE(connected, beforeRank3);
  EXPECT_LT(attacked, baseline + 1.0) << "baseline " << baseline << " s, under attack " << attacked << " s";
  std::fprintf(stderr, "4-rank tcp job (rank 3 joining): %.3f s alone, %.3f s with %d bad connections to the ranks' "
               "tcp listeners (%d refused once the listeners had closed)\n", baseline, attacked, connected, refused);
  unsetenv("BRAID_SHM_DISABLE");
  unsetenv("BRAID_IB_DISABLE");
}

}  // namespace
}  // namespace braid
