// Fingerprints travel as uint64 arrays, one per rank, because all-gather needs the same count
// everywhere: first a fixed header (verdict, parameter count, options), then one triple per
// parameter, padded to the largest count so that a rank with fewer parameters still takes part.
#include "ddp/registration.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "ddp/device.h"

namespace braid::ddp::detail {

namespace {

constexpr std::uint64_t kAbsent = std::numeric_limits<std::uint64_t>::max();

const char* kOptionNames[] = {
    "bucketCapBytes", "firstBucketCapBytes", "average", "allowUnusedParameters",
    "gradientsAsBucketViews", "wireFormat", "checkFinite",
};
constexpr std::size_t kNumOptions = sizeof(kOptionNames) / sizeof(kOptionNames[0]);
constexpr std::size_t kHeader = 2 + kNumOptions;  // verdict, parameter count, options

const char* memoryName(std::uint64_t m) { return m == 0 ? "host" : "device"; }

std::string describe(const std::uint64_t* e, std::uint64_t registered) {
  if (e[0] == kAbsent) return "absent (that rank registered " + std::to_string(registered) + " parameters)";
  return std::to_string(e[0]) + " x " + dataTypeName(static_cast<DataType>(e[1])) + " (" + memoryName(e[2]) + ")";
}

Status gather(Communicator& comm, const std::vector<std::uint64_t>& mine, std::vector<std::uint64_t>& all) {
  all.assign(mine.size() * static_cast<std::size_t>(comm.size()), 0);
  Status s = comm.allGather(mine.data(), all.data(), mine.size(), DataType::kUint64).wait();
  return s.withContext("GradSync::create: exchanging parameter fingerprints");
}

}  // namespace

Status validateLocally(const std::vector<Parameter>& params, const GradSyncOptions& o) {
  if (o.bucketCapBytes == 0 || o.firstBucketCapBytes == 0) {
    return Status::InvalidArgument("GradSync: bucketCapBytes and firstBucketCapBytes must be > 0");
  }
  const int wf = static_cast<int>(o.wireFormat);
  if (wf < 0 || wf > 2) return Status::InvalidArgument("GradSync: unknown wireFormat " + std::to_string(wf));
  int gpu = -1;  // device parameters: the GPU of parameter #0's data
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    const std::string who = "GradSync: parameter #" + std::to_string(i) + " ('" + p.name + "')";
    if (p.memory != MemoryType::kHost && p.memory != MemoryType::kDevice)
      return Status::InvalidArgument(who + " has an unknown memory type");
    if (p.memory != params[0].memory) {
      return Status::InvalidArgument(who + " is in " + memoryName(static_cast<std::uint64_t>(p.memory)) +
                                     " memory but parameter #0 ('" + params[0].name + "') in " +
                                     memoryName(static_cast<std::uint64_t>(params[0].memory)) +
                                     " memory; one GradSync takes one kind of memory (make one per kind)");
    }
    if (p.memory == MemoryType::kDevice) {
      if (!device::available())
        return Status::InvalidArgument(who + " is in device memory, and this build of Braid has no CUDA (-Dcuda=enabled)");
      // Device memory, on the GPU of the first parameter's values (where the buckets will be). The
      // first pointer looked at is that one: a null one is reported below, before any other.
      for (const auto& [what, ptr] : {std::pair<const char*, const void*>{"data", p.data}, {"grad", p.grad}}) {
        if (!ptr) continue;
        auto at = device::locate(ptr);
        if (!at.ok())
          return Status::InvalidArgument(who + ": " + what + " is registered as device memory but is " + at.status().message());
        if (gpu < 0) gpu = *at;
        if (*at != gpu)
          return Status::InvalidArgument(who + ": " + what + " is on GPU " + std::to_string(*at) + " but parameter #0's data on GPU " +
                                         std::to_string(gpu) + "; one GradSync keeps its parameters on one GPU");
      }
    }
    if (!isValid(p.dtype)) return Status::InvalidArgument(who + " has an unknown dtype");
    if (p.count == 0) return Status::InvalidArgument(who + " has no elements");
    if (!p.data) return Status::InvalidArgument(who + ": data is null (create() broadcasts the values from rank 0)");
    if (o.gradientsAsBucketViews && p.grad) {
      return Status::InvalidArgument(who + ": grad must be null with gradientsAsBucketViews (the gradient lives in "
                                           "bucket memory: write it through GradSync::gradient(i))");
    }
    if (!o.gradientsAsBucketViews && !p.grad) return Status::InvalidArgument(who + ": grad is null");
  }
  return Status::Ok();
}

