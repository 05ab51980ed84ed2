// Size arguments shared by the peer drivers: "64", "4K", "16M", "1G"; lists like "8,4K,2M"; and the
// -b/-e/-f sweep, every size a whole number of floats (fp32 all-reduce).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace peers {

inline bool parseSize(const char* text, std::size_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text) return false;
  switch (*end) {
    case 'K': case 'k': v <<= 10; ++end; break;
    case 'M': case 'm': v <<= 20; ++end; break;
    case 'G': case 'g': v <<= 30; ++end; break;
    default: break;
  }
  if (*end) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

inline bool parseSizeList(const std::string& text, std::vector<std::size_t>* out) {
  out->clear();
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::size_t v = 0;
    if (!parseSize(text.substr(start, comma - start).c_str(), &v) || v < sizeof(float)) return false;
    out->push_back(v / sizeof(float) * sizeof(float));
    start = comma + 1;
  }
  return !out->empty();
}

// minBytes, minBytes*factor, ... up to maxBytes, unless `sizes` already names them; then maxBytes
// becomes the largest size.
inline void expandSizes(std::vector<std::size_t>& sizes, std::size_t minBytes, std::size_t& maxBytes, double factor) {
  if (sizes.empty()) {
    for (std::size_t bytes = minBytes; bytes <= maxBytes;) {
      sizes.push_back(bytes / sizeof(float) * sizeof(float));
      const auto next = static_cast<std::size_t>(static_cast<double>(bytes) * factor);
      if (next <= bytes) break;
      bytes = next;
    }
  }
  maxBytes = *std::max_element(sizes.begin(), sizes.end());
}

}  // namespace peers
