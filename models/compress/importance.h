// Which units structured pruning removes. Each unit of a group gets an importance:
//   l1 / l2  the magnitude of every parameter slice it owns (sum |w|, sqrt(sum w^2)),
//   bn       the |gamma| of its BatchNorm(s) (network slimming, Liu et al. 2017),
//   taylor   first-order Taylor (Molchanov et al. 2019): sum over a few batches of |grad * w|,
//            the loss change a first-order expansion predicts when the slice is zeroed.
// Per layer, each group loses floor(amount * size) of its least important units; globally, the
// units of all groups of one kind are ranked together after dividing each group's scores by its
// mean (so layers of different fan-in compare), and a group that would lose every unit is an error.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/compress/prune_groups.h"
#include "models/nn/module.h"

namespace mg {

enum class PruneCriterion { l1, l2, bn, taylor };
enum class PruneScope { per_layer, global };

// "l1" | "l2" | "bn" | "taylor", "layer" | "global"; throws listing the choices.
PruneCriterion parse_prune_criterion(const std::string& s);
const char* prune_criterion_name(PruneCriterion c);
PruneScope parse_prune_scope(const std::string& s);
const char* prune_scope_name(PruneScope s);

// Per-unit scores by group name (what taylor_importance gathers from gradients).
using GroupScores = std::map<std::string, std::vector<double>>;

// Runs `loss()` and backward `batches` times on `model` (gradients are dropped after each) and
// sums |grad * weight| per unit of every group. Throws when batches < 1 (taylor needs data).
GroupScores taylor_importance(Module& model, const std::vector<PruneGroup>& groups, int64_t batches,
                              const std::function<Tensor()>& loss);

// The importance of each unit of `g` from the tensors in `state` (cpu); taylor reads `taylor`.
std::vector<double> unit_importance(const PruneGroup& g, const std::map<std::string, Tensor>& state,
                                    PruneCriterion c, const GroupScores* taylor = nullptr);

// The units each group keeps (ascending), given every group's importances. amount in [0, 1).
std::vector<std::vector<int64_t>> select_units(const std::vector<PruneGroup>& groups,
                                               const std::vector<std::vector<double>>& importance, double amount,
                                               PruneScope scope);

}  // namespace mg
