// A POSIX shared-memory segment: created with its whole size reserved (posix_fallocate, so a full
// /dev/shm is an error here rather than a SIGBUS later), mapped, and unlinked as soon as every user
// has mapped it, so that nothing is left in /dev/shm once the processes are gone. A process killed
// before that (SIGTERM or SIGKILL during setup) cannot unlink: its segments carry its pid and pid
// namespace in their names, so that the next communicator on the host, or braid doctor, can tell
// them from a live job's and remove them (removeLeftovers).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "braid/status.hpp"

namespace braid {

class ShmSegment {
 public:
  static Result<std::shared_ptr<ShmSegment>> create(const std::string& name, std::size_t bytes);
  static Result<std::shared_ptr<ShmSegment>> open(const std::string& name, std::size_t bytes);
  ~ShmSegment();
  void* data() const { return base_; }
  std::size_t size() const { return bytes_; }
  void unlink();  // idempotent; only the creator unlinks

  // "/braid-pid<PID>@<PIDNS>-<rest>": a name for a segment this process creates.
  static std::string nameFor(const std::string& rest);
  // Braid's segments in /dev/shm whose creator is gone (same pid namespace, no such process) are
  // removed; those of live processes, and of other pid namespaces, are counted and left.
  struct Leftovers {
    int removed = 0;
    std::uint64_t removedBytes = 0;
    std::string removedPids;  // "123, 456"
    int live = 0;             // segments of processes that still run (a job setting up, or running)
    int unknown = 0;          // other pid namespaces, or names without a pid (older versions)
  };
  static Leftovers removeLeftovers();

 private:
  ShmSegment() = default;
  std::string name_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool owner_ = false;
};

}  // namespace braid
