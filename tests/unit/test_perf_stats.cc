// braid perf's statistics (tools/perf_stats.h): -a's figure from every rank's time, -I's
// per-iteration statistics with -K samples skipped, the straggler, --split's colors and --compare.
#include "tools/perf_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace braid::tools {
namespace {

TEST(PerfStats, EveryTimeOfModeCombinesTheRanksAsNcclTestsDoes) {
  const std::vector<double> t = {4, 1, 7, 2};
  EXPECT_EQ(combineRanks(TimeOf::kRank0, t), 4);
  EXPECT_EQ(combineRanks(TimeOf::kAverage, t), 3.5);
  EXPECT_EQ(combineRanks(TimeOf::kMinimum, t), 1);
  EXPECT_EQ(combineRanks(TimeOf::kMaximum, t), 7);
  EXPECT_EQ(combineRanks(TimeOf::kMaximum, {}), 0);
}

TEST(PerfStats, PercentilesAreNearestRankSoEachIsAMeasuredTime) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(percentile(v, 0.99), 99);
  EXPECT_EQ(percentile(v, 0.50), 50);
  EXPECT_EQ(percentile(v, 1.0), 100);
  EXPECT_EQ(percentile({3, 5, 9}, 0.5), 5);
  EXPECT_EQ(percentile({3, 5, 9}, 0.99), 9);  // ceil(2.97) = 3rd
  EXPECT_EQ(percentile({8}, 0.01), 8);
}

TEST(PerfStats, IterationStatisticsLeaveOutTheSkippedSamples) {
  // The first two samples (a cold start) are skipped; the rest are 10, 10, 10, 30.
  const IterStats s = iterStats({500, 400, 10, 30, 10, 10}, 2);
  EXPECT_EQ(s.samples, 4u);
  EXPECT_EQ(s.min, 10);
  EXPECT_EQ(s.max, 30);
  EXPECT_EQ(s.p50, 10);
  EXPECT_EQ(s.p99, 30);
  EXPECT_DOUBLE_EQ(s.mean, 15);
  // Standard deviation sqrt((3*25 + 225)/4) = sqrt(75) over the mean 15.
  EXPECT_NEAR(s.cv, 8.660254037844386 / 15, 1e-12);
  const IterStats flat = iterStats({7, 7, 7}, 0);
  EXPECT_EQ(flat.cv, 0);
  EXPECT_EQ(iterStats({1, 2}, 2).samples, 0u);  // everything skipped: nothing to say
}

TEST(PerfStats, TheStragglerIsTheRankSlowestInMostSizesWithItsMedianRatio) {
  // Four ranks, five sizes: rank 2 is slowest in four (by 2x, 3x, 1.5x, 2x the median), rank 0 in one.
  const std::vector<std::vector<double>> sizes = {
      {10, 10, 20, 10}, {10, 10, 30, 10}, {50, 10, 12, 10}, {10, 10, 15, 10}, {20, 20, 40, 20}};
  const Straggler s = findStraggler(sizes);
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.slowestIn, 4);
  EXPECT_EQ(s.sizes, 5);
  // Its ratios over the median rank (nearest rank: the 2nd of 4): 2, 3, 1.5, 2; their median is 2.
  EXPECT_DOUBLE_EQ(s.ratio, 2.0);
  EXPECT_EQ(findStraggler({}).rank, -1);
  // A tie in wins goes to the lower rank.
  EXPECT_EQ(findStraggler({{1, 2}, {2, 1}}).rank, 0);
}

TEST(PerfStats, SplitColorsAreNcclTestsOperations) {
  Split s;
  std::string error;
  ASSERT_TRUE(parseSplit("MOD 2", &s, &error)) << error;
  EXPECT_EQ(s.colorOf(5), 1);
  EXPECT_EQ(s.text(), "MOD 2");
  ASSERT_TRUE(parseSplit("and 0x1", &s, &error)) << error;
  EXPECT_EQ(s.colorOf(6), 0);
  EXPECT_EQ(s.colorOf(7), 1);
  ASSERT_TRUE(parseSplit("DIV 4", &s, &error)) << error;
  EXPECT_EQ(s.colorOf(7), 1);
  EXPECT_EQ(s.colorOf(8), 2);
  ASSERT_TRUE(parseSplit("OR 1", &s, &error)) << error;
  EXPECT_EQ(s.colorOf(2), 3);
  ASSERT_TRUE(parseSplit("", &s, &error));
  EXPECT_EQ(s.op, Split::kNone);
  EXPECT_FALSE(parseSplit("MOD 0", &s, &error));
  EXPECT_NE(error.find("not 0"), std::string::npos) << error;
  EXPECT_FALSE(parseSplit("XOR 1", &s, &error));
  EXPECT_NE(error.find("XOR"), std::string::npos) << error;
  EXPECT_FALSE(parseSplit("MOD", &s, &error));
  EXPECT_FALSE(parseSplit("MOD 2 3", &s, &error));
}

