#include "comm/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "base/owned_memory.h"
#include "base/socket.h"

namespace braid::mem {
namespace {

// Leaked on purpose (no destructor ordering problems at exit).
std::mutex& registryMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::uintptr_t, Allocation>& registry() {
  static auto* r = new std::map<std::uintptr_t, Allocation>();
  return *r;
}

std::uint64_t nextId() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = [] {
    std::uint64_t s = 0;
    std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(&s), sizeof(s));
    return s;
  }();
  return salt ^ (++counter * 0x9e3779b97f4a7c15ull);
}

std::optional<owned::Range> lookupOwned(const void* p, std::size_t n) {
  auto a = find(p, n);
  if (!a) return std::nullopt;
  return owned::Range{a->base, a->bytes, a->id};
}

}  // namespace

Status allocate(void** ptr, std::size_t bytes) {
  static const bool hooked = (owned::setLookup(&lookupOwned), true);  // transports ask through it
  (void)hooked;
  if (!ptr) return Status::InvalidArgument("braidMemAlloc: ptr is NULL");
  if (bytes == 0) return Status::InvalidArgument("braidMemAlloc: zero bytes");
  int fd = memfd_create("braid-mem", MFD_CLOEXEC);
  if (fd < 0) return Status::SystemError("braidMemAlloc: memfd_create: " + net::errnoText(errno));
  // Reserve every page now: memory that is not there is an error here, not a SIGBUS later.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return Status::SystemError("braidMemAlloc: cannot reserve " + std::to_string(bytes) + " bytes of shared memory");
  }
  // MAP_POPULATE: pages are faulted in once, here, not on the first collective.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return Status::SystemError("braidMemAlloc: mmap: " + net::errnoText(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    munmap(p, bytes);
    ::close(fd);
    return Status::SystemError("braidMemAlloc: fstat: " + net::errnoText(errno));
  }
  std::lock_guard<std::mutex> g(registryMutex());
  registry()[reinterpret_cast<std::uintptr_t>(p)] = {p, bytes, fd, nextId(), static_cast<std::uint64_t>(st.st_ino),
                                                  static_cast<std::uint64_t>(st.st_dev)};
  *ptr = p;
  return Status::Ok();
}

Status release(void* ptr) {
  if (!ptr) return Status::Ok();  // like free(NULL)
  Allocation a;
  {
    std::lock_guard<std::mutex> g(registryMutex());
    auto it = registry().find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == registry().end()) return Status::InvalidArgument("braidMemFree: pointer was not returned by braidMemAlloc");
    a = it->second;
    registry().erase(it);
  }
  owned::releasing(a.id);  // what transports keep for it (ib registrations) goes first
  munmap(a.base, a.bytes);
  ::close(a.fd);
  return Status::Ok();
}

std::optional<Allocation> find(const void* p, std::size_t n) {
  auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> g(registryMutex());
  auto& reg = registry();
  auto it = reg.upper_bound(addr);
  if (it == reg.begin()) return std::nullopt;
  --it;
  const Allocation& a = it->second;
  if (addr < it->first || addr + n > it->first + a.bytes) return std::nullopt;
  return a;
}

RegionDesc describe(const void* p, std::size_t n) {
  RegionDesc d;
  auto a = find(p, n);
  if (!a) return d;
  d.fd = a->fd;
  d.id = a->id;
  d.allocBytes = a->bytes;
  d.offset = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(a->base);
  d.inode = a->inode;
  d.device = a->device;
  return d;
}

PeerMappings::~PeerMappings() { clear(); }

// Peers that allocate and free in a loop would grow the cache without bound; it is capped by
// entries and by bytes mapped.
void PeerMappings::makeRoom(std::size_t upcoming) {
  std::size_t bytes = 0;
  for (auto& [k, m] : maps_) bytes += m.bytes;
  if (maps_.size() + upcoming > 64 || bytes > (std::size_t{64} << 30)) clear();
}

void PeerMappings::clear() {
  for (auto& [key, m] : maps_) munmap(m.base, m.bytes);
  maps_.clear();
}

Result<std::byte*> PeerMappings::map(int pid, const RegionDesc& d) {
  auto key = std::make_pair(pid, d.id);
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(d.fd);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      return Status::SystemError("cannot open rank memory " + path + ": " + net::errnoText(errno) +
                                 " (processes of different users, or a hardened /proc)");
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != d.inode ||
        static_cast<std::uint64_t>(st.st_dev) != d.device || static_cast<std::uint64_t>(st.st_size) < d.allocBytes) {
      ::close(fd);
      return Status::SystemError(path + " is not the peer's braidMemAlloc memory (are the ranks in different PID "
                                 "namespaces? the pid names another process there)");
    }
    void* p = mmap(nullptr, d.allocBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return Status::SystemError("mmap of a peer's braidMemAlloc memory: " + net::errnoText(errno));
    it = maps_.emplace(key, Mapping{p, d.allocBytes}).first;
  }
  return static_cast<std::byte*>(it->second.base) + d.offset;
}

}  // namespace braid::mem
