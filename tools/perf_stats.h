// The statistics behind `braid perf`'s figures, as pure functions (tests/unit/test_perf_stats.cc):
// how one figure is made from every rank's time (-a), the per-iteration statistics (-I, -K), the
// straggler (the rank slowest in most sizes), nccl-tests' split groups (--split) and the
// comparison of runs (--compare).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace braid::tools {

// -a: which figure the time column shows, from each rank's mean time per call (nccl-tests' -a).
enum class TimeOf : int { kRank0 = 0, kAverage = 1, kMinimum = 2, kMaximum = 3 };
const char* timeOfName(TimeOf t);  // "rank 0's mean", "the average of the ranks' means", ...
double combineRanks(TimeOf t, const std::vector<double>& perRank);

// Statistics over one cell's iteration times (after the first `skip` are left out).
struct IterStats {
  std::size_t samples = 0;
  double min = 0, p50 = 0, p99 = 0, max = 0, mean = 0;
  double cv = 0;  // coefficient of variation: the standard deviation over the mean (0..)
};
// p50 and p99 are nearest-rank percentiles (the smallest sample with at least that share of the
// samples at or below it), so each is a time that was measured.
IterStats iterStats(const std::vector<double>& times, std::size_t skip);
double percentile(std::vector<double> sorted, double p);  // nearest rank; `sorted` ascending

// The straggler: per size, every rank's median time per call. The rank that was slowest in most
// sizes (the lower rank on a tie), and by how much: the median over those sizes of its median
// time over the median rank's median time.
struct Straggler {
  int rank = -1;        // -1: no sizes
  int slowestIn = 0;    // sizes in which it was the slowest
  int sizes = 0;
  double ratio = 1;     // its median over the median rank's, the median over the sizes it led
};
Straggler findStraggler(const std::vector<std::vector<double>>& perSizePerRankMedian);

// --floor: the busbw that the machine allows a collective of `n` ranks on `hosts` hosts (at most
// `perHost` ranks on one), whatever its algorithm, from rates measured with every rank at once: a
// rank's share of its host's memory copy rate `copyGBps` at the row's size (a copy reads and writes
// each byte: 2 x copyGBps of memory traffic), and `linkGBps`, the slowest stream between ranks of
// two hosts with both directions busy (0: one host). `reduceGBps` is reported beside it but not used:
// a kernel that combines n inputs in one pass does less than n-1 pairwise reductions, so only memory
// traffic bounds every algorithm. Memory: the bytes the ranks must at least read and write, per
// byte of busbw: all-gather and all-to-all copy what each rank receives (2); reduce-scatter reads
// each rank's slice of n inputs and writes it ((1 + 1/n) / ((n-1)/n)); all-reduce adds an
// all-gather to that ((3 - 1/n) / (2(n-1)/n)); reduce reads n arrays and writes one, over n ranks
// ((n+1)/n); broadcast copies the array on n-1 ranks (2(n-1)/n); sendrecv on the n/2 receivers.
// Links: a host must take in at least (H-1)/H of the array for all-gather (twice for all-reduce,
// as much out for reduce-scatter), all of it for broadcast and reduce, and k(n-k)/n of it for
// all-to-all (k ranks on it): busbw is at most the link's rate times busbw's bytes over those. 0
// where there is no floor (barrier, one rank).
double busbwFloor(const std::string& coll, int n, int hosts, int perHost, double copyGBps, double reduceGBps,
                  double linkGBps);

// --split "MOD 2" (nccl-tests' NCCL_TESTS_SPLIT): the ranks are split into parallel
// communicators by color = rank OP value; OP is AND, OR, MOD or DIV (also "%" and "/" for the
// last two). Empty `text`: no split.
struct Split {
  enum Op { kNone, kAnd, kOr, kMod, kDiv } op = kNone;
  long value = 0;
  int colorOf(int rank) const;
  std::string text() const;  // "MOD 2"
};
bool parseSplit(const std::string& text, Split* out, std::string* error);

// --compare: rows of earlier --json outputs, matched by size, type, redop and root.
struct CompareRow {
  std::size_t size = 0;
  std::string type, op;
  int root = -1;
  std::vector<double> busbw;  // out-of-place busbw of each run; < 0 where the run has no such row
  std::vector<double> timeUs;
};
struct CompareRun {
  std::string label;  // the file, with the run's ranks, host and commit
  std::string collective, transport, mem;  // the run's settings ("auto" where braid chose the transport)
  int nranks = 0;
  std::vector<CompareRow> rows;  // one entry in busbw/timeUs each
};
// Parses one braid perf --json file (braid.perf/1 or /2) into a run; false with `error` if not one.
bool loadCompareRun(const std::string& path, CompareRun* out, std::string* error);
// The side-by-side table: every row of any run, each run's time and busbw, and each later run's
// busbw over the first run's.
std::string compareTable(const std::vector<CompareRun>& runs);

}  // namespace braid::tools
