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

// Frees either kind of HostBuffer memory.
struct HostBufferFree {
  bool braidMemory = false;
  void operator()(std::byte* p) const;
};

// Zeroed, resident, 64-byte aligned host memory that lives as long as the GradSync. It comes from
// braid::memAlloc (braidMemAlloc: memory the other ranks of the host can map, which makes the
// all-reduce of a large bucket zero-copy) and, if that fails, from ordinary memory, which every
// collective accepts too (through the staged path).
class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> allocate(std::size_t bytes);
  std::byte* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }
  bool braidMemory() const { return data_.get_deleter().braidMemory; }

 private:
  std::unique_ptr<std::byte, HostBufferFree> data_;
  std::size_t bytes_ = 0;
};

struct Bucket {
  BucketInfo info;                   // parameters in the order they become ready, element count, dtype
  std::vector<std::size_t> offsets;  // element offset of each of info.params inside the bucket
  HostBuffer storage;                // the gradients, in info.dtype
  HostBuffer wire;                   // the narrowed copy when compression applies, else empty
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
// the layout is the same everywhere. Allocates the memory (system error if that fails).
Status layoutBuckets(const std::vector<Parameter>& params, const GradSyncOptions& options,
                     std::vector<Bucket>& buckets, std::vector<Slot>& slots);

}  // namespace braid::ddp::detail
