// `memgrad data tokenize IN... --out FILE`: byte-tokenizes text files and folders (e.g. the
// fortunes corpus) into one memory-mapped token file (data/token_file.h), the input of
// `memgrad gpt train --data FILE`. `memgrad data info FILE` prints a token file's header.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/allocator.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace mg {
namespace {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out;
};

void run_tokenize(const TokenizeOptions& o) {
  const std::filesystem::path parent = std::filesystem::path(o.out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  TokenizeSummary s = tokenize_files(o.inputs, o.out);
  std::printf("memgrad data tokenize: %lld files, %lld tokens (byte tokenizer, vocab %lld) -> %s (%s)\n",
              (long long)s.files, (long long)s.tokens, (long long)ByteTokenizer::kVocabSize, o.out.c_str(),
              format_bytes(kTokenFileHeaderBytes + s.tokens + kTokenFileTrailerBytes).c_str());
}

void run_info(const std::string& path) {
  TokenFile f(path);
  std::printf("%s: %lld tokens of %d byte%s\n", path.c_str(), (long long)f.size(), f.width(),
              f.width() == 1 ? "" : "s");
  const int64_t n = std::min<int64_t>(f.size(), 64);
  if (f.width() == 1) {
    std::vector<uint32_t> head = f.read(0, n);
    std::string text = ByteTokenizer().decode(head);
    for (char& c : text)
      if (c == '\n' || c == '\t') c = ' ';
    std::printf("first %lld tokens as text: %s\n", (long long)n, text.c_str());
  }
}

}  // namespace

void add_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare training data (token files)");
  data->require_subcommand(1);

  auto tok = std::make_shared<TokenizeOptions>();
  CLI::App* t = data->add_subcommand("tokenize", "Byte-tokenize text files or folders into one token file");
  t->add_option("inputs", tok->inputs, "text files or folders (every regular file under them, sorted)")
      ->required()
      ->expected(1, -1);
  t->add_option("--out", tok->out, "the token file to write")->required();
  t->callback([tok] { run_tokenize(*tok); });

  auto path = std::make_shared<std::string>();
  CLI::App* i = data->add_subcommand("info", "Print a token file's size and first tokens");
  i->add_option("file", *path, "a token file")->required();
  i->callback([path] { run_info(*path); });
}

}  // namespace mg
