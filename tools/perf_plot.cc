#include "tools/perf_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace braid::tools {
namespace {

std::string baseName(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string xmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

std::string sizeLabel(double bytes) {
  const auto b = static_cast<unsigned long long>(bytes);
  const char* units[] = {"G", "M", "K"};
  const int shifts[] = {30, 20, 10};
  for (int k = 0; k < 3; ++k)
    if (b >= (1ull << shifts[k]) && b % (1ull << shifts[k]) == 0)
      return std::to_string(b >> shifts[k]) + units[k];
  return std::to_string(b);
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                         "#7f7f7f", "#bcbd22"};

}  // namespace

bool loadPerfJson(const std::string& path, PlotSeries* out, std::string* error) {
  CompareRun run;
  if (!loadCompareRun(path, &run, error)) return false;
  out->points.clear();
  for (const CompareRow& r : run.rows)  // the first row's type and op
    if (r.type == run.rows.front().type && r.op == run.rows.front().op)
      out->points.emplace_back(static_cast<double>(r.size), r.busbw[0]);
  std::string settings = run.collective + ", " + std::to_string(run.nranks) + " ranks";
  if (!run.transport.empty() && run.transport != "auto") settings += ", " + run.transport;
  if (run.mem == "braid") settings += ", braidMemAlloc";
  out->label = baseName(path) + " (" + settings + ")";
  return true;
}

std::vector<PlotSeries> seriesOfRun(const std::vector<PerfRow>& rows, const std::string& settings) {
  PlotSeries outOfPlace{"this run, out of place (" + settings + ")", {}};
  PlotSeries inPlace{"this run, in place (" + settings + ")", {}};
  for (const PerfRow& r : rows) {
    if (r.type != rows.front().type || r.op != rows.front().op) continue;
    outOfPlace.points.emplace_back(static_cast<double>(r.bytes), r.out.busbw);
    inPlace.points.emplace_back(static_cast<double>(r.bytes), r.in.busbw);
  }
  return {outOfPlace, inPlace};
}

bool writePlotSvg(const std::string& path, const std::string& title, const std::vector<PlotSeries>& series,
                  std::string* error) {
  double xlo = 1e300, xhi = 0, ylo = 1e300, yhi = 0;
  for (const PlotSeries& s : series)
    for (auto [x, y] : s.points)
      if (x > 0 && y > 0) {
        xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
      }
  if (xhi <= 0) {
    *error = "nothing to plot: no row has a size and busbw above zero (a 1-rank run has busbw 0)";
    return false;
  }
  // x: powers of two around the sizes; y: whole decades around the bandwidths.
  const double lx0 = std::floor(std::log2(xlo)), lx1 = std::max(std::ceil(std::log2(xhi)), lx0 + 1);
  const double ly0 = std::floor(std::log10(ylo)), ly1 = std::max(std::ceil(std::log10(yhi)), ly0 + 1);
  const double ml = 70, mr = 20, mt = 40, pw = 640, ph = 380, mb = 56, legendRow = 20;
  const double width = ml + pw + mr;
  const double height = mt + ph + mb + legendRow * static_cast<double>(series.size()) + 10;
  auto px = [&](double x) { return ml + (std::log2(x) - lx0) / (lx1 - lx0) * pw; };
  auto py = [&](double y) { return mt + ph - (std::log10(y) - ly0) / (ly1 - ly0) * ph; };

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << num(ml + pw / 2) << "\" y=\"" << num(mt - 16) << "\" text-anchor=\"middle\" font-size=\"14\">"
    << xmlEscape(title) << "</text>\n";
  o << "<rect x=\"" << ml << "\" y=\"" << mt << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#444\"/>\n";
  // Y ticks: every decade, labeled; the in-between 2x and 5x as unlabeled grid lines.
  for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, e);
      if (std::log10(v) > ly1 + 1e-9) break;
      const std::string y = num(py(v));
      o << "<line x1=\"" << ml << "\" x2=\"" << ml + pw << "\" y1=\"" << y << "\" y2=\"" << y << "\" stroke=\""
        << (m == 1.0 ? "#ccc" : "#eee") << "\"/>\n";
      if (m == 1.0) {
        char label[32];
        std::snprintf(label, sizeof(label), "%g", v);
        o << "<text x=\"" << ml - 6 << "\" y=\"" << num(py(v) + 4) << "\" text-anchor=\"end\">" << label << "</text>\n";
      }
    }
  }
  // X ticks: powers of two, labeled as many as fit (at least 40 px apart).
  const double step = std::max(1.0, std::ceil(40.0 / (pw / (lx1 - lx0))));
  for (double e = lx0; e <= lx1 + 1e-9; e += step) {
    const double x = px(std::pow(2.0, e));
    o << "<line x1=\"" << num(x) << "\" x2=\"" << num(x) << "\" y1=\"" << mt << "\" y2=\"" << mt + ph
      << "\" stroke=\"#eee\"/>\n";
    o << "<text x=\"" << num(x) << "\" y=\"" << mt + ph + 16 << "\" text-anchor=\"middle\" font-size=\"10\">"
      << sizeLabel(std::pow(2.0, e)) << "</text>\n";
  }
  o << "<text x=\"" << num(ml + pw / 2) << "\" y=\"" << mt + ph + 38
    << "\" text-anchor=\"middle\">size (bytes, log scale)</text>\n";
  o << "<text transform=\"translate(" << ml - 48 << "," << num(mt + ph / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">busbw (GB/s, log scale)</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    const char* dash = i == 1 ? " stroke-dasharray=\"6,3\"" : "";  // this run's in-place column
    std::string pts;
    for (auto [x, y] : series[i].points)
      if (x > 0 && y > 0) {
        if (!pts.empty()) pts += ' ';
        pts += num(px(x)) + ',' + num(py(y));
      }
    o << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\"" << dash
      << "/>\n";
    const double ly = mt + ph + mb + legendRow * static_cast<double>(i) + 4;
    o << "<line x1=\"" << ml << "\" x2=\"" << ml + 28 << "\" y1=\"" << num(ly) << "\" y2=\"" << num(ly) << "\" stroke=\""
      << color << "\" stroke-width=\"3\"" << dash << "/>\n";
    o << "<text x=\"" << ml + 36 << "\" y=\"" << num(ly + 4) << "\">" << xmlEscape(series[i].label) << "</text>\n";
  }
  o << "</svg>\n";
  std::ofstream f(path);
  if (!(f << o.str()) || !(f.flush())) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace braid::tools
