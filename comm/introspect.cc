#include "comm/introspect.h"

#include "comm/c_handle.h"
#include "comm/communicator.h"

namespace braid {

int CommView::rank() const { return comm_->impl->rank(); }
int CommView::nranks() const { return comm_->impl->nranks(); }

PeerChoice CommView::choiceBetween(int a, int b) const {
  const Selection s = comm_->impl->choiceBetween(a, b);
  return {s.transport, s.skipped};
}

std::string CommView::transportTo(int peer) const { return comm_->impl->transportOf(peer); }
bool CommView::connected(int peer) const { return comm_->impl->connectedTo(peer); }
std::string CommView::statusRecord() const { return comm_->impl->statusRecord(); }
const Config& CommView::config() const { return comm_->impl->config(); }
std::uint64_t CommView::cudaIpcCalls() const { return comm_->impl->cudaIpcCalls(); }
std::uint64_t CommView::stallNs() const { return comm_->impl->stallNs(); }

Result<braidComm_t> createComm(const InitParams& params) {
  auto created = Comm::create(params);
  if (!created.ok()) return created.status();
  return new braidComm{*created};
}

}  // namespace braid
