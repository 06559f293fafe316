// The two models' dependency groups, the plan, and cutting a state dict or a model down to it
// (see structured_prune.h).
#include "models/compress/structured_prune.h"

#include <set>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/ops.h"

namespace mg {
namespace {

std::map<std::string, Tensor> as_map(const NamedTensors& named) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : named) m.emplace(n, t);
  return m;
}

// The member named `name`, or the member `<m>` of a name "<m>.<suffix>" (optimizer state);
// nullptr when none.
using MemberIndex = std::map<std::string, std::pair<const PruneGroup*, const GroupMember*>>;
const GroupMember* find_member(const MemberIndex& by_name, const std::string& name, const PruneGroup** group) {
  for (size_t end = name.size(); end != std::string::npos && end > 0; end = name.rfind('.', end - 1)) {
    auto it = by_name.find(name.substr(0, end));
    if (it != by_name.end()) {
      *group = it->second.first;
      return it->second.second;
    }
  }
  return nullptr;
}

// Group index for a group name (configs are written per block).
int64_t block_of(const std::string& group_name, const char* prefix) {
  return std::stoll(group_name.substr(std::string(prefix).size()));
}

template <typename M>
std::unique_ptr<M> rebuild(const M& model, const PrunePlan& plan) {
  const NamedTensors state = model.state_dict();
  const Device device = state.front().second.device();
  NamedTensors host;
  for (const auto& [n, t] : state) host.emplace_back(n, device.is_cpu() ? t : to(t, kCPU));
  NamedTensors pruned = [&] {
    MemoryCategoryGuard scratch(MemoryCategory::other);  // the slices live only until loaded
    return apply_plan(plan, host);
  }();
  Generator scratch_gen(0);  // values are overwritten below
  auto out = std::make_unique<M>(pruned_config(model.config(), plan), InitOptions{.gen = &scratch_gen, .device = device,
                                                                             .dtype = state.front().second.dtype()});
  out->load_state_dict(pruned);
  out->train(model.is_training());
  return out;
}

}  // namespace

std::vector<PruneGroup> mobilenet_v2_groups(const MobileNetV2Config& cfg) {
  const std::vector<int64_t> hidden = cfg.hidden_widths(), ratios = cfg.expand_ratios();
  std::vector<PruneGroup> groups;
  for (size_t b = 0; b < hidden.size(); ++b) {
    // features.0 is the stem; block b is features.(b+1). A block whose expand ratio is 1 has no
    // expansion conv (its depthwise conv reads the block input, which the residual path shares).
    if (ratios[b] == 1) continue;
    const std::string p = "features." + std::to_string(b + 1) + ".conv.";
    PruneGroup g{.name = "features." + std::to_string(b + 1), .kind = "expansion", .size = hidden[b]};
    g.members.push_back({.tensor = p + "0.conv.weight"});  // expand 1x1 (hidden, in, 1, 1): rows
    g.members.push_back({.tensor = p + "1.conv.weight"});  // depthwise (hidden, 1, 3, 3): filters
    for (const char* bn : {"0.bn.", "1.bn."}) {  // the two BatchNorms over the hidden channels
      g.members.push_back({.tensor = p + bn + "weight"});
      g.members.push_back({.tensor = p + bn + "bias"});
      g.members.push_back({.tensor = p + bn + "running_mean", .scored = false});
      g.members.push_back({.tensor = p + bn + "running_var", .scored = false});
      g.bn_scales.push_back(p + bn + "weight");
    }
    g.members.push_back({.tensor = p + "2.weight", .dim = 1});  // project 1x1 (out, hidden, 1, 1): columns
    groups.push_back(std::move(g));
  }
  return groups;
}

std::vector<PruneGroup> gpt_groups(const GPTConfig& cfg, bool mlp, bool heads) {
  MG_CHECK(mlp || heads, "prune: GPT pruning needs a target: MLP units, attention heads or both");
  std::vector<PruneGroup> groups;
  const int64_t HS = cfg.head_size();
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    if (mlp) {
      PruneGroup g{.name = p + "mlp", .kind = "mlp", .size = cfg.mlp_width(l)};
      g.members = {{.tensor = p + "mlp.c_fc.weight"}, {.tensor = p + "mlp.c_fc.bias"},
                   {.tensor = p + "mlp.c_proj.weight", .dim = 1}};
      groups.push_back(std::move(g));
    }
    if (heads) {
      PruneGroup g{.name = p + "attn", .kind = "heads", .size = cfg.heads(l)};
      g.members = {{.tensor = p + "attn.c_attn.weight", .blocks = 3, .unit = HS},  // q, k, v rows
                   {.tensor = p + "attn.c_attn.bias", .blocks = 3, .unit = HS},
                   {.tensor = p + "attn.c_proj.weight", .dim = 1, .unit = HS}};
      groups.push_back(std::move(g));
    }
  }
  return groups;
}

PrunePlan plan_pruning(const Module& model, std::vector<PruneGroup> groups, double amount, PruneCriterion criterion,
                       PruneScope scope, const GroupScores* taylor) {
  MG_CHECK(amount >= 0.0 && amount < 1.0, "prune: --amount must be in [0, 1) (the fraction of units removed), got ",
           amount);
  MG_CHECK(!groups.empty(), "prune: the model has no prunable groups");
  std::map<std::string, Tensor> state;
  for (const auto& [n, t] : model.state_dict()) state.emplace(n, t.device().is_cpu() ? contiguous(t) : to(t, kCPU));
  std::vector<std::vector<double>> imp;
  for (const PruneGroup& g : groups) imp.push_back(unit_importance(g, state, criterion, taylor));
  PrunePlan plan;
  plan.keep = select_units(groups, imp, amount, scope);
  plan.groups = std::move(groups);
  return plan;
}

