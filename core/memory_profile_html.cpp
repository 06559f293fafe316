// memory.html: a self-contained page (no network, no external scripts or fonts) with, per device,
// an SVG stacked-area timeline of allocated bytes by category written here as static markup, the
// peak marked with its numbers, and a table of the tensors alive at the peak. Several devices (a
// split model): a table of every device's peak first, and the timelines share their time and
// byte axes, so their heights compare.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/html.h"
#include "core/memory_profiler.h"

namespace mg {
namespace {
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// At most ~max_points points, keeping in each bucket the one with the largest total (so the peak
// is always drawn).
std::vector<MemoryProfiler::Point> downsample(const std::vector<MemoryProfiler::Point>& tl, size_t max_points) {
  if (tl.size() <= max_points) return tl;
  std::vector<MemoryProfiler::Point> out;
  size_t per = (tl.size() + max_points - 1) / max_points;
  for (size_t i = 0; i < tl.size(); i += per) {
    size_t best = i;
    int64_t best_total = -1;
    for (size_t j = i; j < std::min(tl.size(), i + per); ++j) {
      int64_t t = 0;
      for (int64_t b : tl[j].bytes) t += b;
      if (t > best_total) best_total = t, best = j;
    }
    out.push_back(tl[best]);
  }
  out.push_back(tl.back());
  return out;
}

const char* phase_color(StepPhase p) {
  switch (p) {
    case StepPhase::forward: return "#9ecae1";
    case StepPhase::backward: return "#fdae6b";
    case StepPhase::optimizer: return "#a1d99b";
    default: return "#ddd";
  }
}

// y_top: the bytes at the top of the plot (the highest peak of all devices).
void device_section(std::ostringstream& h, const MemoryProfiler& p, const DeviceMemoryProfile& d, int64_t y_top) {
  const std::vector<MemoryProfiler::Point> tl = downsample(p.timeline(d.device), 1500);
  const double W = 960, H = 330, L = 70, R = 10, T = 20, B = 40;
  const std::vector<MemoryProfiler::PhaseSpan> spans = p.phase_spans(d.device);
  const std::vector<MemoryProfiler::PhaseSpan> all_spans = p.phase_spans();  // the devices' common time axis
  double t_end = std::max({1.0, tl.back().t_us, all_spans.empty() ? 0.0 : all_spans.back().end_us});
  for (const Device& other : p.devices()) {
    const std::vector<MemoryProfiler::Point> o = p.timeline(other);
    t_end = std::max(t_end, o.back().t_us);
  }
  double y_max = double(std::max<int64_t>(1, y_top));
  auto X = [&](double t) { return L + (W - L - R) * t / t_end; };
  auto Y = [&](double b) { return T + (H - T - B) * (1.0 - b / y_max); };
  h << "<section class=\"device\" data-device=\"" << html_escape(d.device.str()) << "\">\n<h2>" << html_escape(d.device.str())
    << "</h2>\n";
  h << "<p class=\"peak-summary\" data-peak-bytes=\"" << d.peak_bytes << "\">Peak allocated: <b>"
    << html_escape(format_bytes(d.peak_bytes)) << "</b> (<span class=\"peak-bytes\">" << d.peak_bytes
    << "</span> bytes) at " << num(d.peak_t_us / 1000.0) << " ms, in the <b class=\"peak-phase\">"
    << step_phase_name(d.peak_phase) << "</b> phase; " << d.num_events << " events.</p>\n";
  h << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 "
    << W << " " << H << "\" class=\"timeline\">\n";
  h << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  // Stacked areas, bottom category first; a step-shaped outline (bytes hold until the next event).
  std::vector<int64_t> lower(tl.size(), 0);
  for (MemoryCategory c : kAllMemoryCategories) {
    std::vector<int64_t> upper(tl.size());
    bool any = false;
    for (size_t i = 0; i < tl.size(); ++i) {
      upper[i] = lower[i] + tl[i].bytes[size_t(c)];
      any = any || tl[i].bytes[size_t(c)] != 0;
    }
    if (any) {
      std::ostringstream pts;
      for (size_t i = 0; i < tl.size(); ++i) {
        double x1 = X(tl[i].t_us), x2 = i + 1 < tl.size() ? X(tl[i + 1].t_us) : X(t_end);
        pts << num(x1) << "," << num(Y(double(upper[i]))) << " " << num(x2) << "," << num(Y(double(upper[i]))) << " ";
      }
      for (size_t k = tl.size(); k-- > 0;) {
        double x1 = X(tl[k].t_us), x2 = k + 1 < tl.size() ? X(tl[k + 1].t_us) : X(t_end);
        pts << num(x2) << "," << num(Y(double(lower[k]))) << " " << num(x1) << "," << num(Y(double(lower[k]))) << " ";
      }
      h << "<polygon class=\"area\" data-category=\"" << category_name(c) << "\" fill=\"" << category_color(c)
        << "\" fill-opacity=\"0.85\" points=\"" << pts.str() << "\"><title>" << category_name(c)
        << "</title></polygon>\n";
    }
    lower = upper;
  }
  // The step phases as a strip under the plot: forward, backward (where saved activations are
  // freed) and optimizer (where the gradients are dropped).
  for (const MemoryProfiler::PhaseSpan& sp : spans) {
    const double x1 = X(sp.begin_us), x2 = X(sp.end_us);
    h << "<rect class=\"phase\" data-phase=\"" << step_phase_name(sp.phase) << "\" x=\"" << num(x1) << "\" y=\""
      << H - B + 3 << "\" width=\"" << num(std::max(0.5, x2 - x1)) << "\" height=\"9\" fill=\"" << phase_color(sp.phase)
      << "\"><title>" << step_phase_name(sp.phase) << ": " << num(sp.begin_us / 1000.0) << " to "
      << num(sp.end_us / 1000.0) << " ms</title></rect>\n";
    if (x2 - x1 > 60)
      h << "<text x=\"" << num((x1 + x2) / 2) << "\" y=\"" << H - B + 21 << "\" text-anchor=\"middle\" font-size=\"11\">"
        << step_phase_name(sp.phase) << "</text>\n";
  }
  // Axes labels and the peak marker.
  h << "<text x=\"" << L - 4 << "\" y=\"" << T + 10 << "\" text-anchor=\"end\" font-size=\"11\">"
    << html_escape(format_bytes(int64_t(y_max))) << "</text>\n<text x=\"" << L - 4 << "\" y=\"" << H - B
    << "\" text-anchor=\"end\" font-size=\"11\">0</text>\n<text x=\"" << W - R << "\" y=\"" << H - 4
    << "\" text-anchor=\"end\" font-size=\"11\">" << num(t_end / 1000.0) << " ms</text>\n";
  double px = X(d.peak_t_us);
  h << "<line class=\"peak\" x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << T << "\" y2=\"" << H - B
    << "\" stroke=\"#000\" stroke-dasharray=\"4 3\"/>\n";
  h << "<text class=\"peak-label\" data-peak-bytes=\"" << d.peak_bytes << "\" x=\"" << num(std::min(px + 4, W - 260))
    << "\" y=\"" << T + 14 << "\" font-size=\"12\">peak " << html_escape(format_bytes(d.peak_bytes)) << " (" << d.peak_bytes
    << " B), " << step_phase_name(d.peak_phase) << "</text>\n</svg>\n";
  // Legend with the bytes per category at the peak and each category's own peak.
  h << "<table class=\"categories\"><tr><th></th><th>category</th><th>at peak</th><th>own peak</th></tr>\n";
  for (MemoryCategory c : kAllMemoryCategories)
    h << "<tr><td style=\"background:" << category_color(c) << ";width:1em\"></td><td>" << category_name(c)
      << "</td><td data-bytes=\"" << d.at_peak[size_t(c)] << "\">" << html_escape(format_bytes(d.at_peak[size_t(c)]))
      << "</td><td>" << html_escape(format_bytes(d.category_peak[size_t(c)])) << "</td></tr>\n";
  h << "</table>\n";
  // Tensors alive at the peak.
  const size_t shown = std::min<size_t>(d.live_at_peak.size(), 500);
  h << "<h3>Tensors alive at the peak (" << d.live_at_peak.size() << ")</h3>\n<table class=\"live\"><tr><th>size</th>"
       "<th>block</th><th>bytes</th><th>category</th><th>op</th><th>module or tensor</th><th>allocated in</th></tr>\n";
  for (size_t i = 0; i < shown; ++i) {
    const LiveTensor& t = d.live_at_peak[i];
    h << "<tr><td>" << html_escape(format_bytes(t.requested)) << "</td><td>" << html_escape(format_bytes(t.bytes))
      << "</td><td>" << t.bytes << "</td><td>" << category_name(t.category)
      << "</td><td>" << html_escape(t.op) << "</td><td>" << html_escape(t.module) << "</td><td>" << step_phase_name(t.phase)
      << "</td></tr>\n";
  }
  if (shown < d.live_at_peak.size()) {
    int64_t rest = 0;
    for (size_t i = shown; i < d.live_at_peak.size(); ++i) rest += d.live_at_peak[i].bytes;
    h << "<tr><td colspan=\"7\">and " << d.live_at_peak.size() - shown << " smaller ones, " << html_escape(format_bytes(rest))
      << "</td></tr>\n";
  }
  h << "</table>\n</section>\n";
}
}  // namespace

std::string memory_profile_html(const MemoryProfiler& p, const MemoryProfileSummary& s) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memgrad memory profile</title>\n"
       "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
       "td,th{border:1px solid #ddd;padding:2px 8px;font-size:13px;text-align:left}</style></head><body>\n"
       "<h1>Memory profile</h1>\n";
  int64_t y_top = 1;
  for (const DeviceMemoryProfile& d : s.devices) y_top = std::max(y_top, d.peak_bytes);
  if (s.devices.size() > 1) {  // a split model: every device's peak at a glance
    h << "<table class=\"devices\"><tr><th>device</th><th>peak allocated</th><th>phase</th>";
    for (MemoryCategory c : kAllMemoryCategories) h << "<th>" << category_name(c) << " at peak</th>";
    h << "</tr>\n";
    for (const DeviceMemoryProfile& d : s.devices) {
      h << "<tr data-device=\"" << html_escape(d.device.str()) << "\"><td>" << html_escape(d.device.str())
        << "</td><td data-bytes=\"" << d.peak_bytes << "\">" << html_escape(format_bytes(d.peak_bytes)) << "</td><td>"
        << step_phase_name(d.peak_phase) << "</td>";
      for (MemoryCategory c : kAllMemoryCategories) h << "<td>" << html_escape(format_bytes(d.at_peak[size_t(c)])) << "</td>";
      h << "</tr>\n";
    }
    h << "</table>\n<p>The timelines below share their time axis and their byte axis (0 to "
      << html_escape(format_bytes(y_top)) << ").</p>\n";
  }
  for (const DeviceMemoryProfile& d : s.devices) device_section(h, p, d, s.devices.size() > 1 ? y_top : d.peak_bytes);
  // Marks the page as rendered by a browser (the headless test reads these attributes back).
  h << "<script>document.body.setAttribute('data-rendered-areas',"
       "String(document.querySelectorAll('svg.timeline polygon.area').length));</script>\n</body></html>\n";
  return h.str();
}

}  // namespace mg
