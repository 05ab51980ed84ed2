#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_) munmap(base_, bytes_);
}

}  // namespace braid
