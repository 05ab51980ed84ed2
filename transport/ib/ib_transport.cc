#include "transport/ib/ib_transport.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "base/capability.h"
#include "base/log.h"

namespace braid {
namespace {

std::string hex(const std::uint8_t* p, std::size_t n) {
  std::string s;
  char b[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), "%02x", p[i]);
    s += b;
  }
  return s;
}

bool unhex(const std::string& s, std::uint8_t* out, std::size_t n) {
  if (s.size() != 2 * n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    out[i] = static_cast<std::uint8_t>(v);
  }
  return true;
}

const char* gidTypeName(int t) {
  return t == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : t == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "InfiniBand";
}

std::string endpointsText(const std::vector<IbEndpoint>& es) {
  std::ostringstream o;
  for (const IbEndpoint& e : es)
    o << e.qpn << ' ' << e.psn << ' ' << e.inbox << ' ' << e.inboxKey << ' ' << e.ctl << ' ' << e.ctlKey << '\n';
  return o.str();
}

std::vector<IbEndpoint> parseEndpoints(const std::string& text) {
  std::istringstream in(text);
  std::vector<IbEndpoint> out;
  IbEndpoint e;
  while (in >> e.qpn >> e.psn >> e.inbox >> e.inboxKey >> e.ctl >> e.ctlKey) out.push_back(e);
  return out;
}

}  // namespace

std::string IbAddress::text() const {
  std::ostringstream o;
  o << device << ' ' << port << ' ' << remote.lid << ' ' << hex(remote.gid.raw, 16) << ' ' << gidIndex << ' ' << gidType
    << ' ' << (remote.ethernet ? "eth" : "ib") << ' ' << remote.mtu;
  return o.str();
}

Result<IbAddress> IbAddress::parse(const std::string& text) {
  std::istringstream in(text);
  IbAddress a;
  std::string gid, link;
  if (!(in >> a.device >> a.port >> a.remote.lid >> gid >> a.gidIndex >> a.gidType >> link >> a.remote.mtu) ||
      !unhex(gid, a.remote.gid.raw, 16) || (link != "ib" && link != "eth"))
    return Status::InvalidArgument("unreadable ib address '" + text + "'");
  a.remote.ethernet = link == "eth";
  return a;
}

std::size_t IbTransport::lockedBytes(const Config& config) {
  // One connection registers its channels' rings: an inbox and an outbox of BRAID_BUFFSIZE each.
  return static_cast<std::size_t>(config.nsocks) * (2 * config.buffSize + 4096);
}

Availability IbTransport::probe() {
  if (probed_) return availability_;
  probed_ = true;
  if (config_.ibDisable) return availability_ = {false, "disabled by BRAID_IB_DISABLE=1"};
  auto v = Verbs::load(config_.ibverbsLib);
  if (!v.ok()) return availability_ = {false, v.status().message()};
  verbs_ = *v;
  PortSearch found = findPorts(*verbs_, config_);
  if (found.ports.empty()) return availability_ = {false, found.whyNone};
  ports_ = found.ports;
  const std::size_t need = lockedBytes(config_);
  rlimit lim{};
  ::getrlimit(RLIMIT_MEMLOCK, &lim);
  if (!hasCapability(kCapIpcLock) && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < need)
    return availability_ = {false, "the memlock limit (ulimit -l) is " + std::to_string(lim.rlim_cur >> 10) +
                                       " KiB, below the " + std::to_string(need >> 10) +
                                       " KiB one ib connection registers (BRAID_NSOCKS x 2 x BRAID_BUFFSIZE): raise it "
                                       "(ulimit -l unlimited; docker run --ulimit memlock=-1; systemd "
                                       "LimitMEMLOCK=infinity)"};
  return availability_ = {true, ""};
}

