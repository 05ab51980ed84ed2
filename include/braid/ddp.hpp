// Braid DDP: gradient synchronization for data-parallel training, the part of PyTorch's
// DistributedDataParallel that touches gradients, as a small library any framework can drive.
//
//   std::vector<braid::ddp::Parameter> params = {{"fc1.weight", w1, g1, 4096, DataType::kFloat32}, ...};
//   auto sync = braid::ddp::GradSync::create(comm, params);   // checks ranks agree, broadcasts rank 0's values
//   for (each step) {
//     forward();
//     backward();              // calls sync->markReady(i) as soon as gradient i is final (last layer first)
//     Status s = sync->finish();  // every gradient now holds the average over ranks
//     optimizerStep();
//   }
//
// Gradient accumulation: inside a noSync() scope nothing is sent; gradients keep accumulating in
// their buffers, and the next synchronized step reduces the accumulated sums:
//
//   { auto guard = sync->noSync(); forward(micro[0]); backward(micro[0]); }
//   forward(micro[1]); backward(micro[1]); sync->finish();
//
// Contract:
//  - Errors are values (Status / Result); nothing throws.
//  - Ownership. Parameter::data and Parameter::grad belong to the caller and must outlive the
//    GradSync. The GradSync keeps a copy of the Communicator (a shared handle) and owns its bucket
//    memory. With gradientsAsBucketViews the gradients live in that bucket memory: gradient(i)
//    says where, and the pointer is valid for the GradSync's lifetime.
//  - Thread safety. One thread at a time may call a GradSync (as with a Communicator). The
//    all-reduces run on the communicator's worker thread: between markReady(i) and the end of
//    finish() the caller must not write gradient i (nor, with views, read it).
//  - Blocking. create() blocks until every rank has registered (bounded by BRAID_TIMEOUT). markReady()
//    never waits: it copies and may start an all-reduce. finish() blocks until every bucket is
//    reduced. The destructor waits for all-reduces still in flight.
//  - Device parameters (MemoryType::kDevice, CUDA builds): the same, with every copy and all-reduce
//    queued on GradSyncOptions::stream; the averages are in the gradients for work queued on that
//    stream after finish() (the host sees them after synchronizing it).
//  - Collective order. Every rank must make the same sequence of create/finish calls, with noSync
//    steps in the same places. Bucket all-reduces are queued on the communicator in bucket order,
//    so other collectives issued on the same communicator between the first markReady of a step and
//    finish() must be issued at the same point on every rank (or use another communicator).
//  - Errors that involve other ranks (different registrations, a parameter not marked ready, a
//    gradient with NaN or Inf, a device copy that could not be queued) are agreed on by all ranks: every rank returns the error, none hangs,
//    and the communicator stays usable. The failed step is dropped: gradient buffers are left as
//    they were before finish() (with views: unspecified), and the next step starts clean.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "braid/status.hpp"
#include "braid/types.hpp"

namespace braid::ddp {

// Where a buffer lives. All parameters of one GradSync live in the same kind of memory. Device
// parameters (CUDA builds) get bucket memory on their GPU, and every copy and all-reduce of the
// layer is queued on GradSyncOptions::stream.
enum class MemoryType : int { kHost = 0, kDevice = 1 };

// What buckets travel as. Compression applies to float32 and float64 buckets; other types travel
// as they are. With averaging on, values are divided by the world size before the narrowing, so
// that the sum cannot overflow where the average would not.
enum class WireFormat : int { kNative = 0, kFloat16 = 1, kBfloat16 = 2 };

// One parameter, registered in forward order (the order the model uses them).
struct Parameter {
  std::string name;       // used in error messages: "fc1.weight"
  void* data = nullptr;   // the values; rank 0's are copied to every rank by create()
  void* grad = nullptr;   // the gradient (count elements); must be null with gradientsAsBucketViews
  std::size_t count = 0;  // elements, > 0
  DataType dtype = DataType::kFloat32;
  MemoryType memory = MemoryType::kHost;
};

struct GradSyncOptions {
  // A bucket holds whole parameters, at most this many bytes unless one parameter is larger.
  // PyTorch's bucket_cap_mb.
  std::size_t bucketCapBytes = std::size_t{25} << 20;
  // The cap of the first bucket (the last parameters of the model), small so that communication
  // starts early in backward.
  std::size_t firstBucketCapBytes = std::size_t{1} << 20;
  // Divide the sum by the world size (integer gradients: integer division, as ReduceOp::kAvg).
  bool average = true;
  // A parameter not marked ready by finish() counts as a zero gradient on that rank, instead of
  // being an error.
  bool allowUnusedParameters = false;
  // Gradients live in the bucket memory (no copy in markReady, none back in finish); write them
  // through gradient(i).
  bool gradientsAsBucketViews = false;
  WireFormat wireFormat = WireFormat::kNative;
  // Check every gradient for NaN and Inf before it is sent; finish() names the parameter and rank.
  bool checkFinite = false;
  // Device parameters only: the cudaStream_t that produces the gradients (nullptr: the legacy default
  // stream). markReady(i) copies gradient i after the work queued on it so far; finish() queues
  // the averages' copies back on it, so work queued after finish() sees them. Each rank passes its
  // own (not compared between ranks). The wire format's conversions and the finite check run there
  // too, as kernels.
  void* stream = nullptr;
};

// One bucket: the parameters it holds (indices, in the order they become ready) and its size.
struct BucketInfo {
  std::vector<std::size_t> params;
  std::size_t count = 0;  // elements
  DataType dtype = DataType::kFloat32;
};

namespace detail {
struct GradSyncState;
}

// While alive, the GradSync runs in accumulation mode (see noSync()). Movable, not copyable; must
// not outlive its GradSync.
class [[nodiscard]] BRAID_EXPORT NoSyncGuard {
 public:
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  friend class GradSync;
  explicit NoSyncGuard(detail::GradSyncState* s);
  detail::GradSyncState* state_ = nullptr;
};

class BRAID_EXPORT GradSync {
 public:
  // Collective: every rank of `comm` calls it with the same parameters (count, dtype, memory, in
  // the same order) and the same options. Checks that they agree (the error names the first
  // differing parameter and rank), lays out the buckets, and broadcasts parameter values from
  // rank 0.
  static Result<GradSync> create(Communicator comm, std::vector<Parameter> params, GradSyncOptions options = {});

