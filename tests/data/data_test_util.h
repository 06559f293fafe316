// Helpers for the data tests: a unique temporary folder under /tmp removed at the end, and
// small file writers for building corrupt inputs by hand.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace mg::test {

struct DataTempDir {
  std::filesystem::path dir;
  explicit DataTempDir(const std::string& name) {
    static std::atomic<int> counter{0};
    dir = std::filesystem::path("/tmp") /
          ("mg_data_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~DataTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The resident memory of this process in bytes (/proc/self/statm).
inline int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * int64_t(::sysconf(_SC_PAGESIZE));
}

}  // namespace mg::test
