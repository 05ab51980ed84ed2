// Braid: errors as values. A Status is a code plus a message that names what a person needs
// (rank, peer, transport, collective, sequence number, and the knob to turn). Result<T> is a value
// or a Status. Nothing in Braid's API throws.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include "braid/export.h"

namespace braid {

// Codes equal braid.h's braidResult_t.
enum class Code : int {
  kOk = 0, kCudaError = 1, kSystemError = 2, kInternal = 3, kInvalidArgument = 4,
  kInvalidUsage = 5, kRemoteError = 6, kInProgress = 7, kTimeout = 8, kAborted = 9,
};

class [[nodiscard]] BRAID_EXPORT Status {
 public:
  Status() = default;
  static Status Ok() { return {}; }
  static Status CudaError(std::string m) { return {Code::kCudaError, std::move(m)}; }
  static Status SystemError(std::string m) { return {Code::kSystemError, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status InvalidUsage(std::string m) { return {Code::kInvalidUsage, std::move(m)}; }
  static Status RemoteError(std::string m) { return {Code::kRemoteError, std::move(m)}; }
  static Status InProgress(std::string m) { return {Code::kInProgress, std::move(m)}; }
  static Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }

  Status(Code c, std::string m) : code_(c), message_(std::move(m)) {}
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "timeout: allreduce #3 ..." or "ok".
  std::string toString() const;
  // A copy whose message is prefixed with `context: `.
  Status withContext(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

BRAID_EXPORT const char* codeName(Code c);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T v) : value_(std::move(v)) {}                       // NOLINT: implicit by design
  Result(Status s) : status_(std::move(s)) {}                  // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace braid
