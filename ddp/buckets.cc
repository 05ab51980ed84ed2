// Buckets hold whole parameters so that a gradient is one contiguous slice of one all-reduce: a
// view into it is a plain pointer, and markReady is one memcpy.
#include "ddp/buckets.h"

#include <cstring>
#include <new>
#include <string>

#include "ddp/device.h"
#include "ddp/numeric.h"

namespace braid::ddp::detail {

namespace {
constexpr std::align_val_t kAlign{64};
}

void BucketMemoryFree::operator()(std::byte* p) const {
  switch (kind) {  // (the owner has waited for every collective on it)
    case BucketMemoryKind::kShared: (void)memFree(p); break;
    case BucketMemoryKind::kHeap: ::operator delete(p, kAlign); break;
    case BucketMemoryKind::kDevice: device::release(p); break;
  }
}

Result<BucketMemory> BucketMemory::allocate(std::size_t bytes, const void* near, void* stream) {
  BucketMemory b;
  if (bytes == 0) return b;
  const auto own = [&](void* p, BucketMemoryKind kind) {
    b.data_ = std::unique_ptr<std::byte, BucketMemoryFree>(static_cast<std::byte*>(p), BucketMemoryFree{kind});
    b.bytes_ = bytes;
  };
  if (near) {
    auto d = device::allocate(bytes, near, stream);
    if (!d.ok()) return d.status();
    own(*d, BucketMemoryKind::kDevice);
    return b;
  }
  if (auto shared = memAlloc(bytes); shared.ok()) {  // page-aligned, zeroed and resident already
    own(*shared, BucketMemoryKind::kShared);
    return b;
  }
  // braidMemAlloc failed (say, no memfd here): ordinary memory works with every collective too.
  auto* p = static_cast<std::byte*>(::operator new(bytes, kAlign, std::nothrow));
  if (!p) {
    return Status::SystemError("GradSync: cannot allocate " + std::to_string(bytes) +
                               " bytes of bucket memory; lower GradSyncOptions::bucketCapBytes or free memory");
  }
  // Touch every page now: a fresh page costs several times a copy, and the first step should not
  // pay for it in the middle of backward.
  std::memset(p, 0, bytes);
  own(p, BucketMemoryKind::kHeap);
  return b;
}

Status layoutBuckets(const std::vector<Parameter>& params, const GradSyncOptions& options,
                     std::vector<Bucket>& buckets, std::vector<Slot>& slots) {
  buckets.clear();
  slots.assign(params.size(), Slot{});
  std::size_t bytes = 0;  // of the open bucket
  for (std::size_t k = params.size(); k-- > 0;) {
    const Parameter& p = params[k];
    const std::size_t size = p.count * dataTypeSize(p.dtype);
    bool open = !buckets.empty();
    if (open) {
      const std::size_t cap = buckets.size() == 1 ? options.firstBucketCapBytes : options.bucketCapBytes;
      if (buckets.back().info.dtype != p.dtype || bytes + size > cap) open = false;
    }
    if (!open) {
      buckets.emplace_back();
      buckets.back().info.dtype = p.dtype;
      bytes = 0;
    }
    Bucket& b = buckets.back();
    slots[k] = Slot{buckets.size() - 1, b.info.count};
    b.info.params.push_back(k);
    b.offsets.push_back(b.info.count);
    b.info.count += p.count;
    bytes += size;
  }
  const void* near = !params.empty() && params[0].memory == MemoryType::kDevice ? params[0].data : nullptr;
  for (Bucket& b : buckets) {
    auto storage = BucketMemory::allocate(b.info.count * dataTypeSize(b.info.dtype), near, options.stream);
    if (!storage.ok()) return storage.status();
    b.storage = std::move(storage).value();
    b.wireType = wireType(b.info.dtype, options.wireFormat);
    if (b.wireType != b.info.dtype) {
      auto wire = BucketMemory::allocate(b.info.count * dataTypeSize(b.wireType), near, options.stream);
      if (!wire.ok()) return wire.status();
      b.wire = std::move(wire).value();
    }
    b.pending = b.info.params.size();
  }
  return Status::Ok();
}

}  // namespace braid::ddp::detail
