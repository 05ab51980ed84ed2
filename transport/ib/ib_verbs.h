// libibverbs, loaded at run time (dlopen of BRAID_IBVERBS_LIB), so that Braid builds with only the
// libibverbs-dev headers and runs on hosts without rdma-core. Each call is looked up by the version
// the library exports it under (dlvsym), as a program linked against it would bind. The data-path
// verbs (post_send, post_recv, poll_cq, req_notify_cq) are the header's inline calls through the
// context's ops, and need no symbol.
#pragma once
#include <infiniband/verbs.h>

#include <memory>
#include <string>

#include "braid/status.hpp"

namespace braid {

struct Verbs {
  ibv_device** (*getDeviceList)(int*);
  void (*freeDeviceList)(ibv_device**);
  const char* (*getDeviceName)(ibv_device*);
  ibv_context* (*openDevice)(ibv_device*);
  int (*closeDevice)(ibv_context*);
  int (*queryDevice)(ibv_context*, ibv_device_attr*);
  int (*queryPortSym)(ibv_context*, std::uint8_t, ibv_port_attr*);  // the exported fallback
  int (*queryGid)(ibv_context*, std::uint8_t, int, ibv_gid*);
  int (*queryGidEx)(ibv_context*, std::uint32_t, std::uint32_t, ibv_gid_entry*, std::uint32_t, std::size_t);  // may be null
  ibv_pd* (*allocPd)(ibv_context*);
  int (*deallocPd)(ibv_pd*);
  ibv_mr* (*regMr)(ibv_pd*, void*, std::size_t, int);
  int (*deregMr)(ibv_mr*);
  ibv_comp_channel* (*createCompChannel)(ibv_context*);
  int (*destroyCompChannel)(ibv_comp_channel*);
  ibv_cq* (*createCq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroyCq)(ibv_cq*);
  int (*getCqEvent)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ackCqEvents)(ibv_cq*, unsigned);
  ibv_qp* (*createQp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modifyQp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroyQp)(ibv_qp*);
  const char* (*wcStatusStr)(ibv_wc_status);

  // The port's attributes, through the context's extended op when it has one (as the header's
  // ibv_query_port does), else the exported call.
  int queryPort(ibv_context* ctx, std::uint8_t port, ibv_port_attr* attr) const;
  // The extended device attributes through the context's op; EOPNOTSUPP where it has none (the
  // caller then knows only ibv_query_device's, without on-demand paging).
  int queryDeviceEx(ibv_context* ctx, ibv_device_attr_ex* attr) const;

  // Loads `lib`; the error says what the loader said (a missing library, a missing symbol).
  static Result<std::shared_ptr<const Verbs>> load(const std::string& lib);

 private:
  void* handle_ = nullptr;
};

// A completion status in words ("transport retry counter exceeded") and its name (IBV_WC_...).
std::string wcStatusName(ibv_wc_status s);

}  // namespace braid
