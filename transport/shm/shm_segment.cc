#include "transport/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/process.h"
#include "base/socket.h"

namespace braid {

Result<std::shared_ptr<ShmSegment>> ShmSegment::create(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::SystemError("shm_open(" + name + "): " + net::errnoText(errno));
  net::Fd guard(fd);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
    struct statvfs vfs{};
    statvfs("/dev/shm", &vfs);
    shm_unlink(name.c_str());
    return Status::SystemError("cannot reserve " + std::to_string(bytes >> 10) + " KiB in /dev/shm (" +
                               std::to_string((vfs.f_bavail * vfs.f_bsize) >> 20) +
                               " MiB free): enlarge /dev/shm (docker run --shm-size=1g), lower BRAID_BUFFSIZE, "
                               "or set BRAID_SHM_DISABLE=1 to use tcp between local ranks");
  }
  // MAP_POPULATE: the page tables are filled now, not by faults during the first collectives.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Status::SystemError("mmap(" + name + "): " + net::errnoText(errno));
  }
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->base_ = p;
  s->bytes_ = bytes;
  s->owner_ = true;
  return s;
}

Result<std::shared_ptr<ShmSegment>> ShmSegment::open(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Status::SystemError("shm_open(" + name + "): " + net::errnoText(errno));
  net::Fd guard(fd);
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)
    return Status::Internal("shared memory segment " + name + " does not have the expected size");
  // MAP_POPULATE: the page tables are filled now, not by faults during the first collectives.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Status::SystemError("mmap(" + name + "): " + net::errnoText(errno));
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->base_ = p;
  s->bytes_ = bytes;
  return s;
}

namespace {
// The inode of this process's pid namespace ("pid:[4026531836]"), 0 if unreadable.
std::uint64_t pidNamespace() {
  char link[64] = {};
  if (readlink("/proc/self/ns/pid", link, sizeof(link) - 1) <= 0) return 0;
  const char* open = std::strchr(link, '[');
  return open ? std::strtoull(open + 1, nullptr, 10) : 0;
}

// Whether `pid` (of this pid namespace) may still run: no such process, or a zombie, is gone; a
// process /proc does not show keeps its segments.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  return procState(static_cast<int>(pid)) != ProcState::kEnded;
}
}  // namespace

std::string ShmSegment::nameFor(const std::string& rest) {
  return "/braid-pid" + std::to_string(getpid()) + "@" + std::to_string(pidNamespace()) + "-" + rest;
}

ShmSegment::Leftovers ShmSegment::removeLeftovers() {
  Leftovers out;
  const std::uint64_t ns = pidNamespace();
  DIR* d = opendir("/dev/shm");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("braid-", 0) != 0) continue;
    unsigned long pid = 0;
    unsigned long long theirNs = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "braid-pid%lu@%llu-%n", &pid, &theirNs, &used) != 2 || used == 0 || !ns ||
        theirNs != ns) {
      ++out.unknown;
      continue;
    }
    if (alive(static_cast<pid_t>(pid))) {
      ++out.live;
      continue;
    }
    struct stat st{};
    const std::string path = "/dev/shm/" + name;
    const std::uint64_t bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
    if (shm_unlink(("/" + name).c_str()) != 0) continue;  // another process removed it first
    ++out.removed;
    out.removedBytes += bytes;
    const std::string p = std::to_string(pid);
    if (out.removedPids.find(p) == std::string::npos) out.removedPids += (out.removedPids.empty() ? "" : ", ") + p;
  }
  closedir(d);
  return out;
}

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_) munmap(base_, bytes_);
}

}  // namespace braid