TEST(PerfStats, TheFloorIsWhatMemoryAndLinksAllowEachCollective) {
  // One host, 4 ranks, each copying 10 GB/s with every rank at once (20 GB/s of reads and writes).
  EXPECT_DOUBLE_EQ(busbwFloor("allgather", 4, 1, 4, 10, 40, 0), 10);          // 2 bytes a byte
  EXPECT_DOUBLE_EQ(busbwFloor("alltoall", 4, 1, 4, 10, 40, 0), 10);
  EXPECT_DOUBLE_EQ(busbwFloor("reducescatter", 4, 1, 4, 10, 40, 0), 12);      // (5/4) / (3/4) = 5/3
  EXPECT_DOUBLE_EQ(busbwFloor("allreduce", 4, 1, 4, 10, 40, 0), 20.0 / (11.0 / 6));  // (11/4) / (3/2)
  EXPECT_DOUBLE_EQ(busbwFloor("broadcast", 4, 1, 4, 10, 40, 0), 40.0 / 3);    // 3 of 4 ranks copy
  EXPECT_DOUBLE_EQ(busbwFloor("reduce", 4, 1, 4, 10, 40, 0), 16);             // 5 arrays over 4 ranks
  EXPECT_DOUBLE_EQ(busbwFloor("sendrecv", 4, 1, 4, 10, 40, 0), 20);           // 2 receivers of 4
  EXPECT_DOUBLE_EQ(busbwFloor("sendrecv", 5, 1, 5, 10, 40, 0), 25);           // the 5th sits out
  EXPECT_EQ(busbwFloor("barrier", 4, 1, 4, 10, 40, 0), 0);
  EXPECT_EQ(busbwFloor("allreduce", 1, 1, 1, 10, 40, 0), 0);
  // The reduce rate does not move it (a fused n-input reduction does less than n-1 pairwise ones).
  EXPECT_DOUBLE_EQ(busbwFloor("allreduce", 4, 1, 4, 10, 1, 0), busbwFloor("allreduce", 4, 1, 4, 10, 400, 0));
  // 4 hosts x 2 ranks, links of 1 GB/s: a host takes in 3/4 of the array (all-gather), busbw's bytes
  // are 7/8 of it: busbw <= 7/6 GB/s; all-to-all: 2 ranks x 6 peers x 1/8 of the array in.
  EXPECT_DOUBLE_EQ(busbwFloor("allgather", 8, 4, 2, 10, 40, 1), 7.0 / 6);
  EXPECT_DOUBLE_EQ(busbwFloor("allreduce", 8, 4, 2, 10, 40, 1), 7.0 / 6);
  EXPECT_DOUBLE_EQ(busbwFloor("broadcast", 8, 4, 2, 10, 40, 1), 1);
  EXPECT_DOUBLE_EQ(busbwFloor("alltoall", 8, 4, 2, 10, 40, 1), (7.0 / 8) / (2.0 * 6 / 8));
  // Memory stays the limit where it is lower than the links'.
  EXPECT_DOUBLE_EQ(busbwFloor("allgather", 8, 4, 2, 0.5, 40, 1), 0.5);
}

std::string writeRun(const std::string& name, const std::string& rows) {
  const std::string path = "/tmp/braid-perf-stats-" + std::to_string(getpid()) + "-" + name + ".json";
  std::ofstream(path) << "{\"schema\": \"braid.perf/2\", \"collective\": \"allreduce\", \"nranks\": 4, "
                         "\"host\": \"h\", \"commit\": \"c\", \"rows\": [" + rows + "]}";
  return path;
}

std::string row(int size, double us, double bw) {
  return "{\"size\": " + std::to_string(size) + ", \"type\": \"float32\", \"redop\": \"sum\", \"root\": -1, "
         "\"out_of_place\": {\"time_us\": " + std::to_string(us) + ", \"busbw_gbps\": " + std::to_string(bw) + "}}";
}

TEST(PerfStats, CompareMatchesRowsAndGivesRatiosToTheFirstRun) {
  const std::string a = writeRun("a", row(8, 10, 1.0) + "," + row(1024, 20, 2.0));
  const std::string b = writeRun("b", row(1024, 10, 8.0) + "," + row(4096, 30, 3.0));
  std::vector<CompareRun> runs(2);
  std::string error;
  ASSERT_TRUE(loadCompareRun(a, &runs[0], &error)) << error;
  ASSERT_TRUE(loadCompareRun(b, &runs[1], &error)) << error;
  const std::string t = compareTable(runs);
  // 1024 B is in both: 8.0 over 2.0; 8 B and 4096 B are in one run each.
  EXPECT_NE(t.find("1024  float32    sum    -1     20.00     2.000     10.00     8.000   4.000"), std::string::npos) << t;
  EXPECT_NE(t.find("8  float32    sum    -1     10.00     1.000         -         -       -"), std::string::npos) << t;
  EXPECT_NE(t.find("busbw x4.000 (geometric mean over 1 sizes"), std::string::npos) << t;
  std::remove(a.c_str());
  std::remove(b.c_str());
  EXPECT_FALSE(loadCompareRun(a, &runs[0], &error));
  const std::string notPerf = writeRun("c", "");
  std::ofstream(notPerf) << "{\"schema\": \"braid.doctor/1\"}";
  EXPECT_FALSE(loadCompareRun(notPerf, &runs[0], &error));
  EXPECT_NE(error.find("not written by braid perf"), std::string::npos) << error;
  std::remove(notPerf.c_str());
}

}  // namespace
}  // namespace braid::tools
