// What a braidComm_t points to. Internal: the tools and tests reach the C++ communicator through it.
#pragma once
#include <memory>

#include "braid/braid.h"
#include "comm/communicator.h"

struct braidComm {
  std::shared_ptr<braid::Comm> impl;
};
