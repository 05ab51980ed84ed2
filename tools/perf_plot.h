// `braid perf --plot FILE.svg`: bus bandwidth against size on log-log axes, one line per run (this
// run's out-of-place and in-place columns, and the out-of-place column of each earlier `--json`
// output given with --plot-with). A small SVG writer of our own; no plotting library.
#pragma once
#include <string>
#include <vector>

#include "tools/perf_report.h"

namespace braid::tools {

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (size in bytes, busbw in GB/s)
};

// Reads the rows of a `braid perf --json` file into one series (the out-of-place busbw of the
// rows whose type and op are the first row's). The label is the file's name followed by the
// run's settings. Returns false and sets *error if the file cannot be read or is not such a file.
bool loadPerfJson(const std::string& path, PlotSeries* out, std::string* error);

// The series of this run: out of place and in place, from the rows whose type and op are the
// first row's. `settings` names the run ("allreduce, 4 ranks").
std::vector<PlotSeries> seriesOfRun(const std::vector<PerfRow>& rows, const std::string& settings);

// Points with a size or busbw at or below zero cannot sit on log axes and are left out (a 1-rank
// run has busbw 0). Returns false if the file cannot be written or no series has a point.
bool writePlotSvg(const std::string& path, const std::string& title, const std::vector<PlotSeries>& series,
                  std::string* error);

}  // namespace braid::tools