namespace {

enum class Coverage { every_member, any };

NamedTensors apply(const PrunePlan& plan, const NamedTensors& state, Coverage coverage) {
  MemberIndex by_name;
  for (const PruneGroup& g : plan.groups)
    for (const GroupMember& m : g.members) by_name[m.tensor] = {&g, &m};
  const std::map<std::string, Tensor> exact = as_map(state);
  std::set<std::string> seen;
  NamedTensors out;
  for (const auto& [name, t] : state) {
    const PruneGroup* g = nullptr;
    const GroupMember* m = find_member(by_name, name, &g);
    if (m == nullptr) {
      out.emplace_back(name, t);
      continue;
    }
    // "<member>.<suffix>" is sliced only when it has the member's shape (not e.g. "<param>.step").
    const auto own = exact.find(m->tensor);
    const bool same_shape = own == exact.end() ? t.dim() > m->dim && t.size(m->dim) == g->size * m->blocks * m->unit
                                               : own->second.shape() == t.shape();
    if (name != m->tensor && !same_shape) {
      out.emplace_back(name, t);
      continue;
    }
    MG_CHECK(t.dim() > m->dim && t.size(m->dim) == g->size * m->blocks * m->unit, "prune: tensor '", name, "' ",
             t.shape(), " should have ", g->size * m->blocks * m->unit, " entries along dim ", m->dim);
    const size_t gi = size_t(g - plan.groups.data());
    out.emplace_back(name, index_along(contiguous(t), m->dim, member_indices(*m, g->size, plan.keep[gi])));
    if (name == m->tensor) seen.insert(name);
  }
  if (coverage == Coverage::every_member)
    for (const auto& [name, _] : by_name)
      MG_CHECK(seen.count(name), "prune: the state has no tensor '", name, "' that the plan cuts");
  return out;
}

}  // namespace

NamedTensors apply_plan(const PrunePlan& plan, const NamedTensors& state) {
  return apply(plan, state, Coverage::every_member);
}

NamedTensors apply_plan_to_optimizer_state(const PrunePlan& plan, const NamedTensors& state) {
  return apply(plan, state, Coverage::any);
}

void mask_plan(const PrunePlan& plan, Module& model) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> state;
  for (const auto& [n, t] : model.state_dict()) state.emplace(n, t);
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const PruneGroup& g = plan.groups[gi];
    check_group(g, state);
    std::vector<int64_t> removed;
    for (int64_t u = 0, k = 0; u < g.size; ++u) {
      if (k < int64_t(plan.keep[gi].size()) && plan.keep[gi][size_t(k)] == u) ++k;
      else removed.push_back(u);
    }
    for (const GroupMember& m : g.members)
      if (m.scored) zero_units(state.at(m.tensor), m, g.size, removed);
  }
}

MobileNetV2Config pruned_config(const MobileNetV2Config& cfg, const PrunePlan& plan) {
  MobileNetV2Config out = cfg;
  out.block_hidden = cfg.hidden_widths();
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    MG_CHECK(plan.groups[gi].kind == "expansion", "prune: a '", plan.groups[gi].kind,
             "' group does not belong to MobileNetV2");
    out.block_hidden.at(size_t(block_of(plan.groups[gi].name, "features.") - 1)) = int64_t(plan.keep[gi].size());
  }
  out.validate();
  return out;
}

GPTConfig pruned_config(const GPTConfig& cfg, const PrunePlan& plan) {
  GPTConfig out = cfg;
  std::vector<int64_t> mlp(size_t(cfg.n_layer)), heads(size_t(cfg.n_layer));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    mlp[size_t(l)] = cfg.mlp_width(l);
    heads[size_t(l)] = cfg.heads(l);
  }
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const PruneGroup& g = plan.groups[gi];
    MG_CHECK(g.kind == "mlp" || g.kind == "heads", "prune: a '", g.kind, "' group does not belong to GPT");
    (g.kind == "mlp" ? mlp : heads).at(size_t(block_of(g.name, "h."))) = int64_t(plan.keep[gi].size());
  }
  if (!cfg.mlp_hidden.empty() || mlp != std::vector<int64_t>(size_t(cfg.n_layer), 4 * cfg.d_model)) out.mlp_hidden = mlp;
  if (!cfg.layer_heads.empty() || heads != std::vector<int64_t>(size_t(cfg.n_layer), cfg.n_head)) out.layer_heads = heads;
  out.validate();
  return out;
}

std::unique_ptr<MobileNetV2> prune_model(const MobileNetV2& model, const PrunePlan& plan) { return rebuild(model, plan); }
std::unique_ptr<GPT> prune_model(const GPT& model, const PrunePlan& plan) { return rebuild(model, plan); }

PruneCount count_pruned(const PrunePlan& plan, const NamedTensors& state) {
  std::map<std::string, double> kept_fraction;
  for (size_t gi = 0; gi < plan.groups.size(); ++gi)
    for (const GroupMember& m : plan.groups[gi].members)
      kept_fraction[m.tensor] = double(plan.keep[gi].size()) / double(plan.groups[gi].size);
  PruneCount c;
  for (const auto& [name, t] : state) {
    c.elements_before += t.numel();
    auto it = kept_fraction.find(name);
    c.elements_after += it == kept_fraction.end() ? t.numel() : int64_t(std::llround(double(t.numel()) * it->second));
  }
  return c;
}

}  // namespace mg
