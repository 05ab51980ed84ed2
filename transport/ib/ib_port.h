// Which InfiniBand device and port a rank uses: BRAID_IB_HCA's filter (NCCL's syntax), ACTIVE
// ports only, the GID for RoCE, and the device nearest this rank's CPUs.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "transport/ib/ib_verbs.h"

namespace braid {

// BRAID_IB_HCA: "mlx5_0:1,mlx5_1" (names by prefix, ports optional), "^mlx5_1" (all but these),
// "=mlx5_0" (names exactly). Empty: everything.
struct HcaFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::pair<std::string, int>> items;  // name, port (-1: any)

  static HcaFilter parse(const std::string& text);
  bool matches(const std::string& device, int port) const;
};

struct IbPort {
  std::string device;
  int port = 0;
  ibv_port_attr attr{};
  int gidIndex = 0;
  ibv_gid gid{};
  int gidType = 0;  // enum ibv_gid_type
  int numa = -1;    // the device's NUMA node, -1 when unknown
  std::string name() const { return device + ":" + std::to_string(port); }
  bool ethernet() const { return attr.link_layer == IBV_LINK_LAYER_ETHERNET; }
};

// Every ACTIVE port BRAID_IB_HCA allows, nearest first to the CPUs this process may run on, or
// the reason there is none, in words a person can act on.
struct PortSearch {
  std::vector<IbPort> ports;
  std::string whyNone;
  std::vector<IbPort> seen;  // every port of every device, whatever its state or the filter (braid doctor)
};
// "ACTIVE", "DOWN", ... as ibv_devinfo writes a port's state.
const char* stateName(ibv_port_state s);

PortSearch findPorts(const Verbs& v, const Config& config);

// The GID index to use on a RoCE port: BRAID_IB_GID_INDEX, else RoCE v2 with an IPv4 address,
// then any RoCE v2, then v1. -1 if the port has no usable GID.
int chooseGidIndex(const Verbs& v, ibv_context* ctx, const IbPort& port, int wanted, ibv_gid* gid, int* type);

}  // namespace braid
