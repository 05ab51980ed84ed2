// What a timeout means, from the ranks that said they gave up waiting: shared by the communicator
// (Comm::explainTimeout, which gathers those notices through the store) and the simulator (sim/,
// which gathers them in virtual time).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "braid/status.hpp"

namespace braid {

// "rank 3, rank 4 (host h1), rank 9 (host h2)": each run of ranks on one other host names it once.
std::string rankList(const std::vector<int>& ranks, const std::function<std::string(int)>& remoteHostOf);

struct TimeoutView {
  int rank = 0, nranks = 1;
  double timeoutSec = 0;                          // BRAID_TIMEOUT, for the text
  std::function<std::string(int)> remoteHostOf;  // "" for this rank's host
};

// This rank's verdict when its call (`what`, "allreduce(count=4, float32, sum) #3") timed out
// waiting for `detail`; `timedOut`: rank -> "what\ndetail" of every other rank that said it timed
// out too. Names the silent ranks (those that said nothing), or two ranks in different calls when
// none is silent, or says the data was still moving.
Status timeoutVerdict(const TimeoutView& me, const std::string& what, const std::string& detail, bool moving,
                      const std::map<int, std::string>& timedOut);

}  // namespace braid
