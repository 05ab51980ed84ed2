// libFuzzer target for every text and binary parser a user or a peer can feed: unique-id strings,
// sizes with suffixes, Slurm hostlists, BRAID_* and launcher variables, interface lists, peer records, CPU lists,
// and message headers, and the flight recorder files that `braid trace` reads. Properties, not
// just "no crash": an id or a CPU list that parses prints back to itself.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/config.h"
#include "comm/fingerprint.h"
#include "base/hostlist.h"
#include "comm/bootstrap/init.h"
#include "tools/trace.h"
#include "topology/topology.h"
#include "base/socket.h"
#include "transport/transport.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string cText = text.c_str();  // up to the first NUL, as an environment value would be

  auto id = braid::uniqueIdFromString(text);
  if (id.ok()) {
    std::string printed = braid::uniqueIdToString(*id);
    auto again = braid::uniqueIdFromString(printed);
    if (!again.ok() || braid::uniqueIdToString(*again) != printed) std::abort();
  }
  (void)braid::parseSize(text);
  if (auto hosts = braid::expandHostlist(cText, 64); hosts.ok()) {
    if (hosts->empty() || hosts->size() > 64) std::abort();
    for (const std::string& h : *hosts)
      if (h.empty() || h.find_first_of("[],") != std::string::npos) std::abort();
  }
  (void)braid::PeerInfo::parse(text);
  if (auto cpus = braid::topology::parseCpuList(text); !cpus.empty()) {
    if (braid::topology::parseCpuList(braid::topology::cpuListText(cpus)) != cpus) std::abort();
  }
  (void)braid::net::interfaceMatches(cText, "eth0");
  if (auto trace = braid::tools::parseRankTrace(text); trace.ok()) {
    auto report = braid::tools::analyzeTraces({*trace, *trace}, {});
    if (report.verdict.rfind("verdict: ", 0) != 0) std::abort();
  }

  if (size >= sizeof(braid::WireHeader)) {
    braid::WireHeader h;
    std::memcpy(&h, data, sizeof(h));
    braid::Fingerprint f = braid::fingerprintOf(h);
    (void)f.describe();
    if (!f.sameCall(f)) std::abort();
  }

  if (!cText.empty()) {
    auto rows = braid::describeConfig();
    const char* name = rows[static_cast<std::size_t>(data[0]) % rows.size()].name;
    setenv(name, cText.c_str() + 1, 1);
    auto cfg = braid::Config::fromEnvironment();
    if (!cfg.ok() && cfg.status().message().find(name) == std::string::npos) std::abort();  // must name it
    unsetenv(name);
    setenv("RANK", cText.c_str(), 1);
    setenv("WORLD_SIZE", cText.c_str(), 1);
    (void)braid::readLaunchEnv();
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
  }
  return 0;
}
