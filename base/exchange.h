// A key-value board that every rank of a communicator shares during setup: how transports trade
// names (shm segments, ...) without knowing the bootstrap behind it (comm/bootstrap/store.h's
// StoreClient is one).
#pragma once
#include <string>

#include "braid/status.hpp"
#include "base/deadline.h"

namespace braid {

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual Status set(const std::string& key, const std::string& value, const Deadline& d) = 0;
  // Waits for the key until the deadline.
  virtual Result<std::string> get(const std::string& key, const Deadline& d) = 0;
};

}  // namespace braid
