// The flight recorder in one process (ring, JSON written and read back) and the verdict of
// `braid trace` on synthetic rank files: a rank that never entered, a missing rank, a mismatch,
// a cycle, a file from another communicator, and a corrupt file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/trace.h"
#include "tools/trace.h"

namespace braid {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string makeTempDir() {
  char tmpl[] = "/tmp/braid-trace-unit-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

void removeDir(const std::string& dir) { std::system(("rm -rf '" + dir + "'").c_str()); }

Fingerprint allreduce(std::uint64_t seq, std::uint64_t count = 1024) {
  Fingerprint f;
  f.kind = CollKind::kAllReduce;
  f.dtype = DataType::kFloat32;
  f.op = ReduceOp::kSum;
  f.count = count;
  f.seq = seq;
  return f;
}

TEST(FlightRecorder, KeepsTheLastNCallsOldestFirst) {
  FlightRecorder rec;
  rec.init(3, "", {1, 4, 42, "hostA", 0xabcdef});
  for (std::uint64_t s = 1; s <= 5; ++s) {
    rec.begin(allreduce(s));
    rec.end(Status::Ok());
  }
  auto e = rec.entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].fp.seq, 3u);
  EXPECT_EQ(e[2].fp.seq, 5u);
  for (auto& x : e) {
    EXPECT_EQ(x.state, TraceEntry::kDone);
    EXPECT_GE(x.endNs, x.startNs);
  }
  rec.begin(allreduce(6));
  rec.end(Status::Timeout("stuck"));  // no directory: nothing is written, but the state is kept
  EXPECT_FALSE(rec.written());
  EXPECT_EQ(rec.entries().back().state, TraceEntry::kFailed);
}

TEST(FlightRecorder, ZeroCapacityRecordsNothing) {
  FlightRecorder rec;
  rec.init(0, "/nonexistent-dir", {0, 2, 1, "h", 1});
  EXPECT_FALSE(rec.enabled());
  rec.begin(allreduce(1));
  rec.end(Status::Timeout("x"));
  EXPECT_TRUE(rec.entries().empty());
  EXPECT_FALSE(rec.written());
}

TEST(FlightRecorder, JsonRoundTripsThroughTheReader) {
  FlightRecorder rec;
  rec.init(10, "", {2, 4, 4242, "host \"q\"", 0x1234});
  rec.begin(allreduce(1));
  rec.end(Status::Ok());
  rec.begin(allreduce(2, 8));
  const std::string nasty = "timeout: \"quoted\" back\\slash\nnew line\ttab \x01 end";
  auto t = tools::parseRankTrace(rec.toJson(Status::Timeout(nasty)));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->rank, 2);
  EXPECT_EQ(t->nranks, 4);
  EXPECT_EQ(t->pid, 4242);
  EXPECT_EQ(t->host, "host \"q\"");
  EXPECT_EQ(t->comm, "0000000000001234");
  EXPECT_EQ(t->reason, "timeout");
  EXPECT_EQ(t->error, nasty);
  ASSERT_EQ(t->calls.size(), 2u);
  EXPECT_EQ(t->calls[0].state, "done");
  EXPECT_EQ(t->calls[1].state, "running");
  EXPECT_EQ(t->calls[1].describe(), "allreduce(count=8, float32, sum)");
  EXPECT_EQ(t->recorded, 2u);
}

TEST(FlightRecorder, WritesItsFileOnceOnFailure) {
  const std::string dir = makeTempDir() + "/sub";  // created on demand
  FlightRecorder rec;
  rec.init(4, dir, {3, 4, 1, "h", 7});
  rec.begin(allreduce(1));
  rec.end(Status::Ok());
  EXPECT_FALSE(rec.written());
  rec.begin(allreduce(2));
  rec.end(Status::RemoteError("first"));
  ASSERT_TRUE(rec.written());
  rec.failed(Status::Aborted("second"));  // the first failure stays in the file
  std::ifstream in(dir + "/braid-trace-rank3.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = tools::parseRankTrace(text);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->error, "first");
  EXPECT_EQ(t->calls.size(), 2u);
  removeDir(dir.substr(0, dir.size() - 4));
}

TEST(FlightRecorder, ConfigReadsBufferAndDir) {
  setenv("BRAID_TRACE_BUFFER", "7", 1);
  setenv("BRAID_TRACE_DIR", "/tmp/x", 1);
  auto c = Config::fromEnvironment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->traceBuffer, 7u);
  EXPECT_EQ(c->traceDir, "/tmp/x");
  setenv("BRAID_TRACE_BUFFER", "-1", 1);
  auto bad = Config::fromEnvironment();
  unsetenv("BRAID_TRACE_BUFFER");
  unsetenv("BRAID_TRACE_DIR");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "BRAID_TRACE_BUFFER"));
  auto d = Config::fromEnvironment();
  EXPECT_EQ(d->traceBuffer, 1000u);
  EXPECT_EQ(d->traceDir, "");
}

