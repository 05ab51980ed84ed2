#include "base/owned_memory.h"

#include <atomic>
#include <map>
#include <mutex>

namespace braid::owned {
namespace {

std::atomic<Lookup> lookupFn{nullptr};

struct Listeners {
  std::mutex mu;
  std::map<std::uint64_t, Listener> byToken;
  std::uint64_t next = 1;
};
Listeners& listeners() {
  static Listeners* l = new Listeners;  // never destroyed: a transport may unlisten at exit
  return *l;
}

}  // namespace

void setLookup(Lookup lookup) { lookupFn.store(lookup); }

std::optional<Range> find(const void* p, std::size_t n) {
  Lookup f = lookupFn.load();
  return f ? f(p, n) : std::nullopt;
}

std::uint64_t listen(Listener listener) {
  Listeners& l = listeners();
  std::lock_guard<std::mutex> g(l.mu);
  const std::uint64_t token = l.next++;
  l.byToken[token] = std::move(listener);
  return token;
}

void unlisten(std::uint64_t token) {
  Listeners& l = listeners();
  std::lock_guard<std::mutex> g(l.mu);
  l.byToken.erase(token);
}

void releasing(std::uint64_t id) {
  Listeners& l = listeners();
  std::lock_guard<std::mutex> g(l.mu);
  for (auto& [token, listener] : l.byToken) listener(id);
}

}  // namespace braid::owned
