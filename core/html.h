// What memgrad's self-contained HTML pages share (memory.html from the profiler, bench.html from
// `memgrad bench`): text escaping and one color per memory category, so a category looks the
// same on every page.
#pragma once
#include <string>

#include "core/memory_category.h"

namespace mg {

inline std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// Tableau-10 colors in the order of MemoryCategory.
inline const char* category_color(MemoryCategory c) {
  static const char* const kColors[kNumMemoryCategories] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                            "#59a14f", "#edc948", "#b07aa1"};
  return kColors[size_t(c)];
}

}  // namespace mg
