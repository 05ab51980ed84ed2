#include "transport/shm/shm_transport.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "transport/shm/shm_channel.h"

namespace braid {
namespace {
std::size_t ctlBytes(int channels) { return (static_cast<std::size_t>(2 * channels) * sizeof(RingCtl) + 4095) & ~std::size_t{4095}; }
// The host's segment: a doorbell per rank, then a mailbox area per rank (mailbox.h).
std::size_t bellsBytes(int nranks) { return static_cast<std::size_t>(nranks) * (sizeof(Doorbell) + sizeof(MailboxArea)); }
std::size_t pairBytes(int channels, std::size_t cap) { return ctlBytes(channels) + 2 * static_cast<std::size_t>(channels) * cap; }
MailboxArea* mailboxAreas(void* bells, int nranks) {
  return reinterpret_cast<MailboxArea*>(static_cast<Doorbell*>(bells) + nranks);
}

// dir 0 carries lower -> higher rank, dir 1 the other way.
RingView ring(void* base, int channels, std::size_t cap, int dir, int c) {
  auto* ctl = static_cast<RingCtl*>(base) + (dir * channels + c);
  auto* data = static_cast<std::byte*>(base) + ctlBytes(channels) + static_cast<std::size_t>(dir * channels + c) * cap;
  return {ctl, data};
}
}  // namespace

Availability ShmTransport::probe() {
  if (config_.shmDisable) return {false, "disabled by BRAID_SHM_DISABLE=1"};
  struct stat st{};
  if (stat("/dev/shm", &st) != 0) return {false, "/dev/shm does not exist"};
  if (access("/dev/shm", W_OK) != 0) return {false, "/dev/shm is not writable"};
  return {true, ""};
}

Result<std::string> ShmTransport::localAddress(const std::string&) {
  struct stat st{};
  if (stat("/dev/shm", &st) != 0) return Status::SystemError("/dev/shm: " + std::string(std::strerror(errno)));
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

Availability ShmTransport::canReach(const PeerInfo& a, const PeerInfo& b) const {
  if (!a.sameHostAs(b))
    return {false, "rank " + std::to_string(b.rank) + " is on host " + b.host + ", rank " + std::to_string(a.rank) +
                       " on " + a.host};
  if (a.transport(name())->address != b.transport(name())->address)
    return {false, "ranks " + std::to_string(a.rank) + " and " + std::to_string(b.rank) +
                       " see different /dev/shm (separate containers or mount namespaces)"};
  return {true, ""};
}

LinkClass ShmTransport::linkClass(const PeerInfo&, const PeerInfo&) const {
  LinkClass l;  // a cache-line round trip plus the engine's bookkeeping; copies at memory speed
  l.latencyUs = 1;
  l.bytesPerUs = 6000;
  l.minPiece = 32u << 10;
  l.sameHost = true;
  l.sharedMemory = true;
  return l;
}

std::size_t ShmTransport::hostBytes(const Config& config, int nranks, int localRanks) {
  if (localRanks < 2) return 0;
  const std::size_t pairs = static_cast<std::size_t>(localRanks) * static_cast<std::size_t>(localRanks - 1) / 2;
  return bellsBytes(nranks) + pairs * pairBytes(config.nsocks, config.buffSize);
}

Result<std::vector<std::unique_ptr<Connection>>> ShmTransport::connect(const SetupContext& ctx,
                                                                       const std::vector<int>& peers) {
  std::vector<std::unique_ptr<Connection>> out;
  if (peers.empty()) return out;
  const int channels = ctx.config.nsocks;
  const std::size_t cap = ctx.config.buffSize;
  const std::string prefix = ShmSegment::nameFor(ctx.nonce);
  const std::size_t bellBytes = bellsBytes(ctx.nranks);
  const int leader = std::min(ctx.rank, *std::min_element(peers.begin(), peers.end()));

  // Create first (doorbells if this rank leads the host, then the pairs it owns), publish their
  // names, then open the others': nobody waits on a segment before creating its own, so setup
  // cannot deadlock.
  if (leader == ctx.rank) {
    // The host's first rank clears what ranks killed during an earlier setup left here.
    const ShmSegment::Leftovers gone = ShmSegment::removeLeftovers();
    if (gone.removed)
      BRAID_LOG(kWarn, kShm, "shm: removed %d segments (%llu KiB) from /dev/shm that processes %s left when they died",
                gone.removed, static_cast<unsigned long long>(gone.removedBytes >> 10), gone.removedPids.c_str());
    const std::string bellName = prefix + "-db" + std::to_string(leader);
    auto seg = ShmSegment::create(bellName, bellBytes);
    if (!seg.ok()) return seg.status();
    bells_ = *seg;
    for (int r = 0; r < ctx.nranks; ++r) new (static_cast<Doorbell*>(bells_->data()) + r) Doorbell();
    for (int r = 0; r < ctx.nranks; ++r) new (mailboxAreas(bells_->data(), ctx.nranks) + r) MailboxArea();
    created_.push_back(bells_);
    Status s = ctx.store.set("shm/db/" + std::to_string(leader), bellName, ctx.deadline);
    if (!s.ok()) return s;
  }
  std::vector<std::shared_ptr<ShmSegment>> pairs(peers.size());
  for (std::size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    if (p < ctx.rank) continue;
    std::string name = prefix + "-" + std::to_string(ctx.rank) + "-" + std::to_string(p);
    auto seg = ShmSegment::create(name, pairBytes(channels, cap));
    if (!seg.ok()) return seg.status();
    for (int dir = 0; dir < 2; ++dir)
      for (int c = 0; c < channels; ++c) new (ring((*seg)->data(), channels, cap, dir, c).ctl) RingCtl();
    pairs[i] = *seg;
    created_.push_back(*seg);
    Status s = ctx.store.set("shm/pair/" + std::to_string(ctx.rank) + "/" + std::to_string(p), name, ctx.deadline);
    if (!s.ok()) return s;
  }
  if (!bells_) {
    auto bellName = ctx.store.get("shm/db/" + std::to_string(leader), ctx.deadline);
    if (!bellName.ok()) return bellName.status();
    auto seg = ShmSegment::open(*bellName, bellBytes);
    if (!seg.ok()) return seg.status();
    bells_ = *seg;
  }
  auto* bells = static_cast<Doorbell*>(bells_->data());
  myBell_ = bells + ctx.rank;
  mailbox_ = std::make_unique<Mailbox>(mailboxAreas(bells_->data(), ctx.nranks), bells, ctx.rank, ctx.nranks);
  for (std::size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    if (p > ctx.rank) continue;
    auto name = ctx.store.get("shm/pair/" + std::to_string(p) + "/" + std::to_string(ctx.rank), ctx.deadline);
    if (!name.ok()) return name.status();
    auto seg = ShmSegment::open(*name, pairBytes(channels, cap));
    if (!seg.ok()) return seg.status();
    pairs[i] = *seg;
  }
  for (std::size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    int outDir = ctx.rank < p ? 0 : 1;
    std::vector<std::unique_ptr<ShmChannel>> chans;
    for (int c = 0; c < channels; ++c)
      chans.push_back(std::make_unique<ShmChannel>(ring(pairs[i]->data(), channels, cap, outDir, c),
                                                   ring(pairs[i]->data(), channels, cap, 1 - outDir, c), cap,
                                                   bells + p));
    out.push_back(std::make_unique<ShmConnection>(p, pairs[i], bells_, std::move(chans)));
  }
  BRAID_LOG(kInfo, kShm, "shm: %zu peers, %d channels of %zu KiB rings each way", peers.size(), channels, cap >> 10);
  return out;
}

void ShmTransport::setupDone() {
  for (auto& s : created_) s->unlink();
  created_.clear();
}

}  // namespace braid
