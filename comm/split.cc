// braidCommSplit: every rank of the parent takes part; those passing the same color form a new
// communicator, ranked by key (ties by parent rank). Two all-gathers on the parent: first each
// rank's color, key and whether its arguments were accepted; then the unique id that each new
// group's rank 0 made (a store on an ephemeral port, as braidGetUniqueId's). Each group then
// initializes as braidCommInitRank would, with the parent's configuration.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/bootstrap/init.h"
#include "comm/communicator.h"
#include "comm/cuda/cuda_path.h"

namespace braid {
namespace {

struct Choice {
  std::int32_t color, key, refused;
};

Status allGatherOnParent(Comm& parent, const void* mine, void* all, std::size_t count, DataType t, const char* what) {
  CollArgs a{CollKind::kAllGather, mine, all, count, t, ReduceOp::kSum};
  Status s = cuda::run(parent, a, nullptr);
  return s.ok() ? s : s.withContext(std::string("braidCommSplit: the parent's all-gather of ") + what);
}

}  // namespace

Result<std::shared_ptr<Comm>> splitComm(Comm& parent, int color, int key, const CommOptions& options,
                                        const std::string& refusal) {
  std::string refused = refusal;
  Config config = parent.config();
  if (refused.empty() && color < BRAID_SPLIT_NOCOLOR)
    refused = "braidCommSplit: color " + std::to_string(color) + " (colors are >= 0, or BRAID_SPLIT_NOCOLOR)";
  if (refused.empty()) {
    Status s = applyOptions(options, &config);
    if (!s.ok()) refused = "braidCommSplit: " + s.message();
  }
  const int n = parent.nranks(), me = parent.rank();
  Choice mine{color, key, refused.empty() ? 0 : 1};
  std::vector<Choice> all(static_cast<std::size_t>(n));
  Status s = allGatherOnParent(parent, &mine, all.data(), 3, DataType::kInt32, "colors and keys");
  if (!s.ok()) return s;
  if (!refused.empty()) return Status::InvalidArgument(refused + " on rank " + std::to_string(me) +
                                                       "; no communicator was made, the parent is still usable");
  std::vector<int> bad;
  for (int r = 0; r < n; ++r)
    if (all[static_cast<std::size_t>(r)].refused) bad.push_back(r);
  if (!bad.empty())
    return Status::InvalidArgument("braidCommSplit: " + parent.rankList(bad) +
                                   " passed bad arguments (see its error); no communicator was made, the parent is "
                                   "still usable");

  std::vector<int> members;  // the new communicator's ranks, as parent ranks, in new-rank order
  if (color != BRAID_SPLIT_NOCOLOR) {
    for (int r = 0; r < n; ++r)
      if (all[static_cast<std::size_t>(r)].color == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[static_cast<std::size_t>(a)].key < all[static_cast<std::size_t>(b)].key;
    });
  }
  const bool leader = !members.empty() && members.front() == me;
  braidUniqueId ownId{};  // zeros unless this rank is a new rank 0 and made one
  Status made = leader ? makeUniqueIdFor(config, &ownId) : Status::Ok();
  if (!made.ok()) ownId = braidUniqueId{};
  std::vector<braidUniqueId> ids(static_cast<std::size_t>(n));
  s = allGatherOnParent(parent, &ownId, ids.data(), sizeof(braidUniqueId), DataType::kUint8, "the new unique ids");
  if (!s.ok()) return s;
  if (!made.ok()) return made.withContext("braidCommSplit: rank " + std::to_string(me) + ", the new rank 0 of color " +
                                          std::to_string(color) + ", could not host the new communicator's store");
  if (members.empty()) return std::shared_ptr<Comm>();
  const braidUniqueId& id = ids[static_cast<std::size_t>(members.front())];
  if (uniqueIdToString(id).empty())
    return Status::RemoteError("braidCommSplit: rank " + std::to_string(members.front()) + ", the new rank 0 of color " +
                                 std::to_string(color) + ", could not host the new communicator's store (see its error)");
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  auto p = paramsFromUniqueId(id, static_cast<int>(members.size()), newRank);
  if (!p.ok()) return p.status();
  p->config = config;
  return Comm::create(std::move(*p));
}

}  // namespace braid
