#include "braid/status.hpp"

namespace braid {

const char* codeName(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kCudaError: return "cuda error";
    case Code::kSystemError: return "system error";
    case Code::kInternal: return "internal error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kInvalidUsage: return "invalid usage";
    case Code::kRemoteError: return "remote error";
    case Code::kInProgress: return "in progress";
    case Code::kTimeout: return "timeout";
    case Code::kAborted: return "aborted";
  }
  return "unknown error";
}

std::string Status::toString() const {
  if (ok()) return "ok";
  return std::string(codeName(code_)) + ": " + message_;
}

}  // namespace braid
