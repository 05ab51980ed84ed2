// One way into a communicator for the tools (braid doctor, braid perf's header, braid info): which
// transport reaches each peer and why the others were skipped, whether a pair is connected, and
// what the rank is doing now (the record braid status gets).
// They include this header, not comm/communicator.h (tests/unit/layers.sh checks it).
#pragma once
#include <cstdint>
#include <string>

#include "braid/braid.h"
#include "braid/status.hpp"
#include "base/config.h"

namespace braid {

struct InitParams;

struct PeerChoice {
  std::string transport;  // "shm", "tcp", "ib", "self"
  std::string skipped;    // why the transports before it were not taken ("" if none was)
};

class CommView {
 public:
  explicit CommView(braidComm_t comm) : comm_(comm) {}
  int rank() const;
  int nranks() const;
  // The transport between any two ranks (every rank works out every pair alike, from the roster).
  PeerChoice choiceBetween(int a, int b) const;
  std::string transportTo(int peer) const;
  // Connected now: at creation, or since, on a call's first use (BRAID_CONNECT). Asked right after
  // creation (braid doctor, braid perf's header), that is the peers connected at creation.
  bool connected(int peer) const;
  // This rank's live record: the call it is in and since when, the bytes it moved, the peer it
  // waited on (JSON, as it answers braid status).
  std::string statusRecord() const;
  const Config& config() const;
  std::uint64_t cudaIpcCalls() const;
  // Nanoseconds this rank's calls have waited on a peer so far (braid perf: time in a call minus
  // this is the rank's busy time, which names a straggler).
  std::uint64_t stallNs() const;

 private:
  braidComm_t comm_;
};

// A communicator from parameters a tool adjusted first (braid doctor turns off what would stop a
// job, and reports it); destroy it with braidCommDestroy.
Result<braidComm_t> createComm(const InitParams& params);

}  // namespace braid
