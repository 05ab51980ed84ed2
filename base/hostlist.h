// Slurm's hostlist expressions ("node[01-04,07],gpu-a[1-2]-b[3,5]"), for the rendezvous host of
// jobs started by srun (base/config.cc readLaunchEnv): a comma-separated list of names, each with
// any number of bracket groups of numbers and ranges, zero-padded to the width of a range's lower
// bound as Slurm writes them. Expansion is the product of a name's groups, in order.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "braid/status.hpp"

namespace braid {

// The hosts of `expr`, at most `limit` of them (the rest are not expanded, so a huge expression
// costs nothing). A malformed expression is an invalid argument saying where.
Result<std::vector<std::string>> expandHostlist(const std::string& expr, std::size_t limit = 1u << 20);

}  // namespace braid
