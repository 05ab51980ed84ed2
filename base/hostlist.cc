#include "base/hostlist.h"

namespace braid {
namespace {

// One bracket group: its first `limit` values as zero-padded text (the rest are only checked).
Result<std::vector<std::string>> parseGroup(const std::string& body, const std::string& expr, std::size_t limit) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("hostlist '" + expr + "': [" + body + "]: " + why);
  };
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= body.size()) {
    std::size_t end = body.find(',', i);
    if (end == std::string::npos) end = body.size();
    const std::string range = body.substr(i, end - i);
    const std::size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(lo) || !digits(hi)) return bad("'" + range + "' is not a number or a range of numbers");
    const unsigned long long a = std::stoull(lo), b = std::stoull(hi);
    if (a > b) return bad("'" + range + "' runs backwards");
    if (b - a >= (1u << 20)) return bad("'" + range + "' is too long a range");
    for (unsigned long long v = a; v <= b && out.size() < limit; ++v) {
      std::string t = std::to_string(v);
      if (t.size() < lo.size()) t.insert(0, lo.size() - t.size(), '0');
      out.push_back(std::move(t));
    }
    i = end + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> expandHostlist(const std::string& expr, std::size_t limit) {
  std::vector<std::string> hosts;
  std::size_t i = 0;
  while (i < expr.size() && hosts.size() < limit) {
    // One name: up to the next comma outside brackets.
    std::vector<std::string> partial{""};
    bool any = false;
    while (i < expr.size() && expr[i] != ',') {
      if (expr[i] == ']') return Status::InvalidArgument("hostlist '" + expr + "': ']' without '['");
      if (expr[i] == '[') {
        const std::size_t close = expr.find(']', i);
        if (close == std::string::npos) return Status::InvalidArgument("hostlist '" + expr + "': '[' without ']'");
        const std::string body = expr.substr(i + 1, close - i - 1);
        if (body.find('[') != std::string::npos) return Status::InvalidArgument("hostlist '" + expr + "': nested '['");
        auto values = parseGroup(body, expr, limit);
        if (!values.ok()) return values.status();
        std::vector<std::string> next;
        for (const std::string& p : partial)
          for (const std::string& v : *values) {
            if (next.size() >= limit) break;
            next.push_back(p + v);
          }
        partial = std::move(next);
        i = close + 1;
      } else {
        const std::size_t stop = expr.find_first_of(",[]", i);
        const std::string text = expr.substr(i, stop == std::string::npos ? std::string::npos : stop - i);
        if (text.find_first_of(" \t\n") != std::string::npos)
          return Status::InvalidArgument("hostlist '" + expr + "': a host name has white space");
        for (std::string& p : partial) p += text;
        i += text.size();
      }
      any = true;
    }
    if (!any) return Status::InvalidArgument("hostlist '" + expr + "': an empty name");
    for (std::string& p : partial) {
      if (hosts.size() >= limit) break;
      hosts.push_back(std::move(p));
    }
    if (i < expr.size()) {  // the comma
      ++i;
      if (i == expr.size()) return Status::InvalidArgument("hostlist '" + expr + "': an empty name at the end");
    }
  }
  if (hosts.empty()) return Status::InvalidArgument("hostlist '" + expr + "' names no host");
  return hosts;
}

}  // namespace braid
