// braidMemAlloc: host memory that other ranks on the same host can map. It lives in a memfd; a peer
// maps it through /proc/<pid>/fd/<fd>, so nothing is ever left in /dev/shm and the memory goes
// away with the last process that maps it. Collectives whose buffers are all such memory read and
// reduce straight out of the peers' buffers (comm/algorithms/direct.cc) instead of staging.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "braid/status.hpp"

namespace braid::mem {

struct Allocation {
  void* base = nullptr;
  std::size_t bytes = 0;
  int fd = -1;
  std::uint64_t id = 0;  // unique across processes and time: a mapping cache key for peers
  std::uint64_t inode = 0, device = 0;  // of the memfd: what a peer checks the file it opened against
};

Status allocate(void** ptr, std::size_t bytes);
Status release(void* ptr);
// The allocation that holds all of [p, p + n), if any. Thread-safe.
std::optional<Allocation> find(const void* p, std::size_t n);

// What one rank tells the others about a buffer: enough to map it.
struct RegionDesc {
  std::int32_t fd = -1;  // -1: not Braid memory
  std::int32_t pad = 0;
  std::uint64_t id = 0;
  std::uint64_t allocBytes = 0;
  std::uint64_t offset = 0;
  // The memfd's inode and device: /proc/<pid>/fd/<fd> must lead to this very file (a pid seen from
  // another PID namespace may name another process).
  std::uint64_t inode = 0, device = 0;
};
RegionDesc describe(const void* p, std::size_t n);

// Peers' allocations mapped into this process, cached per (pid, id) until the cache is destroyed.
class PeerMappings {
 public:
  ~PeerMappings();
  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  // The address of the described region in this process.
  Result<std::byte*> map(int pid, const RegionDesc& d);
  void clear();  // unmaps everything (the peers' memory is freed once they free it too)
  // Before a call that maps up to `upcoming` regions: start over if they might not fit, so that
  // no mapping is evicted while the call uses it.
  void makeRoom(std::size_t upcoming);

 private:
  struct Mapping {
    void* base;
    std::size_t bytes;
  };
  std::map<std::pair<int, std::uint64_t>, Mapping> maps_;
};

}  // namespace braid::mem
