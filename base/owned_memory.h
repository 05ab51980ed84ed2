// Memory Braid hands out (braidMemAlloc) and takes back (braidMemFree): the one kind of memory
// whose end Braid sees, so a transport may keep what it derived from such memory (an ib
// registration) until then, and drop it when told. comm/memory.cc owns the allocations and
// reports here; transports, which may not include comm/memory.h (the rooms' rule), ask and listen
// here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace braid::owned {

struct Range {
  const void* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t id = 0;  // unique for the process's life: never reused after a free
};

// The allocation that holds all of [p, p + n), if any (set by comm/memory.cc).
using Lookup = std::optional<Range> (*)(const void* p, std::size_t n);
void setLookup(Lookup lookup);
std::optional<Range> find(const void* p, std::size_t n);

// Called with an allocation's id after it left the registry and before its pages go; a listener
// drops what it holds for it. Listeners run on the freeing thread, one at a time.
using Listener = std::function<void(std::uint64_t id)>;
std::uint64_t listen(Listener listener);  // a token for unlisten
void unlisten(std::uint64_t token);        // waits for a running call of that listener to end
void releasing(std::uint64_t id);

}  // namespace braid::owned