Result<std::string> IbTransport::localAddress(const std::string&) {
  if (!probe().usable) return Status::Internal("ib: localAddress without a usable port");
  const IbPort& port = ports_.front();  // the nearest
  int n = 0;
  ibv_device** list = verbs_->getDeviceList(&n);
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (port.device == verbs_->getDeviceName(list[i])) dev = list[i];
  auto d = std::make_shared<IbDevice>();
  d->verbs = verbs_;
  d->port = port;
  d->ctx = dev ? verbs_->openDevice(dev) : nullptr;
  if (list) verbs_->freeDeviceList(list);
  if (!d->ctx) return Status::SystemError("ib: cannot open " + port.device + ": " + std::strerror(errno));
  d->pd = verbs_->allocPd(d->ctx);
  d->channel = d->pd ? verbs_->createCompChannel(d->ctx) : nullptr;
  if (!d->channel) return Status::SystemError("ib: " + port.device + ": cannot make a protection domain and completion channel: " + std::strerror(errno));
  ::fcntl(d->channel->fd, F_SETFL, ::fcntl(d->channel->fd, F_GETFL) | O_NONBLOCK);
  d->keepOwnedRegistrations();
  const std::string odp = config_.ibOdp ? d->useOnDemandPaging() : "on-demand paging off (BRAID_IB_ODP=0)";
  BRAID_LOG(kInfo, kNet, "ib: %s: %s", port.device.c_str(), odp.c_str());
  device_ = d;
  IbAddress a;
  a.device = port.device;
  a.port = port.port;
  a.remote.lid = port.attr.lid;
  a.remote.gid = port.gid;
  a.remote.mtu = port.attr.active_mtu;
  a.remote.ethernet = port.ethernet();
  a.gidIndex = port.gidIndex;
  a.gidType = port.gidType;
  return a.text();
}

// Reads only what reachKey keeps (the port's kind and, for RoCE, its GID type), so that a rank's
// roster entry, which holds the key in place of the address, decides as its full PeerInfo would.
Availability IbTransport::canReach(const PeerInfo& a, const PeerInfo& b) const {
  auto keyOf = [&](const PeerInfo& p) { return reachKey(p.transport(name())->address); };
  const std::string x = keyOf(a), y = keyOf(b);
  for (const auto& [key, p] : {std::pair<const std::string&, const PeerInfo&>{x, a}, {y, b}})
    if (key != "ib" && key.rfind("roce ", 0) != 0)
      return {false, "rank " + std::to_string(p.rank) + "'s ib address is unreadable (" + key + ")"};
  auto describe = [](const PeerInfo& p, const std::string& key) {
    return "rank " + std::to_string(p.rank) + "'s port is " + (key == "ib" ? "InfiniBand" : "Ethernet (RoCE)");
  };
  if ((x == "ib") != (y == "ib")) return {false, describe(a, x) + ", " + describe(b, y)};
  if (x != y)
    return {false, "rank " + std::to_string(a.rank) + " sends " + gidTypeName(std::atoi(x.c_str() + 5)) + ", rank " +
                       std::to_string(b.rank) + " " + gidTypeName(std::atoi(y.c_str() + 5)) + " (set BRAID_IB_GID_INDEX alike)"};
  return {true, ""};
}

std::string IbTransport::reachKey(const std::string& address) const {
  auto x = IbAddress::parse(address);
  if (!x.ok() && (address == "ib" || address.rfind("roce ", 0) == 0)) return address;  // a roster entry's: a key already
  if (!x.ok()) return "unparsable " + x.status().message();  // canReach refuses it, naming the rank: keep it apart
  return x->remote.ethernet ? "roce " + std::to_string(x->gidType) : "ib";
}

LinkClass IbTransport::linkClass(const PeerInfo& a, const PeerInfo& b) const {
  LinkClass l;  // an HCA round trip; one QP's share of a 100 Gb/s port
  l.latencyUs = 3;
  l.bytesPerUs = 10000;
  l.minPiece = 64u << 10;
  // With zero copy a send/recv's piece is one RDMA write into the receiver's buffer: 16 MiB
  // makes the per-write costs (a registration on each end, a post, a completion) a few percent,
  // where the ring's 512 KiB made them a third on the emulation (docs/PERFORMANCE.md).
  if (config_.ibZcopyBytes) l.maxPiece = 16u << 20;
  l.sameHost = a.sameHostAs(b);
  l.sharedMemory = false;
  return l;
}

WaitSources IbTransport::waitSources() const {
  WaitSources w;
  // Only with ib peers: a socket to wait on makes the waiter poll in slices instead of sleeping
  // on the shm doorbell.
  if (device_ && (connected_ || connectLater_)) {
    w.fds.push_back(device_->channel->fd);
    w.beforeSleep.push_back(&device_->sleepSoon);
  }
  return w;
}

