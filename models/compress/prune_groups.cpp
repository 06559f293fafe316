// Slicing, measuring and zeroing the members of a pruning group in place on the host, for any
// float dtype (a bf16-pure run's parameters included). See prune_groups.h.
#include "models/compress/prune_groups.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mg {
namespace {

// (outer, extent, inner): t viewed as (outer, extent, inner) around `dim`.
struct Around {
  int64_t outer = 1, extent = 1, inner = 1;
};
Around around(const Tensor& t, int64_t dim) {
  Around a;
  for (int64_t d = 0; d < t.dim(); ++d) (d < dim ? a.outer : d == dim ? a.extent : a.inner) *= t.size(d);
  return a;
}

void check_host_contiguous(const Tensor& t, const char* op) {
  MG_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), op,
           ": expected a contiguous cpu tensor, got ", t.defined() ? t.device().str() : std::string("undefined"),
           t.defined() && !t.is_contiguous() ? " (not contiguous)" : "");
}

}  // namespace

std::vector<int64_t> member_indices(const GroupMember& m, int64_t size, const std::vector<int64_t>& units) {
  std::vector<int64_t> idx;
  idx.reserve(units.size() * size_t(m.blocks * m.unit));
  for (int64_t b = 0; b < m.blocks; ++b)
    for (int64_t u : units)
      for (int64_t j = 0; j < m.unit; ++j) idx.push_back(b * size * m.unit + u * m.unit + j);
  return idx;
}

Tensor index_along(const Tensor& t, int64_t dim, const std::vector<int64_t>& indices) {
  check_host_contiguous(t, "index_along");
  MG_CHECK(dim >= 0 && dim < t.dim(), "index_along: dim ", dim, " is out of range for ", t.shape());
  const Around a = around(t, dim);
  Shape shape = t.shape();
  shape[size_t(dim)] = int64_t(indices.size());
  Tensor out = empty(shape, {.dtype = t.dtype(), .device = t.device()});
  const size_t row = size_t(a.inner) * t.element_size();
  const auto* src = static_cast<const char*>(t.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (int64_t o = 0; o < a.outer; ++o)
    for (size_t k = 0; k < indices.size(); ++k) {
      const int64_t i = indices[k];
      MG_CHECK(i >= 0 && i < a.extent, "index_along: index ", i, " is out of range for dim ", dim, " of ", t.shape());
      std::memcpy(dst + (size_t(o) * indices.size() + k) * row, src + size_t(o * a.extent + i) * row, row);
    }
  return out;
}

std::vector<double> unit_sums(const Tensor& t, const GroupMember& m, int64_t size, EntryMeasure measure) {
  check_host_contiguous(t, "unit_sums");
  const Around a = around(t, m.dim);
  const int64_t span = size * m.unit;
  std::vector<double> sums(size_t(size), 0.0);
  MG_DISPATCH_FLOAT(t.dtype(), "unit_sums", [&] {
    const scalar_t* p = t.data<scalar_t>();
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t e = 0; e < a.extent; ++e) {
        double s = 0.0;
        for (int64_t i = 0; i < a.inner; ++i) {
          const double x = double(p[(o * a.extent + e) * a.inner + i]);
          s += measure == EntryMeasure::abs ? std::abs(x) : measure == EntryMeasure::square ? x * x : x;
        }
        sums[size_t((e % span) / m.unit)] += s;
      }
  });
  return sums;
}

void zero_units(const Tensor& t, const GroupMember& m, int64_t size, const std::vector<int64_t>& units) {
  check_host_contiguous(t, "zero_units");
  const Around a = around(t, m.dim);
  const std::vector<int64_t> idx = member_indices(m, size, units);
  const size_t row = size_t(a.inner) * t.element_size();
  auto* p = static_cast<char*>(t.data_ptr());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i : idx) std::memset(p + size_t(o * a.extent + i) * row, 0, row);  // +0.0 in every float type
  t.bump_version();
}

void check_group(const PruneGroup& g, const std::map<std::string, Tensor>& state) {
  for (const GroupMember& m : g.members) {
    auto it = state.find(m.tensor);
    MG_CHECK(it != state.end(), "prune: group '", g.name, "' names tensor '", m.tensor, "', which the model lacks");
    const Tensor& t = it->second;
    MG_CHECK(m.dim < t.dim() && t.size(m.dim) == g.size * m.blocks * m.unit, "prune: group '", g.name, "': tensor '",
             m.tensor, "' ", t.shape(), " should have ", g.size * m.blocks * m.unit, " entries along dim ", m.dim,
             " (", g.size, " units)");
  }
}

}  // namespace mg
