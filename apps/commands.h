// The subcommands of the `memgrad` command line. Each lives in its own apps/<name>.cpp and
// registers itself through one explicit add_*_command function that main() calls in order
// (never through static-initializer objects, which the linker may drop). A new subcommand adds
// its function here and one call in apps/main.cpp.
#pragma once
#include <cstddef>
#include <string>

namespace CLI {
class App;
}

namespace mg {

// `memgrad info`: version, build options, SIMD and threads, devices and their memory pools.
void add_info_command(CLI::App& app);
// `memgrad mlp`: train a small MLP on synthetic spirals; loss, accuracy, meta-predicted and real memory.
void add_mlp_command(CLI::App& app);
// `memgrad data tokenize|info`: text files and folders into token files (apps/data_command.cpp).
void add_data_command(CLI::App& app);
// `memgrad gpt train|sample`: train a GPT into a run directory, continue it, sample from it.
void add_gpt_command(CLI::App& app);
// `memgrad vision train|eval`: train MobileNetV2 on Fashion-MNIST or an image folder, evaluate it.
void add_vision_command(CLI::App& app);
// `memgrad bench`: one model under combinations of memory techniques; memory and time per row.
void add_bench_command(CLI::App& app);
// `memgrad plan`: the exact memory of every combination of techniques (on meta), what fits a budget, the fastest.
void add_plan_command(CLI::App& app);
// `memgrad prune`: structured or magnitude pruning of a trained run into a new run directory.
void add_prune_command(CLI::App& app);
// `memgrad report RUN_DIR`: peak memory per device and category, largest tensors at the peak, its phase.
// `memgrad report --run RUN_DIR`: first the run's own per-device peaks by category (device_peaks.json,
// metrics.csv), then the profile when the run has one.
void add_report_command(CLI::App& app);
// `memgrad quantize`: post-training int8 quantization of a run, int8 vs fp32 (apps/quantize_command.cpp).
void add_quantize_command(CLI::App& app);
// The text `memgrad report` prints (apps/report_command.cpp); throws naming memory.json when it is
// missing or malformed.
std::string memory_report(const std::string& run_dir, size_t top = 10);
// The text `memgrad report --run` prints; throws naming the file when the directory is not a run
// or wrote no per-device peaks.
std::string run_memory_report(const std::string& run_dir, size_t top = 10);

}  // namespace mg