Status agreeOnRegistration(Communicator& comm, const std::vector<Parameter>& params, const GradSyncOptions& o,
                           const Status& local) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> mine = {
      local.ok() ? 0u : 1u, params.size(), o.bucketCapBytes, o.firstBucketCapBytes, o.average,
      o.allowUnusedParameters, o.gradientsAsBucketViews, static_cast<std::uint64_t>(o.wireFormat), o.checkFinite,
  };
  std::vector<std::uint64_t> all;
  if (Status s = gather(comm, mine, all); !s.ok()) return s;
  auto header = [&](std::size_t r) { return &all[r * kHeader]; };

  for (std::size_t r = 0; r < n; ++r) {
    if (header(r)[0] == 0) continue;
    if (!local.ok()) return local;
    return Status::InvalidUsage("GradSync::create on rank " + std::to_string(comm.rank()) + ": rank " +
                                std::to_string(r) + " rejected its parameters or options (its own error says why)");
  }
  for (std::size_t j = 0; j < kNumOptions; ++j) {
    for (std::size_t r = 1; r < n; ++r) {
      if (header(r)[2 + j] == header(0)[2 + j]) continue;
      return Status::InvalidUsage("GradSync::create: GradSyncOptions::" + std::string(kOptionNames[j]) + " is " +
                                  std::to_string(header(0)[2 + j]) + " on rank 0 but " +
                                  std::to_string(header(r)[2 + j]) + " on rank " + std::to_string(r) +
                                  "; every rank must pass the same options");
    }
  }

  std::uint64_t most = 0;
  for (std::size_t r = 0; r < n; ++r) most = std::max(most, header(r)[1]);
  const std::vector<std::uint64_t> counts = [&] {
    std::vector<std::uint64_t> c(n);
    for (std::size_t r = 0; r < n; ++r) c[r] = header(r)[1];
    return c;
  }();
  mine.assign(static_cast<std::size_t>(most) * 3, kAbsent);
  for (std::size_t i = 0; i < params.size(); ++i) {
    mine[3 * i] = params[i].count;
    mine[3 * i + 1] = static_cast<std::uint64_t>(params[i].dtype);
    mine[3 * i + 2] = static_cast<std::uint64_t>(params[i].memory);
  }
  if (most == 0) return Status::Ok();
  if (Status s = gather(comm, mine, all); !s.ok()) return s;
  const std::size_t stride = static_cast<std::size_t>(most) * 3;
  for (std::size_t i = 0; i < most; ++i) {
    const std::uint64_t* ref = &all[3 * i];
    for (std::size_t r = 1; r < n; ++r) {
      const std::uint64_t* e = &all[r * stride + 3 * i];
      if (std::equal(e, e + 3, ref)) continue;
      const std::string name = i < params.size() ? "'" + params[i].name + "' here" : "none here";
      return Status::InvalidUsage("GradSync::create: ranks registered different parameters: parameter #" +
                                  std::to_string(i) + " (" + name + ") is " + describe(ref, counts[0]) +
                                  " on rank 0 but " + describe(e, counts[r]) + " on rank " + std::to_string(r) +
                                  "; every rank must register the same parameters (count, dtype, memory) in the "
                                  "same order");
    }
  }
  return Status::Ok();
}

}  // namespace braid::ddp::detail
