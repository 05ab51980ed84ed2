// Reading and writing JSON, for the tools' files: braid trace's flight recorder files, braid perf's
// and braid doctor's --json output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "braid/status.hpp"

namespace braid::tools {

// A JSON value (numbers keep their text).
struct Json {
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject } type = kNull;
  bool boolean = false;
  std::string text;  // string contents, or a number's digits
  std::vector<Json> items;
  // Object members as two lists: a pair<string, Json> would need Json complete here.
  std::vector<std::string> keys;
  std::vector<Json> values;

  const Json* get(const std::string& key) const {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &values[i];
    return nullptr;
  }
};

// A whole document; the error says what was wrong and at which offset.
Result<Json> parseJson(const std::string& text);

// A member's value, or a fallback when it is missing or of another type.
std::int64_t intOf(const Json* v, std::int64_t fallback = 0);
std::uint64_t uintOf(const Json* v);
double doubleOf(const Json* v, double fallback = 0);
std::string strOf(const Json* v);
bool boolOf(const Json* v);

// `s` as a JSON string literal, quoted (control characters dropped).
std::string jsonString(const std::string& s);

}  // namespace braid::tools
