// Bucket layout and memory for the gradient layer: which parameters share an all-reduce, and where
// each gradient sits inside its bucket.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "braid/braid.hpp"
#include "braid/ddp.hpp"
#include "braid/status.hpp"

namespace braid::ddp::detail {

// Where bucket memory comes from, and so how it is freed.
enum class BucketMemoryKind { kShared, kHeap, kDevice };
struct BucketMemoryFree {
  BucketMemoryKind kind = BucketMemoryKind::kHeap;
  void operator()(std::byte* p) const;
};

// Zeroed bucket memory that lives as long as the GradSync, 64-byte aligned or better.
// Host: resident memory from braid::memAlloc (braidMemAlloc: memory the other ranks of the host can
// map, which makes the all-reduce of a large bucket zero-copy) and, if that fails, from ordinary
// memory, which every collective accepts too (through the staged path). Device (`near` not null):
// cudaMalloc memory on the GPU of `near`, zeroed on `stream`, which the collectives reach through
// CUDA IPC.
class BucketMemory {
 public:
  BucketMemory() = default;
  static Result<BucketMemory> allocate(std::size_t bytes, const void* near = nullptr, void* stream = nullptr);
  std::byte* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }
  BucketMemoryKind kind() const { return data_.get_deleter().kind; }

 private:
  std::unique_ptr<std::byte, BucketMemoryFree> data_;
  std::size_t bytes_ = 0;
};

struct Bucket {
  BucketInfo info;                   // parameters in the order they become ready, element count, dtype
  std::vector<std::size_t> offsets;  // element offset of each of info.params inside the bucket
  BucketMemory storage;              // the gradients, in info.dtype (on the parameters' GPU for device ones)
  BucketMemory wire;                 // the narrowed copy when compression applies, else empty
  DataType wireType = DataType::kFloat32;
  std::size_t pending = 0;           // parameters of this step not yet ready
  bool launched = false;
  Work work;
};

// Where one parameter's gradient lives.
struct Slot {
  std::size_t bucket = 0;
  std::size_t offset = 0;  // elements into the bucket
};

// Lays out buckets in reverse registration order: a bucket closes when the next parameter would
// take it past its cap (options.firstBucketCapBytes for bucket 0, bucketCapBytes after) or has a
// different dtype. A parameter larger than the cap gets a bucket of its own. Depends only on the
// parameters' counts and dtypes and on the options, which every rank has checked to agree on, so
// the layout is the same everywhere. Allocates the memory (system or cuda error if that fails), on
// the GPU of the first parameter when the parameters are device memory.
Status layoutBuckets(const std::vector<Parameter>& params, const GradSyncOptions& options,
                     std::vector<Bucket>& buckets, std::vector<Slot>& slots);

}  // namespace braid::ddp::detail
