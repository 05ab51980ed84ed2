// A POSIX shared-memory segment: created with its whole size reserved (posix_fallocate, so a full
// /dev/shm is an error here rather than a SIGBUS later), mapped, and unlinked as soon as every user
// has mapped it, so that nothing is left in /dev/shm once the processes are gone.
#pragma once
#include <cstddef>
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

 private:
  ShmSegment() = default;
  std::string name_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool owner_ = false;
};

}  // namespace braid
