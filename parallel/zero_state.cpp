// DistributedDataParallel's optimizer state in and out of checkpoints under ZeRO (Note [ZeRO
// checkpoints] in ddp.h): every state tensor of a bucket is all-gathered from the ranks' pieces
// and cut into the whole parameters' tensors ("h.0.mlp.fc.weight.exp_avg"), and back. The
// gathered state is a transient of the whole model's size on each rank while a checkpoint is
// written; the bucket at a time in flight is the only other cost.
#include <set>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "ops/ops.h"
#include "parallel/ddp.h"
#include "parallel/ddp_bucket.h"

namespace mg {
namespace {

// "<tensor>.<field>" -> {tensor, field}; tensor names hold dots, fields do not.
std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  MG_CHECK(dot != std::string::npos, "ZeRO state: key '", key, "' has no '.<field>'");
  return {key.substr(0, dot), key.substr(dot + 1)};
}

std::map<std::string, std::string> with_group_sizes(std::map<std::string, std::string> meta, const std::vector<int64_t>& sizes) {
  for (size_t i = 0; i < sizes.size(); ++i) meta["group." + std::to_string(i) + ".num_params"] = std::to_string(sizes[i]);
  return meta;
}

}  // namespace

DistributedDataParallel::OptimizerState DistributedDataParallel::gather_optimizer_state(const Optimizer& opt) const {
  if (opt_.zero == 0) return {opt.state_dict(), opt.state_metadata()};
  MG_CHECK(group_sizes_.size() == opt.param_groups().size(), "DDP: the optimizer was not built over optimizer_groups()");
  NoGradGuard no_grad;
  std::map<std::string, Tensor> mine;
  std::set<std::string> fields;
  for (const auto& [key, t] : opt.state_dict()) {
    mine.emplace(key, t);
    const std::string field = split_key(key).second;
    if (field != "step") fields.insert(field);
  }
  // Rank 0 holds the first elements of bucket 0, so its fields are every rank's.
  std::string joined;
  for (const auto& f : fields) joined += f + ",";
  joined = group_->broadcast_string(joined, 0);
  std::vector<std::string> names;
  for (size_t at = 0, c; (c = joined.find(',', at)) != std::string::npos; at = c + 1) names.push_back(joined.substr(at, c - at));
  const bool stepped = opt.step_count() > 0;

  OptimizerState full{{}, with_group_sizes(opt.state_metadata(), group_sizes_)};
  const int64_t N = group_->world_size();
  for (const auto& b : buckets_) {
    const int64_t len = b->padded / N, lo = group_->rank() * len;
    if (stepped)
      for (size_t j = 0; j < b->params.size(); ++j) {
        MemoryCategoryGuard tag(MemoryCategory::optimizer_state);
        full.tensors.emplace_back(params_[b->params[j]].first + ".step",
                                  scalar_tensor(double(opt.step_count()), {.dtype = DType::i64}));
      }
    for (const auto& field : names) {
      MemoryCategoryGuard tag(MemoryCategory::optimizer_state);
      const DType dt = b->dtype == DType::f64 ? DType::f64 : DType::f32;
      Tensor flat = zeros({b->padded}, {.dtype = dt, .device = b->device});
      for (const auto& pc : b->pieces) {
        auto it = mine.find(pc.name + "." + field);
        MG_CHECK(it != mine.end(), "DDP: this rank's optimizer has no '", pc.name, ".", field, "'");
        copy_(narrow(flat, 0, pc.begin, pc.length), it->second);
      }
      group_->all_gather(narrow(flat, 0, lo, len), flat);
      for (size_t j = 0; j < b->params.size(); ++j) {
        const auto& [name, p] = params_[b->params[j]];
        full.tensors.emplace_back(name + "." + field, clone(view(narrow(flat, 0, b->offsets[j], p.numel()), p.shape())));
      }
    }
  }
  return full;
}

DistributedDataParallel::OptimizerState DistributedDataParallel::shard_optimizer_state(const OptimizerState& full) const {
  if (opt_.zero == 0) return full;
  MG_CHECK(!group_pieces_.empty(), "DDP: shard_optimizer_state before optimizer_groups()");
  // Each parameter's entries by field.
  std::map<std::string, std::map<std::string, Tensor>> by_param;
  for (const auto& [key, t] : full.tensors) {
    const auto [name, field] = split_key(key);
    by_param[name][field] = t;
  }
  NoGradGuard no_grad;
  MemoryCategoryGuard tag(MemoryCategory::optimizer_state);
  OptimizerState out{{}, with_group_sizes(full.metadata, group_pieces_)};
  for (const auto& b : buckets_)
    for (const auto& pc : b->pieces) {
      const auto& [name, p] = params_[pc.param];
      auto it = by_param.find(name);
      if (it == by_param.end()) continue;  // no state yet
      size_t j = 0;
      while (b->params[j] != pc.param) ++j;
      const int64_t from = pc.begin - b->offsets[j];
      for (const auto& [field, t] : it->second) {
        if (field == "step") {
          out.tensors.emplace_back(pc.name + ".step", t);
          continue;
        }
        MG_CHECK(t.numel() == p.numel(), "ZeRO state: '", name, ".", field, "' has ", t.numel(), " elements, the parameter ",
                 p.numel(), " (a state of another layout cannot be sharded)");
        out.tensors.emplace_back(pc.name + "." + field, clone(narrow(view(contiguous(t), {t.numel()}), 0, from, pc.length)));
      }
    }
  return out;
}

}  // namespace mg
