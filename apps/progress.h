// Training progress for people and for logs: on a terminal (isatty) one line redrawn in place
// with \r (a bar, step, loss, throughput, memory allocated / peak / limit, time left); when
// the output is a file or a pipe, plain lines every few steps instead (the same figures and time
// left, each of the step the line is about), so logs stay readable and grep-able. Redraws are throttled, so progress costs nothing next to a training step.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mg {

enum class ProgressStyle {
  automatic,  // bar on a terminal, lines otherwise
  bar,
  lines,
  none,       // print nothing (tests)
};

struct ProgressStats {
  int64_t done = 0;          // steps finished (of total)
  double loss = 0.0;
  double throughput = 0.0;   // units per second (tokens, images)
  int64_t allocated = 0;     // device memory in use now, bytes
  int64_t peak = 0;          // the run's peak allocated bytes
  int64_t limit = 0;         // the device's budget; 0 = none
  std::string extra;         // e.g. "val 1.234" or "epoch 2/5"
};

class Progress {
 public:
  // unit: what throughput counts ("tok/s", "img/s"). line_every: steps between plain lines
  // (0: about 20 lines per run).
  Progress(std::string title, int64_t total, std::string unit, ProgressStyle style = ProgressStyle::automatic,
           std::FILE* out = stdout, int64_t line_every = 0);
  ~Progress();  // ends a bar line
  void update(const ProgressStats& s);
  // A line of its own (an evaluation result, a checkpoint note); clears the bar first.
  void note(const std::string& line);
  // Draws the final state and ends the line.
  void finish();
  ProgressStyle style() const { return style_; }

 private:
  std::string format(const ProgressStats& s, bool with_bar) const;
  void clear_bar();
  std::string fit(std::string line) const;  // cut to the terminal's width

  std::string title_, unit_;
  int64_t total_;
  ProgressStyle style_;
  std::FILE* out_;
  int64_t line_every_;
  bool bar_drawn_ = false;
  int64_t first_done_ = -1;  // steps done before this process's first step (for the eta)
  ProgressStats last_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "12.3k", "1.20M": a compact count for throughput figures.
std::string format_count(double v);
// "1m05s", "42s", "1h02m".
std::string format_duration(double seconds);

}  // namespace mg
