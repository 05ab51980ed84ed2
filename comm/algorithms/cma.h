// Cross-memory attach (comm/algorithms/cma.cc): the address peers use to probe it, the probe of a
// peer's (ok: this process can read and write that one), one copy from or to a peer, and the
// smallest call that takes it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "braid/status.hpp"
#include "comm/fingerprint.h"

namespace braid {

enum class CmaDirection { kRead, kWrite };
std::uint64_t cmaProbeAddress();
Status cmaProbe(int pid, std::uint64_t probeAddress);
Status cmaCopy(int pid, std::uint64_t remote, void* local, std::size_t n, CmaDirection direction);
// The smallest all-gather or broadcast (bytes of the whole buffer) that takes cross-memory attach
// among `nranks` ranks whose host tunes with an L3 of `l3Bytes`; SIZE_MAX: never (Comm::cmaFits).
std::size_t cmaMinBytes(CollKind kind, int nranks, std::size_t l3Bytes);

}  // namespace braid