// Synthetic rank files for the verdict.
struct Call {
  std::uint64_t seq;
  std::string coll = "allreduce";
  std::string state = "done";
  int stuckPeer = -1;  // >= 0: a stuck record
  int step = 0;
  std::string dir = "recv";
  std::uint64_t count = 1024;
};

std::string rankFile(int rank, int nranks, const std::vector<Call>& calls, const std::string& comm = "00000000000000aa",
                     const std::string& error = "timeout") {
  std::string s = "{\"format\": \"braid-trace-1\", \"rank\": " + std::to_string(rank) +
                  ", \"nranks\": " + std::to_string(nranks) + ", \"pid\": 100, \"host\": \"h\", \"comm\": \"" + comm +
                  "\", \"reason\": \"timeout\", \"error\": \"" + error +
                  "\", \"steady_ns\": 5000000000, \"unix_ns\": 1, \"buffer\": 1000, \"recorded\": " +
                  std::to_string(calls.size()) + ", \"entries\": [";
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    s += std::string(i ? "," : "") + "{\"seq\": " + std::to_string(c.seq) + ", \"coll\": \"" + c.coll +
         "\", \"dtype\": \"float32\", \"op\": \"sum\", \"count\": " + std::to_string(c.count) +
         ", \"root\": -1, \"sender\": -1, \"state\": \"" + c.state +
         "\", \"start_ns\": 1000, \"end_ns\": 2000, \"peers\": [{\"peer\": 0, \"sent\": 4096, \"recv\": 0}]";
    if (c.stuckPeer >= 0)
      s += ", \"stuck\": {\"peer\": " + std::to_string(c.stuckPeer) + ", \"dir\": \"" + c.dir + "\", \"step\": " +
           std::to_string(c.step) + ", \"channel\": 0, \"header\": false, \"done\": 0, \"bytes\": 4096}";
    s += "}";
  }
  return s + "]}";
}

void writeFile(const std::string& dir, int rank, const std::string& text) {
  std::ofstream(dir + "/braid-trace-rank" + std::to_string(rank) + ".json") << text;
}

// Rank 2 went silent after #1041: rank 0 waits for rank 3, rank 3 for rank 2, rank 1 for rank 0.
void writeHungRing(const std::string& dir, bool withRank2 = true) {
  writeFile(dir, 0, rankFile(0, 4, {{1041}, {1042, "allreduce", "failed", 3, 2}}));
  writeFile(dir, 1, rankFile(1, 4, {{1041}, {1042, "allreduce", "failed", 0, 1}}));
  if (withRank2) writeFile(dir, 2, rankFile(2, 4, {{1040}, {1041}}, "00000000000000aa", "aborted"));
  writeFile(dir, 3, rankFile(3, 4, {{1041}, {1042, "allreduce", "failed", 2, 5}}));
}

TEST(TraceVerdict, NamesTheRankThatNeverEntered) {
  const std::string dir = makeTempDir();
  writeHungRing(dir);
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_TRUE(rep.anyFile);
  EXPECT_EQ(rep.verdict,
            "verdict: rank 3 is stuck in allreduce #1042 step 5 waiting for rank 2; rank 2 never entered #1042 (last "
            "completed #1041)");
  EXPECT_TRUE(contains(rep.details, "rank 3 (h, pid 100)")) << rep.details;
  EXPECT_TRUE(contains(rep.details, "stuck at step 5 receiving from rank 2")) << rep.details;
  removeDir(dir);
}

TEST(TraceVerdict, AMissingFileIsAKilledRank) {
  const std::string dir = makeTempDir();
  writeHungRing(dir, false);
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_EQ(rep.verdict, "verdict: rank 3 is stuck in allreduce #1042 step 5 waiting for rank 2; rank 2 wrote no trace (killed?)");
  EXPECT_TRUE(contains(rep.details, "rank 2 wrote no trace (killed?)\n")) << rep.details;
  removeDir(dir);
}

