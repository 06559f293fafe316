// 2:4 pruning and its compressed layout (see sparse_24.h).
#include "models/compress/sparse_24.h"

#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "models/nn/layers.h"
#include "ops/ops.h"

namespace mg {
namespace {

int64_t cols_of(const Tensor& w) { return w.size(0) > 0 ? w.numel() / w.size(0) : 0; }
int64_t meta_cols(int64_t cols) { return (cols / k24Group + 1) / 2; }

void check_fits(const Tensor& w, const char* op) {
  MG_CHECK(w.defined() && w.device().is_cpu() && w.is_contiguous(), op, ": expected a contiguous cpu tensor");
  MG_CHECK(shape_fits_24(w), op, ": a 2:4 weight needs >= 2 dimensions and rows of a multiple of 4 elements, got ",
           shape_str(w.shape()));
}

}  // namespace

bool shape_fits_24(const Tensor& w) { return w.dim() >= 2 && w.size(0) > 0 && cols_of(w) % k24Group == 0; }

void prune_24_(const Tensor& w) {
  check_fits(w, "prune_24_");
  NoGradGuard no_grad;
  const int64_t groups = w.numel() / k24Group;
  MG_DISPATCH_FLOAT(w.dtype(), "prune_24_", [&] {
    scalar_t* p = w.data<scalar_t>();
    for (int64_t g = 0; g < groups; ++g) {
      scalar_t* q = p + g * k24Group;
      // the two largest |w| (a later equal one does not displace an earlier one)
      int a = -1, b = -1;
      for (int i = 0; i < k24Group; ++i) {
        const float m = std::abs(float(q[i]));
        if (a < 0 || m > std::abs(float(q[a]))) b = a, a = i;
        else if (b < 0 || m > std::abs(float(q[b]))) b = i;
      }
      for (int i = 0; i < k24Group; ++i)
        if (i != a && i != b) q[i] = scalar_t(0.0f);
    }
  });
  w.bump_version();
}

bool is_24_sparse(const Tensor& w0) {
  if (!w0.defined() || !shape_fits_24(w0)) return false;
  const Tensor w = w0.device().is_cpu() ? contiguous(w0) : to(w0, kCPU);
  bool ok = true;
  MG_DISPATCH_FLOAT(w.dtype(), "is_24_sparse", [&] {
    const scalar_t* p = w.data<scalar_t>();
    for (int64_t g = 0; ok && g < w.numel() / k24Group; ++g) {
      int nz = 0;
      for (int i = 0; i < k24Group; ++i) nz += float(p[g * k24Group + i]) != 0.0f;
      ok = nz <= k24Kept;
    }
  });
  return ok;
}

Sparse24 to_sparse_24(const Tensor& dense0) {
  const Tensor dense = contiguous(dense0);
  check_fits(dense, "to_sparse_24");
  const int64_t rows = dense.size(0), cols = cols_of(dense), mc = meta_cols(cols);
  Sparse24 s{.shape = dense.shape(),
             .values = empty({rows, cols / 2}, {.dtype = dense.dtype(), .device = dense.device()}),
             .meta = zeros({rows, mc}, {.dtype = DType::u8, .device = dense.device()})};
  uint8_t* meta = s.meta.data<uint8_t>();
  MG_DISPATCH_FLOAT(dense.dtype(), "to_sparse_24", [&] {
    const scalar_t* p = dense.data<scalar_t>();
    scalar_t* v = s.values.data<scalar_t>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / k24Group; ++g) {
        const scalar_t* q = p + r * cols + g * k24Group;
        int idx[k24Kept], n = 0;
        for (int i = 0; i < k24Group; ++i)
          if (float(q[i]) != 0.0f) {
            MG_CHECK(n < k24Kept, "to_sparse_24: row ", r, ", group ", g, " (columns ", g * k24Group, "-",
                     g * k24Group + 3, ") holds more than 2 nonzeros; the tensor is not 2:4 sparse");
            idx[n++] = i;
          }
        // fill up with the lowest free indices (their values are zero), then keep them in order
        for (int i = 0; n < k24Kept; ++i)
          if (n == 0 || idx[0] != i) idx[n++] = i;
        if (idx[0] > idx[1]) std::swap(idx[0], idx[1]);
        v[(r * cols + g * k24Group) / 2] = q[idx[0]];
        v[(r * cols + g * k24Group) / 2 + 1] = q[idx[1]];
        meta[r * mc + g / 2] |= uint8_t((idx[0] | idx[1] << 2) << (4 * (g & 1)));
      }
  });
  return s;
}

Tensor to_dense(const Sparse24& s) {
  MG_CHECK(s.shape.size() >= 2 && s.shape[0] > 0 && (numel_of(s.shape) / s.shape[0]) % k24Group == 0,
           "to_dense: ", shape_str(s.shape), " cannot hold a 2:4 tensor (>= 2 dims, rows of a multiple of 4)");
  const int64_t rows = s.shape[0], cols = numel_of(s.shape) / rows, mc = meta_cols(cols);
  MG_CHECK(s.values.defined() && s.values.numel() == rows * cols / 2 && s.values.device().is_cpu(), "to_dense: a 2:4 ",
           shape_str(s.shape), " tensor needs ", rows * cols / 2, " values, got ",
           s.values.defined() ? s.values.numel() : 0);
  MG_CHECK(s.meta.defined() && s.meta.dtype() == DType::u8 && s.meta.numel() == rows * mc && s.meta.device().is_cpu(),
           "to_dense: a 2:4 ", shape_str(s.shape), " tensor needs ", rows * mc, " u8 metadata bytes, got ",
           s.meta.defined() ? s.meta.numel() : 0);
  const Tensor values = contiguous(s.values), metac = contiguous(s.meta);
  Tensor out = zeros(s.shape, {.dtype = values.dtype(), .device = values.device()});
  const uint8_t* meta = metac.data<uint8_t>();
  MG_DISPATCH_FLOAT(values.dtype(), "to_dense", [&] {
    const scalar_t* v = values.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / k24Group; ++g) {
        const int nib = (meta[r * mc + g / 2] >> (4 * (g & 1))) & 15, i0 = nib & 3, i1 = nib >> 2;
        MG_CHECK(i0 < i1, "to_dense: 2:4 metadata of row ", r, ", group ", g, " names indices ", i0, " and ", i1,
                 "; they must increase");
        const int64_t base = r * cols + g * k24Group;
        o[base + i0] = v[base / 2];
        o[base + i1] = v[base / 2 + 1];
      }
  });
  return out;
}

NamedTensors prunable_24_weights(Module& model) {
  NamedTensors out;
  for (auto& [name, m] : model.named_modules()) {
    const std::string prefix = name.empty() ? "" : name + ".";
    if (auto* l = dynamic_cast<Linear*>(m); l && l->weight.defined() && l->in_features % k24Group == 0)
      out.emplace_back(prefix + "weight", l->weight);
    else if (auto* c = dynamic_cast<Conv2d*>(m);
             c && c->kernel_size == 1 && c->params.groups == 1 && c->in_channels % k24Group == 0)
      out.emplace_back(prefix + "weight", c->weight);
  }
  for (const auto& [name, w] : out)
    MG_CHECK(w.device().is_cpu() && w.is_contiguous(), "2:4 prune: weight '", name, "' is on ", w.device().str(),
             "; prune on the host (cpu) and move the model afterwards");
  return out;
}

}  // namespace mg
