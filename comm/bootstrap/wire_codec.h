// Bounds-checked little helpers to build and parse the store's frames. A Reader never reads past
// its input: every getter fails instead.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace braid {

class Writer {
 public:
  void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void i32(std::int32_t v) { raw(&v, 4); }
  void u32(std::uint32_t v) { raw(&v, 4); }
  void i64(std::int64_t v) { raw(&v, 8); }
  void str(const std::string& s) { u32(static_cast<std::uint32_t>(s.size())); buf_ += s; }
  const std::string& data() const { return buf_; }

 private:
  void raw(const void* p, std::size_t n) { buf_.append(static_cast<const char*>(p), n); }
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : p_(s.data()), left_(s.size()) {}
  explicit Reader(std::string&&) = delete;  // it would point into a temporary
  bool u8(std::uint8_t* v) { return raw(v, 1); }
  bool i32(std::int32_t* v) { return raw(v, 4); }
  bool u32(std::uint32_t* v) { return raw(v, 4); }
  bool i64(std::int64_t* v) { return raw(v, 8); }
  bool str(std::string* s) {
    std::uint32_t n = 0;
    if (!u32(&n) || n > left_) return false;
    s->assign(p_, n);
    p_ += n;
    left_ -= n;
    return true;
  }
  bool atEnd() const { return left_ == 0; }

 private:
  bool raw(void* v, std::size_t n) {
    if (n > left_) return false;
    std::memcpy(v, p_, n);
    p_ += n;
    left_ -= n;
    return true;
  }
  const char* p_;
  std::size_t left_;
};

}  // namespace braid
