// Progress bar and periodic progress lines (see progress.h).
#include "apps/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>

#include "core/allocator.h"

namespace mg {

namespace {

constexpr double kRedrawSeconds = 0.1;  // at most ten bar redraws a second
constexpr int kBarWidth = 24;

}  // namespace

std::string format_count(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof(buf), "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = int64_t(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else std::snprintf(buf, sizeof(buf), "%llds", (long long)s);
  return buf;
}

Progress::Progress(std::string title, int64_t total, std::string unit, ProgressStyle style, std::FILE* out,
                   int64_t line_every)
    : title_(std::move(title)), unit_(std::move(unit)), total_(total), style_(style), out_(out),
      line_every_(line_every > 0 ? line_every : (total >= 20 ? total / 20 : 1)) {
  if (style_ == ProgressStyle::automatic)
    style_ = (out_ && ::isatty(::fileno(out_))) ? ProgressStyle::bar : ProgressStyle::lines;
  if (!out_) style_ = ProgressStyle::none;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (bar_drawn_) std::fputc('\n', out_);
}

std::string Progress::format(const ProgressStats& s, bool with_bar) const {
  std::string line = title_ + " ";
  if (with_bar) {
    const double frac = total_ > 0 ? std::min(1.0, double(s.done) / double(total_)) : 0.0;
    const int filled = int(frac * kBarWidth);
    line += '[';
    line.append(size_t(filled), '=');
    if (filled < kBarWidth) line += '>';
    line.append(size_t(std::max(0, kBarWidth - filled - 1)), ' ');
    line += "] ";
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld  loss %.4f  ", (long long)s.done, (long long)total_, s.loss);
  line += buf;
  line += format_count(s.throughput) + " " + unit_ + "  mem " + format_bytes(s.allocated) + " / peak " +
          format_bytes(s.peak) + " / limit " + (s.limit > 0 ? format_bytes(s.limit) : std::string("none"));
  if (!s.extra.empty()) line += "  " + s.extra;
  // Time left from the steps this process ran (a resumed run starts counting at its first update).
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (first_done_ >= 0 && s.done > first_done_ && s.done < total_)
    line += "  eta " + format_duration(secs / double(s.done - first_done_) * double(total_ - s.done));
  return line;
}

// A bar longer than the terminal would wrap, and \r would then redraw only its last row.
std::string Progress::fit(std::string line) const {
  winsize ws{};
  if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col)
    line.resize(size_t(ws.ws_col - 1));
  return line;
}

void Progress::clear_bar() {
  if (!bar_drawn_) return;
  std::fputs("\r\033[K", out_);
  bar_drawn_ = false;
}

void Progress::update(const ProgressStats& s) {
  last_ = s;
  if (first_done_ < 0) first_done_ = s.done - 1;
  if (style_ == ProgressStyle::none) return;
  const auto now = std::chrono::steady_clock::now();
  if (style_ == ProgressStyle::lines) {
    if (s.done % line_every_ == 0 || s.done == 1 || s.done == total_)
      std::fprintf(out_, "%s\n", format(s, false).c_str()), std::fflush(out_);
    return;
  }
  if (std::chrono::duration<double>(now - last_draw_).count() < kRedrawSeconds && s.done != total_ && bar_drawn_)
    return;
  last_draw_ = now;
  std::fprintf(out_, "\r%s\033[K", fit(format(s, true)).c_str());
  std::fflush(out_);
  bar_drawn_ = true;
}

void Progress::note(const std::string& line) {
  if (style_ == ProgressStyle::none) return;
  clear_bar();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
  // Redraw the bar under the note right away.
  if (style_ == ProgressStyle::bar && last_.done > 0) {
    std::fprintf(out_, "%s\033[K", fit(format(last_, true)).c_str());
    std::fflush(out_);
    bar_drawn_ = true;
  }
}

void Progress::finish() {
  if (style_ == ProgressStyle::bar) {
    clear_bar();
    std::fprintf(out_, "%s\n", format(last_, true).c_str());
    std::fflush(out_);
  }
}

}  // namespace mg
