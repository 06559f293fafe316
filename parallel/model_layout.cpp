// The placeable modules of GPT and MobileNetV2. These lists must match the calls in
// models/gpt.cpp and models/mobilenet_v2.cpp that go through (*m)(x): a module whose owner calls
// forward() directly would get its input on the wrong device (tests/parallel place every leaf
// on alternating devices to hold the two in step).
#include "parallel/model_layout.h"

#include <algorithm>

#include "models/gpt.h"
#include "models/mobilenet_v2.h"

namespace mg {

bool path_within(const std::string& path, const std::string& ancestor) {
  if (path.size() < ancestor.size() || path.compare(0, ancestor.size(), ancestor) != 0) return false;
  return path.size() == ancestor.size() || path[ancestor.size()] == '.';
}

bool ModelLayout::placeable(const std::string& path) const {
  auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), path) != v.end(); };
  return in(leaves) || in(blocks) || in(groups);
}

ModelLayout model_layout(Module& model) {
  ModelLayout l;
  if (auto* gpt = dynamic_cast<GPT*>(&model)) {
    l.model = "GPT";
    l.first = {"wte", "wpe"};
    l.last = {"ln_f"};
    l.groups = {"h"};
    l.input = "wte";
    l.output = "wte";
    l.leaves = l.first;
    for (size_t i = 0; i < gpt->h->size(); ++i) {
      const std::string b = "h." + std::to_string(i);
      l.blocks.push_back(b);
      for (const char* sub : {"ln_1", "attn", "ln_2", "mlp"}) l.leaves.push_back(b + "." + sub);
    }
    l.leaves.push_back("ln_f");
    l.hint = "wte, wpe, h, h.N, h.N.ln_1, h.N.attn, h.N.ln_2, h.N.mlp, ln_f (N < " +
             std::to_string(gpt->h->size()) + "; the output head is wte)";
    return l;
  }
  if (auto* net = dynamic_cast<MobileNetV2*>(&model)) {
    l.model = "MobileNetV2";
    const size_t n = net->features->size();  // stem, blocks, last 1x1 conv
    MG_INTERNAL_ASSERT(n >= 3, "MobileNetV2 with ", n, " feature modules");
    l.groups = {"features"};
    l.input = "features.0";
    l.output = "classifier";
    for (size_t i = 0; i < n; ++i) l.leaves.push_back("features." + std::to_string(i));
    l.leaves.push_back("classifier");
    l.first = {"features.0"};
    for (size_t i = 1; i + 1 < n; ++i) l.blocks.push_back("features." + std::to_string(i));
    l.last = {"features." + std::to_string(n - 1), "classifier"};
    l.hint = "features, features.N (N < " + std::to_string(n) + "), classifier";
    return l;
  }
  MG_THROW("model parallelism: a ", model.type_name(),
           " has no placement layout (known: GPT, MobileNetV2; see parallel/model_layout.cpp)");
}

}  // namespace mg
