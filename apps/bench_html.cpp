// bench.html: a self-contained page (no scripts, no network) with one stacked bar per combination
// of its real peak (the allocator's peak allocated bytes, split into what each category held at
// that moment), a bar of its median step time beside it, both on labelled axes, and the table. The SVG is static markup, so any browser (or a test) can read it.
// With --devices, a thin bar per device under each row's bar: that device's own peak, same scale.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/bench.h"
#include "core/error.h"
#include "core/html.h"

namespace mg {

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

}  // namespace

void write_bench_html(const BenchResult& r, const std::string& path) {
  constexpr double kMemW = 420, kGap = 60, kTimeW = 260, kTop = 40, kDeviceH = 11;
  double label_w = 190;  // wide enough for the longest name (~7 px per character)
  for (const BenchRow& row : r.rows) label_w = std::max(label_w, 7.0 * double(row.name.size()) + 12);
  const double row_h = 26 + kDeviceH * double(r.device_columns.size());
  double max_mem = 1, max_ms = 1e-9;
  for (const BenchRow& row : r.rows) {
    max_mem = std::max(max_mem, double(row.memory.peak));
    max_ms = std::max(max_ms, row.ms_per_step);
  }
  const double width = label_w + kMemW + kGap + kTimeW + 80, height = kTop + row_h * double(r.rows.size()) + 80;
  const double time_x = label_w + kMemW + kGap;
  std::ostringstream svg;
  svg << "<svg id=\"bench-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<text x=\"" << label_w << "\" y=\"20\">peak allocated memory (MiB), split by what each category held at the peak</text>\n";
  svg << "<text x=\"" << time_x << "\" y=\"20\">median step time (ms)</text>\n";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const BenchRow& row = r.rows[i];
    const double y = kTop + row_h * double(i);
    svg << "<text x=\"4\" y=\"" << y + 15 << "\">" << html_escape(row.name) << "</text>\n";
    double x = label_w;
    for (MemoryCategory c : kAllMemoryCategories) {
      const double bytes = double(row.memory.at_peak[size_t(c)]);
      if (bytes <= 0) continue;
      const double w = kMemW * bytes / max_mem;
      svg << "<rect class=\"mem\" data-category=\"" << category_name(c) << "\" data-bytes=\"" << int64_t(bytes)
          << "\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"20\" fill=\""
          << category_color(c) << "\"><title>" << html_escape(row.name) << ": " << category_name(c) << " "
          << fmt("%.2f", bytes / 1048576.0) << " MiB</title></rect>\n";
      x += w;
    }
    svg << "<text class=\"peak\" data-bytes=\"" << row.memory.peak << "\" x=\"" << x + 4 << "\" y=\"" << y + 15 << "\">"
        << fmt("%.2f", double(row.memory.peak) / 1048576.0) << "</text>\n";
    for (size_t k = 0; k < r.device_columns.size(); ++k) {  // each device's own peak
      const DevicePeak* p = row.on(r.device_columns[k]);
      if (!p) continue;
      const double dy = y + 22 + kDeviceH * double(k), w = kMemW * double(p->peak) / max_mem;
      const std::string dev = html_escape(p->device.str());
      svg << "<rect class=\"device-peak\" data-device=\"" << dev << "\" data-bytes=\"" << p->peak << "\" x=\"" << label_w
          << "\" y=\"" << dy << "\" width=\"" << w << "\" height=\"" << kDeviceH - 3 << "\" fill=\"#bbb\"><title>"
          << html_escape(row.name) << ": " << dev << " peak " << fmt("%.2f", double(p->peak) / 1048576.0)
          << " MiB</title></rect>\n<text x=\"" << label_w + w + 4 << "\" y=\"" << dy + kDeviceH - 3
          << "\" font-size=\"9\">" << dev << " " << fmt("%.2f", double(p->peak) / 1048576.0) << "</text>\n";
    }
    const double tw = kTimeW * row.ms_per_step / max_ms;
    svg << "<rect class=\"time\" data-ms=\"" << fmt("%.3f", row.ms_per_step) << "\" x=\"" << time_x << "\" y=\"" << y
        << "\" width=\"" << tw << "\" height=\"20\" fill=\"#888\"/>\n";
    svg << "<text x=\"" << time_x + tw + 4 << "\" y=\"" << y + 15 << "\">" << fmt("%.1f", row.ms_per_step)
        << "</text>\n";
  }
  // Axes: MiB under the memory bars, ms under the time bars, ticks at quarters of the largest.
  const double axis_y = kTop + row_h * double(r.rows.size()) + 6;
  auto axis = [&](double x0, double w, double max_value, const char* label) {
    svg << "<line x1=\"" << x0 << "\" y1=\"" << axis_y << "\" x2=\"" << x0 + w << "\" y2=\"" << axis_y
        << "\" stroke=\"#333\"/>\n";
    for (int q = 0; q <= 4; ++q) {
      const double tx = x0 + w * q / 4.0;
      svg << "<line x1=\"" << tx << "\" y1=\"" << axis_y << "\" x2=\"" << tx << "\" y2=\"" << axis_y + 5
          << "\" stroke=\"#333\"/><text x=\"" << tx - 10 << "\" y=\"" << axis_y + 18 << "\">"
          << fmt("%.0f", max_value * q / 4.0) << "</text>\n";
    }
    svg << "<text class=\"axis-label\" x=\"" << x0 + w / 2 - 60 << "\" y=\"" << axis_y + 32 << "\">" << label
        << "</text>\n";
  };
  axis(label_w, kMemW, max_mem / 1048576.0, "peak allocated (MiB)");
  axis(time_x, kTimeW, max_ms, "median step time (ms)");
  double lx = label_w;
  for (MemoryCategory c : kAllMemoryCategories) {
    svg << "<rect x=\"" << lx << "\" y=\"" << axis_y + 44 << "\" width=\"10\" height=\"10\" fill=\"" << category_color(c)
        << "\"/><text x=\"" << lx + 13 << "\" y=\"" << axis_y + 53 << "\">" << category_name(c) << "</text>\n";
    lx += 30 + 7.0 * double(category_name(c).size());  // ~7 px per character at this font size
  }
  svg << "</svg>\n";

  std::ofstream f(path + ".tmp");
  MG_CHECK(f.good(), "bench: cannot write '", path, "'");
  f << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>memgrad bench: " << html_escape(r.model)
    << "</title>\n<style>body{font-family:sans-serif;margin:20px}pre{font-size:12px}</style></head><body>\n"
    << "<h1>memgrad bench: " << html_escape(r.model) << "</h1>\n<p>batch " << r.batch << ", " << r.steps
    << " steps per combination, each in a fresh state on the same data; memory is the allocator's peak allocated "
       "bytes over the steps after the first.</p>\n"
    << svg.str() << "<pre id=\"bench-table\">" << html_escape(r.table()) << "</pre>\n</body></html>\n";
  f.close();
  MG_CHECK(f.good(), "bench: writing '", path, "' failed");
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace mg
