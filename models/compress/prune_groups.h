// Structured pruning's unit of work: a group of tensor slices that stand or fall together. An
// expansion channel of a MobileNetV2 block is a row of the expand conv, an entry of its BatchNorm,
// a depthwise filter, an entry of that BatchNorm and a column of the project conv; a GPT MLP unit
// is a row (+ bias) of c_fc and a column of c_proj; a head is HS rows of each of q, k, v in c_attn
// and HS columns of c_proj. Removing a unit removes every slice, so the smaller model stays
// consistent (DepGraph's dependency groups, written out by hand for the two models we have).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/nn/module.h"

namespace mg {

// One tensor of a group. Along `dim` the tensor holds `blocks` consecutive copies of the unit
// axis (c_attn's rows are q, k, v: 3 blocks), and each unit spans `unit` entries (a head: HS).
// So unit u of block b covers entries [b*size*unit + u*unit, ... + unit) along dim.
struct GroupMember {
  std::string tensor;  // state-dict name, e.g. "features.2.conv.0.conv.weight"
  int64_t dim = 0;
  int64_t blocks = 1;
  int64_t unit = 1;
  bool scored = true;  // a parameter: counts for l1 / l2 / taylor (running statistics do not)
};

struct PruneGroup {
  std::string name;  // "features.2" (expansion channels), "h.0.mlp" (MLP units), "h.0.attn" (heads)
  std::string kind;  // "expansion", "mlp" or "heads": global ranking compares groups of one kind
  int64_t size = 0;  // units in the unpruned group
  std::vector<GroupMember> members{};
  std::vector<std::string> bn_scales{};  // BatchNorm weights whose |gamma| the bn criterion reads
};

// The entries along m.dim that units `units` (ascending) of a group of `size` occupy, ascending.
std::vector<int64_t> member_indices(const GroupMember& m, int64_t size, const std::vector<int64_t>& units);

// A new contiguous tensor (same dtype and device, the calling thread's memory category) that
// keeps the entries `indices` of `t` along `dim`. t: a cpu tensor (pruning runs on the host).
Tensor index_along(const Tensor& t, int64_t dim, const std::vector<int64_t>& indices);

// What unit_sums adds up per entry.
enum class EntryMeasure { abs, square, value };

// For each of the group's `size` units, the sum of measure(x) over the entries of `t` it
// occupies, read in place. t: the member's tensor (contiguous, any float dtype, cpu).
std::vector<double> unit_sums(const Tensor& t, const GroupMember& m, int64_t size, EntryMeasure measure);

// Sets units `units` of member m of `t` to zero in place (t's storage; bumps its version).
void zero_units(const Tensor& t, const GroupMember& m, int64_t size, const std::vector<int64_t>& units);

// Checks that `state` holds every member with the extent size * blocks * unit along its dim;
// throws naming the group, tensor and shapes.
void check_group(const PruneGroup& g, const std::map<std::string, Tensor>& state);

}  // namespace mg
