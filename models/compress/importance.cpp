// Importance criteria and the selection of the units to keep (see importance.h).
#include "models/compress/importance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/ops.h"

namespace mg {

PruneCriterion parse_prune_criterion(const std::string& s) {
  if (s == "l1") return PruneCriterion::l1;
  if (s == "l2") return PruneCriterion::l2;
  if (s == "bn") return PruneCriterion::bn;
  if (s == "taylor") return PruneCriterion::taylor;
  MG_THROW("prune: unknown criterion '", s, "' (known: l1, l2, bn, taylor)");
}

const char* prune_criterion_name(PruneCriterion c) {
  switch (c) {
    case PruneCriterion::l1: return "l1";
    case PruneCriterion::l2: return "l2";
    case PruneCriterion::bn: return "bn";
    case PruneCriterion::taylor: return "taylor";
  }
  return "?";
}

PruneScope parse_prune_scope(const std::string& s) {
  if (s == "layer") return PruneScope::per_layer;
  if (s == "global") return PruneScope::global;
  MG_THROW("prune: unknown scope '", s, "' (known: layer, global)");
}

const char* prune_scope_name(PruneScope s) { return s == PruneScope::global ? "global" : "layer"; }

GroupScores taylor_importance(Module& model, const std::vector<PruneGroup>& groups, int64_t batches,
                              const std::function<Tensor()>& loss) {
  MG_CHECK(batches >= 1, "prune: the taylor criterion needs gradients, so at least one batch of data (got ", batches,
           " batches)\n  hint: give the data (the run's own), or choose l1, l2 or bn");
  std::map<std::string, Tensor> params;
  for (auto& [name, p] : model.named_parameters()) params[name] = p;
  GroupScores scores;
  for (const PruneGroup& g : groups) scores[g.name].assign(size_t(g.size), 0.0);
  model.zero_grad();
  for (int64_t b = 0; b < batches; ++b) {
    Tensor l = loss();
    backward(l);
    NoGradGuard no_grad;
    for (const PruneGroup& g : groups)
      for (const GroupMember& m : g.members) {
        if (!m.scored) continue;
        auto it = params.find(m.tensor);
        MG_CHECK(it != params.end(), "prune: group '", g.name, "' names parameter '", m.tensor, "', which the model lacks");
        const Tensor& grad = it->second.grad();
        if (!grad.defined()) continue;  // the loss does not reach it
        Tensor gw = contiguous(mul(to(grad, kCPU), to(it->second.detach(), kCPU)));  // grad * w, elementwise
        const std::vector<double> s = unit_sums(gw, m, g.size, EntryMeasure::abs);
        for (size_t u = 0; u < s.size(); ++u) scores[g.name][u] += s[u];
      }
    model.zero_grad();
  }
  return scores;
}

std::vector<double> unit_importance(const PruneGroup& g, const std::map<std::string, Tensor>& state,
                                    PruneCriterion c, const GroupScores* taylor) {
  check_group(g, state);
  if (c == PruneCriterion::taylor) {
    MG_CHECK(taylor != nullptr, "prune: the taylor criterion needs gradients from data (none were gathered)");
    auto it = taylor->find(g.name);
    MG_CHECK(it != taylor->end() && int64_t(it->second.size()) == g.size, "prune: no taylor scores for group '",
             g.name, "'");
    return it->second;
  }
  std::vector<double> imp(size_t(g.size), 0.0);
  if (c == PruneCriterion::bn) {
    MG_CHECK(!g.bn_scales.empty(), "prune: the bn criterion reads BatchNorm scales, and group '", g.name,
             "' has no BatchNorm\n  hint: bn applies to MobileNetV2; use l1, l2 or taylor for GPT");
    for (const std::string& name : g.bn_scales) {
      const std::vector<double> s = unit_sums(contiguous(state.at(name)), {.tensor = name}, g.size, EntryMeasure::abs);
      for (size_t u = 0; u < s.size(); ++u) imp[u] += s[u];
    }
    return imp;
  }
  const EntryMeasure measure = c == PruneCriterion::l1 ? EntryMeasure::abs : EntryMeasure::square;
  for (const GroupMember& m : g.members) {
    if (!m.scored) continue;
    const std::vector<double> s = unit_sums(contiguous(state.at(m.tensor)), m, g.size, measure);
    for (size_t u = 0; u < s.size(); ++u) imp[u] += s[u];
  }
  if (c == PruneCriterion::l2)
    for (double& v : imp) v = std::sqrt(v);
  return imp;
}

namespace {

// Units sorted by (importance, index): the first ones go. Ties fall on the lower index first.
std::vector<int64_t> ascending(const std::vector<double>& imp) {
  std::vector<int64_t> order(imp.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return imp[size_t(a)] < imp[size_t(b)]; });
  return order;
}

}  // namespace

std::vector<std::vector<int64_t>> select_units(const std::vector<PruneGroup>& groups,
                                               const std::vector<std::vector<double>>& importance, double amount,
                                               PruneScope scope) {
  MG_CHECK(amount >= 0.0 && amount < 1.0, "prune: --amount must be in [0, 1) (the fraction of units removed), got ",
           amount);
  MG_CHECK(importance.size() == groups.size(), "prune: ", importance.size(), " importance lists for ", groups.size(),
           " groups");
  std::vector<std::vector<bool>> removed(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    MG_CHECK(int64_t(importance[i].size()) == groups[i].size, "prune: group '", groups[i].name, "' has ",
             groups[i].size, " units but ", importance[i].size(), " scores");
    removed[i].assign(size_t(groups[i].size), false);
  }
  if (scope == PruneScope::per_layer) {
    for (size_t i = 0; i < groups.size(); ++i) {
      const int64_t n = int64_t(std::floor(amount * double(groups[i].size)));  // < size since amount < 1
      const std::vector<int64_t> order = ascending(importance[i]);
      for (int64_t k = 0; k < n; ++k) removed[i][size_t(order[size_t(k)])] = true;
    }
  } else {
    // One ranking per kind, each group's scores divided by their mean.
    std::map<std::string, std::vector<std::pair<double, std::pair<size_t, int64_t>>>> pools;
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto& imp = importance[i];
      const double mean = std::accumulate(imp.begin(), imp.end(), 0.0) / double(imp.size());
      for (int64_t u = 0; u < groups[i].size; ++u)
        pools[groups[i].kind].push_back({mean > 0 ? imp[size_t(u)] / mean : 0.0, {i, u}});
    }
    for (auto& [kind, pool] : pools) {
      std::stable_sort(pool.begin(), pool.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      const int64_t n = int64_t(std::floor(amount * double(pool.size())));
      for (int64_t k = 0; k < n; ++k) removed[pool[size_t(k)].second.first][size_t(pool[size_t(k)].second.second)] = true;
    }
  }
  std::vector<std::vector<int64_t>> keep(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    for (int64_t u = 0; u < groups[i].size; ++u)
      if (!removed[i][size_t(u)]) keep[i].push_back(u);
    MG_CHECK(!keep[i].empty(), "prune: removing ", amount * 100.0, "% of the ", groups[i].kind,
             " units by global ranking would remove all ", groups[i].size, " units of '", groups[i].name,
             "' (a whole layer)\n  hint: lower --amount or use --scope layer");
  }
  return keep;
}

}  // namespace mg
