// The memgrad command line: one CLI11 app whose subcommands register from their own files
// (apps/commands.h). Every error a subcommand throws (mg::Error, OutOfMemoryError, a bad
// argument) becomes one line `memgrad: error: ...` on stderr and exit code 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/build_info.h"
#include "core/error.h"

namespace {

// Error messages may span lines (an OutOfMemoryError lists categories and tensors, a hint
// follows the cause). The CLI prints them as one line: each line break and its indent become
// "; " (or a space after a ':' or ';').
std::string one_line(const std::string& msg) {
  std::string out;
  size_t i = 0;
  while (i < msg.size()) {
    if (msg[i] != '\n') {
      out += msg[i++];
      continue;
    }
    while (i < msg.size() && (msg[i] == '\n' || msg[i] == ' ' || msg[i] == '\t')) ++i;
    if (i == msg.size()) break;  // trailing newline
    bool punct = !out.empty() && (out.back() == ':' || out.back() == ';');
    out += punct ? " " : "; ";
  }
  return out;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "memgrad: error: %s\n", one_line(msg).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memgrad: train real models in little memory, and account for every byte."};
  app.set_version_flag("--version", std::string("memgrad ") + MG_VERSION + " (" +
                                        (*MG_GIT_REV ? MG_GIT_REV : "unknown revision") + ")");
  app.require_subcommand(1);

  // Registration order is the order `memgrad --help` lists the subcommands in.
  mg::add_info_command(app);
  mg::add_mlp_command(app);
  mg::add_data_command(app);
  mg::add_gpt_command(app);
  mg::add_vision_command(app);
  mg::add_bench_command(app);
  mg::add_plan_command(app);
  mg::add_prune_command(app);
  mg::add_report_command(app);
  mg::add_quantize_command(app);

  try {
    // Subcommand callbacks run inside parse(), so their errors land in the handlers below.
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a misspelt subcommand as a missing one; name the word it did not know.
    std::vector<CLI::App*> chosen = app.get_subcommands();
    if (chosen.empty() && argc > 1 && argv[1][0] != '-')
      return fail(std::string("unknown subcommand '") + argv[1] + "' (see 'memgrad --help')");
    // The deepest subcommand that was chosen ("memgrad gpt train --help", not "memgrad gpt --help").
    std::string help = "memgrad";
    for (CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().back();
      help += " " + sub->get_name();
    }
    help += " --help";
    return fail(std::string(e.what()) + " (see '" + help + "')");
  } catch (const mg::Error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {  // e.g. std::bad_alloc outside memgrad's allocator
    return fail(e.what());
  }
  return 0;
}
