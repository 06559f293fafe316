// Out-of-line throw helpers for MG_CHECK / MG_INTERNAL_ASSERT (keeps the macros small).
#include "core/error.h"

namespace mg::detail {

void throw_error(const char* /*file*/, int /*line*/, const std::string& msg) { throw Error(msg); }

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str_cat("memgrad internal error at ", file, ":", line, ": ", cond,
                      msg.empty() ? "" : " (", msg, msg.empty() ? "" : ")",
                      "\n  this is a bug in memgrad, please report it"));
}

}  // namespace mg::detail
