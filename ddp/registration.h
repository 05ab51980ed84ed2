// The agreement step of GradSync::create: every rank learns whether all ranks registered the same
// parameters with the same options before any bucket is laid out, so that a mismatch is an error
// on every rank instead of a hang or a collective mismatch later.
#pragma once
#include <vector>

#include "braid/braid.hpp"
#include "braid/ddp.hpp"
#include "braid/status.hpp"

namespace braid::ddp::detail {

// This rank's own check of its arguments: null pointers, zero counts, bad dtypes, device memory,
// zero caps. Sends nothing.
Status validateLocally(const std::vector<Parameter>& params, const GradSyncOptions& options);

// Collective (two all-gathers). `local` is validateLocally's verdict: a rank that failed it returns
// that error, and every other rank an error naming it. Then the options and the parameters
// (count, dtype, memory, in order) must match rank 0's; the error names the first differing
// option or parameter and the first rank that differs.
Status agreeOnRegistration(Communicator& comm, const std::vector<Parameter>& params, const GradSyncOptions& options,
                           const Status& local);

}  // namespace braid::ddp::detail