  GradSync(GradSync&&) noexcept;
  GradSync& operator=(GradSync&&) noexcept;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  ~GradSync();

  // Gradient `index` (registration order) is final for this step. Copies it into its bucket
  // (unless views); once a bucket is full and every bucket before it has started, its
  // all-reduce starts. Inside noSync() it only records that the parameter was used.
  // Errors: index out of range (invalid argument), marked twice in one step (invalid usage).
  Status markReady(std::size_t index);

  // Ends the step: starts what has not started, waits for every bucket, averages, copies the
  // results back into the gradient buffers. Inside noSync() it returns at once.
  Status finish();

  // Accumulation scope. A step is synchronized or not as a whole: the mode is fixed by the first
  // markReady() of the step, so a guard made in the middle of a synchronized step takes effect
  // from the next step. Guards nest.
  NoSyncGuard noSync();

  // Where gradient `index` lives: Parameter::grad, or its place in bucket memory with views.
  // Null for an index out of range.
  void* gradient(std::size_t index) const;

  std::size_t numParameters() const;
  const Parameter& parameter(std::size_t index) const;  // index < numParameters()
  // Buckets in launch order: bucket 0 holds the last registered parameters.
  const std::vector<BucketInfo>& buckets() const;
  const GradSyncOptions& options() const;

 private:
  explicit GradSync(std::unique_ptr<detail::GradSyncState> s);
  std::unique_ptr<detail::GradSyncState> state_;
};

struct SamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;  // must be the same on every rank
  // Drop the tail so every rank gets floor(size / ranks) samples; otherwise pad by repeating
  // indices from the start so every rank gets ceil(size / ranks).
  bool dropLast = false;
};

// Splits the indices 0..datasetSize-1 among the ranks for each epoch: a permutation drawn from
// seed + epoch (the same on every rank), padded or cut to a multiple of the world size, and dealt
// out rank by rank (rank r gets positions r, r + ranks, ...). Call setEpoch() at the start of every
// epoch, or every epoch sees the same order. A plain value: copyable, no communication.
class BRAID_EXPORT DistributedSampler {
 public:
  // Invalid argument unless ranks > 0 and 0 <= rank < ranks.
  static Result<DistributedSampler> create(std::size_t datasetSize, int ranks, int rank,
                                           SamplerOptions options = {});
  static Result<DistributedSampler> create(std::size_t datasetSize, const Communicator& comm,
                                           SamplerOptions options = {});

  void setEpoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }
  // This rank's dataset indices for the current epoch, numSamples() of them.
  std::vector<std::size_t> indices() const;
  std::size_t numSamples() const { return numSamples_; }
  // numSamples() * ranks: the padded (or cut) length of one epoch.
  std::size_t totalSize() const { return numSamples_ * static_cast<std::size_t>(ranks_); }

 private:
  DistributedSampler(std::size_t size, int ranks, int rank, SamplerOptions o);
  std::size_t size_ = 0;
  int ranks_ = 1;
  int rank_ = 0;
  SamplerOptions options_;
  std::size_t numSamples_ = 0;
  std::uint64_t epoch_ = 0;
};

}  // namespace braid::ddp
