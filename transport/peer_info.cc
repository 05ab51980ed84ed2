// PeerInfo on the wire: one field per line; each transport's entry as "name usable hex(bytes)", so
// that an address may hold any bytes (a transport's binary blob, a reason with spaces).
#include <sstream>

#include "transport/transport.h"

namespace braid {
namespace {

std::string toHex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool fromHex(const std::string& hex, std::string* out) {
  auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  if (hex.size() % 2) return false;
  out->clear();
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace

const TransportAddress* PeerInfo::transport(std::string_view name) const {
  for (const TransportAddress& t : transports)
    if (t.name == name) return &t;
  return nullptr;
}

std::string PeerInfo::serialize() const {
  std::ostringstream o;
  o << rank << '\n' << host << '\n' << bootId << '\n' << pid << '\n' << settings << '\n' << cmaProbe << '\n'
    << cpus << '\n' << tuningL3 << '\n' << boot << '\n' << transports.size() << '\n';
  for (const TransportAddress& t : transports)
    o << t.name << ' ' << (t.usable ? 1 : 0) << ' ' << toHex(t.address) << '\n';
  return o.str();
}

Result<PeerInfo> PeerInfo::parse(const std::string& text) {
  std::istringstream in(text);
  PeerInfo p;
  std::string rank, pid, cma, l3, count;
  if (!std::getline(in, rank) || !std::getline(in, p.host) || !std::getline(in, p.bootId) || !std::getline(in, pid) ||
      !std::getline(in, p.settings) || !std::getline(in, cma) || !std::getline(in, p.cpus) || !std::getline(in, l3) ||
      !std::getline(in, p.boot) || !std::getline(in, count))
    return Status::Internal("bad peer info: fields missing");
  try {
    p.rank = std::stoi(rank);
    p.pid = std::stoi(pid);
    p.cmaProbe = std::stoull(cma);
    p.tuningL3 = std::stoull(l3);
    const long n = std::stol(count);
    if (n < 0 || n > 64) return Status::Internal("bad peer info: " + count + " transports");
    for (long i = 0; i < n; ++i) {
      TransportAddress t;
      int usable = 0;
      std::string hex, line;
      if (!std::getline(in, line)) return Status::Internal("bad peer info: transport entries missing");
      std::istringstream f(line);
      if (!(f >> t.name >> usable) || (usable != 0 && usable != 1)) return Status::Internal("bad peer info: transport entry");
      f >> hex;  // empty for an empty address
      if (!fromHex(hex, &t.address)) return Status::Internal("bad peer info: transport address");
      t.usable = usable == 1;
      p.transports.push_back(std::move(t));
    }
  } catch (const std::exception&) {
    return Status::Internal("bad peer info: a number is not one");
  }
  return p;
}

}  // namespace braid
