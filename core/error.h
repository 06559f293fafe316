// Errors: mg::Error for user mistakes (bad shapes, dtypes, devices, files) and
// mg::OutOfMemoryError for budgets. MG_CHECK builds its message only when the check fails,
// so checks on hot paths cost one branch. MG_INTERNAL_ASSERT guards memgrad's own invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown when an allocation would pass a device's memory limit (or the backend is out).
// Catchable: the allocator state stays consistent, so a training loop can recover.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& what) : Error(what) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace mg

#define MG_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) [[unlikely]] {                                               \
      ::mg::detail::throw_error(__FILE__, __LINE__, ::mg::detail::str_cat(__VA_ARGS__)); \
    }                                                                         \
  } while (0)

#define MG_THROW(...) ::mg::detail::throw_error(__FILE__, __LINE__, ::mg::detail::str_cat(__VA_ARGS__))

#define MG_INTERNAL_ASSERT(cond, ...)                                         \
  do {                                                                        \
    if (!(cond)) [[unlikely]] {                                               \
      ::mg::detail::throw_internal(__FILE__, __LINE__, #cond, ::mg::detail::str_cat("" __VA_OPT__(,) __VA_ARGS__)); \
    }                                                                         \
  } while (0)
