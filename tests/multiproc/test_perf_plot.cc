// `braid perf --plot`: run braid perf under braid run, once with --json, then with --plot and two
// --plot-with files, and read the SVG back: it must be well formed (every tag closed, in order),
// carry one polyline per run with one point per size, and a legend entry per run.
// The braid binary comes from --braid=PATH (the build passes it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::string gBraid;

std::string tempDir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/braid-perf-plot-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    return std::string(d ? d : "/tmp");
  }();
  return dir;
}

int runPerf(const std::string& ranks, const std::string& extra) {
  const std::string cmd = gBraid + " run -n " + ranks + " -- " + gBraid +
                          " perf allreduce -b 8 -e 32K -f 4 -n 2 -w 1 -c 1 " + extra + " > " + tempDir() +
                          "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Well formed enough for a browser: an XML declaration or <svg> first, every element closed in
// order (or self-closed), quotes balanced inside tags, and nothing but whitespace after </svg>.
// Returns an empty string when well formed, otherwise what is wrong.
std::string checkXml(const std::string& doc) {
  std::vector<std::string> open;
  std::size_t i = 0;
  bool sawRoot = false;
  while ((i = doc.find('<', i)) != std::string::npos) {
    const std::size_t end = doc.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    const std::string tag = doc.substr(i + 1, end - i - 1);
    const std::string text = doc.substr(i, end - i + 1);
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "unbalanced quotes in " + text;
    if (tag.find('<') != std::string::npos) return "'<' inside " + text;
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?') continue;  // the declaration
    std::string name = tag.substr(tag[0] == '/' ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \n\t/"));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
      if (open.empty() && doc.find_first_not_of(" \n\t\r", i) != std::string::npos) return "text after the root";
    } else {
      if (open.empty() && sawRoot) return "a second root element";
      if (open.empty()) {
        sawRoot = true;
        if (name != "svg") return "root is <" + name + ">, not <svg>";
      }
      if (tag.back() != '/') open.push_back(name);
    }
  }
  if (!sawRoot) return "no <svg> element";
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

// The point lists of every <polyline>, in order.
std::vector<std::vector<std::string>> polylines(const std::string& doc) {
  std::vector<std::vector<std::string>> out;
  for (std::size_t i = 0; (i = doc.find("<polyline", i)) != std::string::npos; ++i) {
    const std::size_t p = doc.find("points=\"", i) + 8, q = doc.find('"', p);
    std::istringstream pts(doc.substr(p, q - p));
    std::vector<std::string> points;
    for (std::string pt; pts >> pt;) points.push_back(pt);
    out.push_back(points);
  }
  return out;
}

TEST(PerfPlot, CheckerRejectsBrokenXml) {
  EXPECT_EQ(checkXml("<svg><line/></svg>\n"), "");
  EXPECT_NE(checkXml("<svg><g></svg>"), "");
  EXPECT_NE(checkXml("<svg><line x=\"1/></svg>"), "");
  EXPECT_NE(checkXml("<svg></svg><svg></svg>"), "");
}

TEST(PerfPlot, OnePolylinePerRunWithOnePointPerSize) {
  const std::string dir = tempDir();
  // Two earlier runs: 2 and 3 ranks (8 B to 32 KiB by 4: 7 sizes each).
  ASSERT_EQ(runPerf("2", "--json " + dir + "/two.json"), 0) << readFile(dir + "/out.txt");
  ASSERT_EQ(runPerf("3", "--json " + dir + "/three.json"), 0) << readFile(dir + "/out.txt");
  const std::string svg = dir + "/plot.svg";
  std::remove(svg.c_str());
  ASSERT_EQ(runPerf("2", "--plot " + svg + " --plot-with " + dir + "/two.json --plot-with " + dir + "/three.json"), 0)
      << readFile(dir + "/out.txt");
  const std::string doc = readFile(svg);
  ASSERT_FALSE(doc.empty()) << "no SVG written";
  EXPECT_EQ(checkXml(doc), "") << doc;
  const auto lines = polylines(doc);
  ASSERT_EQ(lines.size(), 4u) << "this run's two columns and the two earlier runs";
  for (const auto& pts : lines) {
    EXPECT_EQ(pts.size(), 7u);
    for (const std::string& pt : pts) {
      const std::size_t comma = pt.find(',');
      ASSERT_NE(comma, std::string::npos) << pt;
      EXPECT_GT(std::atof(pt.substr(0, comma).c_str()), 0.0) << pt;
      EXPECT_GT(std::atof(pt.substr(comma + 1).c_str()), 0.0) << pt;
    }
  }
  // The legend names every run; the earlier ones by file name.
  EXPECT_NE(doc.find("this run, out of place"), std::string::npos);
  EXPECT_NE(doc.find("this run, in place"), std::string::npos);
  EXPECT_NE(doc.find("two.json (allreduce, 2 ranks)"), std::string::npos);
  EXPECT_NE(doc.find("three.json (allreduce, 3 ranks)"), std::string::npos);
  // Labeled axes.
  EXPECT_NE(doc.find("size (bytes, log scale)"), std::string::npos);
  EXPECT_NE(doc.find("busbw (GB/s, log scale)"), std::string::npos);
  EXPECT_NE(doc.find(">32K</text>"), std::string::npos);
}

TEST(PerfPlot, BadPlotWithFileFailsTheRun) {
  const std::string dir = tempDir();
  {
    std::ofstream f(dir + "/bad.json");
    f << "{\"rows\": [ {\"size\": 8} ]";
  }
  EXPECT_NE(runPerf("2", "--plot " + dir + "/bad.svg --plot-with " + dir + "/bad.json"), 0);
  EXPECT_NE(readFile(dir + "/out.txt").find("--plot-with"), std::string::npos) << readFile(dir + "/out.txt");
  EXPECT_NE(runPerf("2", "--plot-with " + dir + "/two.json"), 0) << "--plot-with without --plot";
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.substr(0, 8) == "--braid=") gBraid = std::string(arg.substr(8));
  }
  if (gBraid.empty()) {
    std::fprintf(stderr, "usage: test_perf_plot --braid=PATH\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
