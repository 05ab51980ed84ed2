#include "tools/json.h"

#include <cstdlib>
#include <cstring>

namespace braid::tools {
namespace {

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Result<Json> parseDocument() {
    Json v;
    Status st = value(v, 0);
    if (!st.ok()) return st;
    skipSpace();
    if (pos_ != s_.size()) return error("trailing characters");
    return v;
  }

 private:
  Status error(const std::string& what) const {
    return Status::InvalidArgument("JSON: " + what + " at offset " + std::to_string(pos_));
  }
  void skipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  bool literal(const char* word) {
    std::size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  Status value(Json& out, int depth) {
    if (depth > 32) return error("nesting too deep");
    skipSpace();
    if (pos_ >= s_.size()) return error("unexpected end");
    char c = s_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out.type = Json::kString;
      return string(out.text);
    }
    if (literal("true")) { out.type = Json::kBool; out.boolean = true; return Status::Ok(); }
    if (literal("false")) { out.type = Json::kBool; out.boolean = false; return Status::Ok(); }
    if (literal("null")) { out.type = Json::kNull; return Status::Ok(); }
    std::size_t start = pos_;
    while (pos_ < s_.size() && std::strchr("+-0123456789.eE", s_[pos_])) ++pos_;
    if (pos_ == start) return error(std::string("unexpected '") + c + "'");
    out.type = Json::kNumber;
    out.text = s_.substr(start, pos_ - start);
    return Status::Ok();
  }

  Status object(Json& out, int depth) {
    out.type = Json::kObject;
    ++pos_;  // {
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::Ok(); }
    for (;;) {
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return error("expected a member name");
      std::string key;
      Status st = string(key);
      if (!st.ok()) return st;
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return error("expected ':'");
      ++pos_;
      Json v;
      st = value(v, depth + 1);
      if (!st.ok()) return st;
      out.keys.push_back(std::move(key));
      out.values.push_back(std::move(v));
      skipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::Ok(); }
      return error("expected ',' or '}'");
    }
  }

  Status array(Json& out, int depth) {
    out.type = Json::kArray;
    ++pos_;  // [
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::Ok(); }
    for (;;) {
      Json v;
      Status st = value(v, depth + 1);
      if (!st.ok()) return st;
      out.items.push_back(std::move(v));
      skipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::Ok(); }
      return error("expected ',' or ']'");
    }
  }

  static void appendUtf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  Status string(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return Status::Ok();
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return error("short \\u escape");
          unsigned cp = 0;
          for (int i = 0; i < 4; ++i) {
            char h = s_[pos_++];
            cp <<= 4;
            if (h >= '0' && h <= '9') cp |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') cp |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') cp |= static_cast<unsigned>(h - 'A' + 10);
            else return error("bad \\u escape");
          }
          appendUtf8(out, cp);
          break;
        }
        default: return error("bad escape");
      }
    }
    return error("unterminated string");
  }

  const std::string& s_;
  std::size_t pos_ = 0;
};

}  // namespace

Result<Json> parseJson(const std::string& text) { return JsonParser(text).parseDocument(); }

std::int64_t intOf(const Json* v, std::int64_t fallback) {
  if (!v || v->type != Json::kNumber) return fallback;
  return std::strtoll(v->text.c_str(), nullptr, 10);
}
std::uint64_t uintOf(const Json* v) {
  if (!v || v->type != Json::kNumber) return 0;
  return std::strtoull(v->text.c_str(), nullptr, 10);
}
std::string strOf(const Json* v) { return v && v->type == Json::kString ? v->text : ""; }
bool boolOf(const Json* v) { return v && v->type == Json::kBool && v->boolean; }

double doubleOf(const Json* v, double fallback) {
  if (!v || v->type != Json::kNumber) return fallback;
  return std::strtod(v->text.c_str(), nullptr);
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

}  // namespace braid::tools
