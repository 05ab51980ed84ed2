#include "comm/live.h"

#include <cstdio>

namespace braid {

void LiveState::begin(const Fingerprint& fp, std::int64_t nowNs) {
  const std::uint32_t v = version_.load(std::memory_order_relaxed);
  version_.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  kind_.store(static_cast<std::uint8_t>(fp.kind), std::memory_order_relaxed);
  dtype_.store(static_cast<std::uint8_t>(fp.dtype), std::memory_order_relaxed);
  op_.store(static_cast<std::uint8_t>(fp.op), std::memory_order_relaxed);
  count_.store(fp.count, std::memory_order_relaxed);
  seq_.store(fp.seq, std::memory_order_relaxed);
  root_.store(fp.root, std::memory_order_relaxed);
  sender_.store(fp.sender, std::memory_order_relaxed);
  startNs_.store(nowNs, std::memory_order_relaxed);
  progress_.waitPeer.store(-1, std::memory_order_relaxed);
  inCall_.store(true, std::memory_order_relaxed);
  version_.store(v + 2, std::memory_order_release);
}

void LiveState::end(bool ok) {
  const std::uint32_t v = version_.load(std::memory_order_relaxed);
  version_.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  inCall_.store(false, std::memory_order_relaxed);
  if (static_cast<CollKind>(kind_.load(std::memory_order_relaxed)) != CollKind::kSendRecv && ok)
    collectivesDone_.store(seq_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  calls_.store(calls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (!ok) failed_.store(failed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  version_.store(v + 2, std::memory_order_release);
}

std::string LiveState::record(int rank, int nranks, const std::string& host, long pid, std::int64_t nowNs) const {
  Fingerprint fp;
  bool in = false;
  std::int64_t start = 0;
  std::uint64_t done = 0, calls = 0, failed = 0;
  for (int attempt = 0; attempt < 1000; ++attempt) {  // a seqlock read: retried while a call starts or ends
    const std::uint32_t v = version_.load(std::memory_order_acquire);
    if (v & 1) continue;
    in = inCall_.load(std::memory_order_relaxed);
    fp.kind = static_cast<CollKind>(kind_.load(std::memory_order_relaxed));
    fp.dtype = static_cast<DataType>(dtype_.load(std::memory_order_relaxed));
    fp.op = static_cast<ReduceOp>(op_.load(std::memory_order_relaxed));
    fp.count = count_.load(std::memory_order_relaxed);
    fp.seq = seq_.load(std::memory_order_relaxed);
    fp.root = root_.load(std::memory_order_relaxed);
    fp.sender = sender_.load(std::memory_order_relaxed);
    start = startNs_.load(std::memory_order_relaxed);
    done = collectivesDone_.load(std::memory_order_relaxed);
    calls = calls_.load(std::memory_order_relaxed);
    failed = failed_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version_.load(std::memory_order_relaxed) == v) break;
  }
  const bool any = fp.seq != 0 || in;
  std::string call = any ? fp.describe() : "";
  std::string quoted;  // (describe() writes no quotes or backslashes; keep the JSON valid regardless)
  for (char c : call) quoted += c == '"' || c == '\\' ? '_' : c;
  std::string h;
  for (char c : host) h += c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 ? '_' : c;
  char buf[768];
  std::snprintf(buf, sizeof(buf),
                "{\"rank\": %d, \"nranks\": %d, \"host\": \"%s\", \"pid\": %ld, \"in_call\": %s, \"call\": \"%s\", "
                "\"kind\": \"%s\", \"seq\": %llu, \"for_ms\": %.1f, \"bytes\": %llu, \"wait_peer\": %d, \"wait_channel\": %d, "
                "\"wait_step\": %u, \"wait_sending\": %s, \"last_collective\": %llu, \"calls\": %llu, \"failed\": %llu}",
                rank, nranks, h.c_str(), pid, in ? "true" : "false", quoted.c_str(), any ? collName(fp.kind) : "",
                static_cast<unsigned long long>(fp.seq), in ? static_cast<double>(nowNs - start) / 1e6 : 0.0,
                static_cast<unsigned long long>(progress_.bytes.load(std::memory_order_relaxed)),
                in ? progress_.waitPeer.load(std::memory_order_relaxed) : -1, progress_.waitChannel.load(std::memory_order_relaxed),
                progress_.waitStep.load(std::memory_order_relaxed), progress_.waitSending.load(std::memory_order_relaxed) ? "true" : "false",
                static_cast<unsigned long long>(done), static_cast<unsigned long long>(calls), static_cast<unsigned long long>(failed));
  return buf;
}

}  // namespace braid
