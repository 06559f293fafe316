// Helpers for the apps tests: a corpus written as a token file, a tiny image folder, one column
// of a metrics.csv, and running a `memgrad` command line through CLI11 without a process.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/run_dir.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/data_test_util.h"
#include "data/image.h"
#include "data/token_file.h"

namespace mg::test {

// `n` bytes of text with some structure (repeated words), so a tiny GPT has something to learn.
inline std::string tiny_corpus(int64_t n) {
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat.\n", "dog ", "ran "};
  Generator g(7);
  std::string s;
  for (uint64_t i = 0; int64_t(s.size()) < n; ++i) s += words[g.bits_at(i) % 8];
  return s.substr(0, size_t(n));
}

inline std::string write_tiny_token_file(const DataTempDir& dir, int64_t n = 6000) {
  std::string text = tiny_corpus(n);
  std::vector<uint32_t> tokens(text.begin(), text.end());
  for (auto& t : tokens) t &= 0xFF;
  const std::string path = dir.file("corpus.tokens");
  write_token_file(path, tokens, 1);
  return path;
}

// root/<class>/<i>.png: `per_class` 8x8 RGB images per class; class c is brighter in channel c.
inline std::string write_tiny_image_folder(const DataTempDir& dir, int per_class, int classes = 2) {
  const std::string root = dir.file("images");
  Generator g(11);
  uint64_t pos = 0;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class; ++i) {
      std::vector<double> px(8 * 8 * 3);
      for (size_t k = 0; k < px.size(); ++k)
        px[k] = double(int(g.uniform_at(pos++) * 120) + (int(k % 3) == c ? 120 : 0));
      std::filesystem::create_directories(root + "/class" + std::to_string(c));
      write_png(root + "/class" + std::to_string(c) + "/" + std::to_string(i) + ".png",
                from_vector(px, {8, 8, 3}, {.dtype = DType::u8}));
    }
  return root;
}

// One column of a metrics.csv, as text.
inline std::vector<std::string> metrics_column(const std::string& run_dir, const std::string& column) {
  std::vector<std::string> out;
  for (const auto& row : read_metrics(RunDir(run_dir).metrics_path())) out.push_back(row.at(column));
  return out;
}

// Runs `memgrad <args>` through the real subcommand registration; mg::Error propagates.
inline void run_cli(const std::vector<std::string>& args) {
  CLI::App app{"memgrad"};
  app.require_subcommand(1);
  add_data_command(app);
  add_gpt_command(app);
  add_vision_command(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them back to front
  app.parse(reversed);
}

}  // namespace mg::test