TEST(TraceVerdict, MismatchedCallsComeFirst) {
  const std::string dir = makeTempDir();
  writeFile(dir, 0, rankFile(0, 3, {{6}, {7, "allreduce", "failed", 1, 0}}));
  writeFile(dir, 1, rankFile(1, 3, {{6}, {7, "allgather", "failed", 2, 0, "recv", 256}}));
  writeFile(dir, 2, rankFile(2, 3, {{6}, {7, "allreduce", "failed", 1, 0}}));
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_EQ(rep.verdict,
            "verdict: the ranks called different collectives as #7: rank 1 called allgather(count=256, float32); "
            "ranks 0, 2 called allreduce(count=1024, float32, sum) (every rank must issue the same collectives in the "
            "same order)");
  removeDir(dir);
}

TEST(TraceVerdict, RanksWaitingForEachOtherAreACycle) {
  const std::string dir = makeTempDir();
  writeFile(dir, 0, rankFile(0, 2, {{3, "allreduce", "failed", 1, 0}}));
  writeFile(dir, 1, rankFile(1, 2, {{3, "allreduce", "failed", 0, 0}}));
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_TRUE(contains(rep.verdict, "verdict: ranks 0, 1 wait for each other in allreduce #3")) << rep.verdict;
  removeDir(dir);
}

TEST(TraceVerdict, StaleAndCorruptFilesAreSetAside) {
  const std::string dir = makeTempDir();
  writeHungRing(dir);
  writeFile(dir, 7, rankFile(1, 2, {{1}}, "00000000000000bb"));  // an older job's file
  std::ofstream(dir + "/braid-trace-rank9.json") << "{\"format\": \"braid-trace-1\", \"rank\": ";
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_TRUE(contains(rep.details, "is from another communicator (00000000000000bb, not 00000000000000aa): set aside"))
      << rep.details;
  EXPECT_TRUE(contains(rep.details, "braid-trace-rank9.json: unreadable: JSON: unexpected end")) << rep.details;
  EXPECT_TRUE(contains(rep.verdict, "rank 2 never entered #1042 (last completed #1041)")) << rep.verdict;
  removeDir(dir);
}

TEST(TraceVerdict, AnEmptyDirectoryHasNoVerdict) {
  const std::string dir = makeTempDir();
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_FALSE(rep.anyFile);
  EXPECT_TRUE(contains(rep.verdict, "no flight recorder files")) << rep.verdict;
  removeDir(dir);
}

TEST(TraceVerdict, NobodyStuckReportsTheError) {
  const std::string dir = makeTempDir();
  writeFile(dir, 0, rankFile(0, 2, {{1}, {2}}, "00000000000000aa", "rank 0 aborted the communicator"));
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_EQ(rep.verdict, "verdict: rank 1 wrote no trace (killed?); no rank that wrote one was stuck inside a collective");
  removeDir(dir);
}

TEST(TraceVerdict, APeerHeldUpInSendRecvIsNamed) {
  const std::string dir = makeTempDir();
  writeFile(dir, 0, rankFile(0, 2, {{4}, {5, "allreduce", "failed", 1, 0}}));
  Call p2p{2, "send/recv", "failed", 0, 0, "send"};
  writeFile(dir, 1, rankFile(1, 2, {{4}, p2p}));
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_EQ(rep.verdict,
            "verdict: rank 0 is stuck in allreduce #5 step 0 waiting for rank 1; rank 1 never entered #5 (last "
            "completed #4); it is stuck in send/recv #2 waiting for rank 0");
  removeDir(dir);
}

TEST(TraceVerdict, AnUnfinishedCallWithNothingPendingIsNamed) {
  const std::string dir = makeTempDir();
  writeFile(dir, 0, rankFile(0, 2, {{1}, {2, "allreduce", "failed"}}));
  writeFile(dir, 1, rankFile(1, 2, {{1}, {2}}));
  auto rep = tools::analyzeTraceDir(dir);
  EXPECT_EQ(rep.verdict, "verdict: allreduce #2 did not finish on rank 0 (no message was pending): timeout: timeout");
  removeDir(dir);
}

}  // namespace
}  // namespace braid
