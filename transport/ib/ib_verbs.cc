#include "transport/ib/ib_verbs.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>

namespace braid {
namespace {

template <typename F>
bool bind(void* h, F& fn, const char* name, const char* version, std::string* missing) {
  fn = reinterpret_cast<F>(dlvsym(h, name, version));
  if (!fn && missing->empty()) *missing = std::string(name) + "@" + version;
  return fn != nullptr;
}

}  // namespace

int Verbs::queryPort(ibv_context* ctx, std::uint8_t port, ibv_port_attr* attr) const {
  std::memset(attr, 0, sizeof(*attr));
  // verbs_get_ctx_op's test, written out (the header's macro is a GNU statement expression).
  verbs_context* v = verbs_get_ctx(ctx);
  if (v && v->sz >= sizeof(*v) - offsetof(verbs_context, query_port) && v->query_port)
    return v->query_port(ctx, port, attr, sizeof(*attr));
  return queryPortSym(ctx, port, attr);
}

int Verbs::queryDeviceEx(ibv_context* ctx, ibv_device_attr_ex* attr) const {
  std::memset(attr, 0, sizeof(*attr));
  verbs_context* v = verbs_get_ctx(ctx);
  if (v && v->sz >= sizeof(*v) - offsetof(verbs_context, query_device_ex) && v->query_device_ex)
    return v->query_device_ex(ctx, nullptr, attr, sizeof(*attr));
  return EOPNOTSUPP;
}

Result<std::shared_ptr<const Verbs>> Verbs::load(const std::string& lib) {
  dlerror();
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return Status::SystemError("cannot load " + lib + ": " + (e ? e : "unknown error") +
                               " (install rdma-core's libibverbs1, or point BRAID_IBVERBS_LIB at it)");
  }
  auto v = std::make_shared<Verbs>();
  v->handle_ = h;
  std::string missing;
  const char* v11 = "IBVERBS_1.1";
  bind(h, v->getDeviceList, "ibv_get_device_list", v11, &missing);
  bind(h, v->freeDeviceList, "ibv_free_device_list", v11, &missing);
  bind(h, v->getDeviceName, "ibv_get_device_name", v11, &missing);
  bind(h, v->openDevice, "ibv_open_device", v11, &missing);
  bind(h, v->closeDevice, "ibv_close_device", v11, &missing);
  bind(h, v->queryDevice, "ibv_query_device", v11, &missing);
  bind(h, v->queryPortSym, "ibv_query_port", v11, &missing);
  bind(h, v->queryGid, "ibv_query_gid", v11, &missing);
  bind(h, v->allocPd, "ibv_alloc_pd", v11, &missing);
  bind(h, v->deallocPd, "ibv_dealloc_pd", v11, &missing);
  bind(h, v->regMr, "ibv_reg_mr", v11, &missing);
  bind(h, v->deregMr, "ibv_dereg_mr", v11, &missing);
  bind(h, v->createCompChannel, "ibv_create_comp_channel", "IBVERBS_1.0", &missing);
  bind(h, v->destroyCompChannel, "ibv_destroy_comp_channel", "IBVERBS_1.0", &missing);
  bind(h, v->createCq, "ibv_create_cq", v11, &missing);
  bind(h, v->destroyCq, "ibv_destroy_cq", v11, &missing);
  bind(h, v->getCqEvent, "ibv_get_cq_event", v11, &missing);
  bind(h, v->ackCqEvents, "ibv_ack_cq_events", v11, &missing);
  bind(h, v->createQp, "ibv_create_qp", v11, &missing);
  bind(h, v->modifyQp, "ibv_modify_qp", v11, &missing);
  bind(h, v->destroyQp, "ibv_destroy_qp", v11, &missing);
  bind(h, v->wcStatusStr, "ibv_wc_status_str", v11, &missing);
  if (!missing.empty()) {
    dlclose(h);
    return Status::SystemError(lib + " lacks " + missing + ": not an rdma-core libibverbs (BRAID_IBVERBS_LIB)");
  }
  std::string optional;
  bind(h, v->queryGidEx, "_ibv_query_gid_ex", "IBVERBS_1.11", &optional);  // rdma-core 32 and later
  // The library stays loaded for the process's life: contexts and their ops live in it.
  return std::shared_ptr<const Verbs>(std::move(v));
}

std::string wcStatusName(ibv_wc_status s) {
  static const char* const kNames[] = {
      "IBV_WC_SUCCESS",        "IBV_WC_LOC_LEN_ERR",        "IBV_WC_LOC_QP_OP_ERR",   "IBV_WC_LOC_EEC_OP_ERR",
      "IBV_WC_LOC_PROT_ERR",   "IBV_WC_WR_FLUSH_ERR",       "IBV_WC_MW_BIND_ERR",     "IBV_WC_BAD_RESP_ERR",
      "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR",    "IBV_WC_REM_ACCESS_ERR",  "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",  "IBV_WC_RNR_RETRY_EXC_ERR",  "IBV_WC_LOC_RDD_VIOL_ERR", "IBV_WC_REM_INV_RD_REQ_ERR",
      "IBV_WC_REM_ABORT_ERR",  "IBV_WC_INV_EECN_ERR",       "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
      "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR"};
  auto i = static_cast<std::size_t>(s);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "IBV_WC_" + std::to_string(i);
}

}  // namespace braid