Result<std::vector<std::unique_ptr<Connection>>> IbTransport::connect(const SetupContext& ctx,
                                                                      const std::vector<int>& peers) {
  rank_ = ctx.rank;
  store_ = &ctx.store;
  fullInfo_ = ctx.fullInfo;
  connectLater_ = ctx.connectLater;
  std::map<int, std::string> addresses;
  for (int p : peers) addresses[p] = ctx.peers[static_cast<std::size_t>(p)].transport(name())->address;
  return establish(peers, addresses, ctx.deadline, "");
}

Result<std::vector<std::unique_ptr<Connection>>> IbTransport::connectOnUse(const std::vector<int>& peers,
                                                                           const Deadline& deadline,
                                                                           const std::function<bool()>& stop) {
  if (!store_ || !fullInfo_) return Status::Internal("ib: connectOnUse before connect");
  std::map<int, std::string> addresses;
  for (int p : peers) {
    if (stop && stop()) return Status::Aborted("rank " + std::to_string(rank_) + " stopped connecting (ib, on first use)");
    auto info = fullInfo_(p, deadline);
    if (!info.ok()) return info.status().withContext("rank " + std::to_string(rank_) + " reading rank " + std::to_string(p) + "'s ib address");
    const TransportAddress* a = info->transport(name());
    if (!a || !a->usable) return Status::Internal("rank " + std::to_string(p) + " published no usable ib address");
    addresses[p] = a->address;
  }
  return establish(peers, addresses, deadline, " on first use");
}

Result<std::vector<std::unique_ptr<Connection>>> IbTransport::establish(const std::vector<int>& peers,
                                                                        const std::map<int, std::string>& addresses,
                                                                        const Deadline& deadline, const char* how) {
  std::vector<std::unique_ptr<Connection>> out;
  if (peers.empty()) return out;
  if (!device_) return Status::Internal("ib: connect before localAddress");
  const int channels = config_.nsocks;
  std::map<int, std::vector<std::unique_ptr<IbChannel>>> chans;
  for (int p : peers) {
    std::vector<IbEndpoint> mine;
    for (int c = 0; c < channels; ++c) {
      auto ch = IbChannel::create(device_, p, config_.buffSize);
      if (!ch.ok()) return ch.status();
      mine.push_back((*ch)->endpoint());
      chans[p].push_back(std::move(ch.value()));
    }
    Status s = store_->set("ib/" + std::to_string(rank_) + "/" + std::to_string(p), endpointsText(mine), deadline);
    if (!s.ok()) return s;
  }
  for (int p : peers) {
    auto text = store_->get("ib/" + std::to_string(p) + "/" + std::to_string(rank_), deadline);
    if (!text.ok()) return text.status().withContext("rank " + std::to_string(rank_) + " waiting for rank " + std::to_string(p) + "'s ib queue pairs" + how);
    std::vector<IbEndpoint> theirs = parseEndpoints(*text);
    auto addr = IbAddress::parse(addresses.at(p));
    if (!addr.ok()) return addr.status();
    if (theirs.size() != static_cast<std::size_t>(channels))
      return Status::InvalidUsage("rank " + std::to_string(p) + " offers " + std::to_string(theirs.size()) +
                                  " ib queue pairs, this rank " + std::to_string(channels) + " (BRAID_NSOCKS must match)");
    for (int c = 0; c < channels; ++c) {
      Status s = chans[p][static_cast<std::size_t>(c)]->connect(theirs[static_cast<std::size_t>(c)], addr->remote, config_);
      if (!s.ok()) return s;
    }
    out.push_back(std::make_unique<IbConnection>(p, std::move(chans[p])));
  }
  connected_ = true;
  const IbPort& port = device_->port;
  BRAID_LOG(kInfo, kNet, "ib: %zu peers%s over %s (%s, %s %u), %d queue pairs each, %zu KiB rings each way", peers.size(), how,
            port.name().c_str(), port.ethernet() ? gidTypeName(port.gidType) : "InfiniBand",
            port.ethernet() ? "GID index" : "LID", port.ethernet() ? static_cast<unsigned>(port.gidIndex) : port.attr.lid,
            channels, config_.buffSize >> 10);
  return out;
}

}  // namespace braid
