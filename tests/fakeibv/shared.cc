#include "tests/fakeibv/shared.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace fakeibv {

const char* setting(const char* name) { return std::getenv(name); }

const std::string& dir() {
  static const std::string d = [] {
    const char* e = setting("FAKEIBV_DIR");
    std::string p = e && *e ? e : "/tmp/fakeibv-" + std::to_string(getuid());
    ::mkdir(p.c_str(), 0700);
    return p;
  }();
  return d;
}

void* mapShared(const std::string& name, std::size_t bytes, bool create) {
  const std::string path = dir() + "/" + name;
  int fd = create ? ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                  : ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return nullptr;
  }
  if (!create) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
      ::close(fd);
      return nullptr;
    }
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

void unmapShared(void* p, std::size_t bytes) {
  if (p) ::munmap(p, bytes);
}

void removeShared(const std::string& name) { ::unlink((dir() + "/" + name).c_str()); }

std::size_t sharedSize(const std::string& name) {
  struct stat st {};
  if (::stat((dir() + "/" + name).c_str(), &st) != 0) return 0;
  return static_cast<std::size_t>(st.st_size);
}

void initMutex(pthread_mutex_t* m) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
}

void lock(pthread_mutex_t* m) {
  if (pthread_mutex_lock(m) == EOWNERDEAD) pthread_mutex_consistent(m);
}

// A file every process maps; the first to come makes it. Files only grow from zero to `bytes`
// (ftruncate) and zero bytes are a valid initial state, so a racing creator needs no lock.
static void* mapCommon(const char* name, std::size_t bytes) {
  const std::string path = dir() + "/" + name;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  struct stat st {};
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) < bytes) (void)::ftruncate(fd, static_cast<off_t>(bytes));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) std::abort();
  return p;
}

Ids& ids() {
  static Ids* p = static_cast<Ids*>(mapCommon("ids", sizeof(Ids)));
  return *p;
}

MrSlot* mrTable() {
  static MrSlot* p = static_cast<MrSlot*>(mapCommon("mrs", sizeof(MrSlot) * kMrSlots));
  return p;
}

MrSlot* findMr(std::uint32_t key, int pid) {
  std::uint32_t i = key >> 8;
  if (key == 0 || i >= kMrSlots) return nullptr;
  MrSlot* s = &mrTable()[i];
  if (s->key.load(std::memory_order_acquire) != key || s->pid != pid) return nullptr;
  return s;
}

bool pushCompletion(SharedCq* cq, const ibv_wc& wc) {
  lock(&cq->mu);
  std::uint64_t t = cq->tail.load(std::memory_order_relaxed);
  bool ok = t - cq->head.load(std::memory_order_acquire) < cq->cap;
  if (ok) {
    cq->e[t % cq->cap].wc = wc;
    cq->tail.store(t + 1, std::memory_order_release);
  } else {
    cq->overrun.store(1);
  }
  unlock(&cq->mu);
  return ok;
}

std::string qpName(std::uint32_t qpn) { return "qp." + std::to_string(qpn); }
std::string cqName(std::uint32_t id) { return "cq." + std::to_string(id); }
std::string srqName(std::uint32_t id) { return "srq." + std::to_string(id); }
std::string channelName(std::uint32_t id, int ownerPid) {
  return "ch." + std::to_string(ownerPid) + "." + std::to_string(id);
}

int selfPid() {
  static std::atomic<int> pid{0};
  static const bool reset = [] { return ::pthread_atfork(nullptr, nullptr, [] { pid.store(0); }) == 0; }();
  (void)reset;
  int p = pid.load(std::memory_order_relaxed);
  if (p == 0) pid.store(p = ::getpid(), std::memory_order_relaxed);
  return p;
}

static bool dead(int pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

void sweepDead() {
  for (std::uint32_t i = 0; i < kMrSlots; ++i) {
    MrSlot& s = mrTable()[i];
    if (s.key.load() && dead(s.pid)) s.key.store(0);
  }
  DIR* d = ::opendir(dir().c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    int pid = 0;
    if (name.rfind("ch.", 0) == 0) {
      pid = std::atoi(name.c_str() + 3);
    } else if (name.rfind("qp.", 0) == 0 || name.rfind("cq.", 0) == 0) {
      // Both headers start with the magic and the owner's pid.
      struct Head {
        std::uint32_t magic;
        std::int32_t pid;
      } h{};
      int fd = ::open((dir() + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      if (::read(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h))) pid = h.pid;
      ::close(fd);
    }
    if (dead(pid)) removeShared(name);
  }
  ::closedir(d);
}

// Asked on every operation, so looked up at most once a millisecond per LID (a port that goes
// DOWN is seen within a millisecond, as a link's loss is by a NIC).
bool portDown(std::uint16_t lid) {
  struct Seen {
    std::uint16_t lid;
    bool down;
    std::chrono::steady_clock::time_point at;
  };
  static thread_local Seen cache[4] = {};
  const auto now = std::chrono::steady_clock::now();
  Seen& s = cache[lid % 4];
  if (s.lid == lid && now - s.at < std::chrono::milliseconds(1)) return s.down;
  s = {lid, ::access((dir() + "/down." + std::to_string(lid)).c_str(), F_OK) == 0, now};
  return s.down;
}

}  // namespace fakeibv
