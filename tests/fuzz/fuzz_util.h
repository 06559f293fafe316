// Shared by the libFuzzer targets (one per parser, tests/fuzz/fuzz_*.cpp): the fuzz input written
// to a file in a private folder, since memgrad's parsers read files by path. Each target calls
// one parser and catches mg::Error (the promised way to refuse bad input); any other exception,
// crash, leak, sanitizer report or hang is a finding (scripts/fuzz).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace mg::fuzz {

// /tmp/mg_fuzz_<pid>/, created once per process and removed at exit.
inline const std::filesystem::path& work_dir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::path("/tmp") / ("mg_fuzz_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

// Writes the bytes to work_dir()/name and returns its path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (work_dir() / name).string();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();  // the harness itself is broken
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace mg::fuzz
