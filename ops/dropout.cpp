// Dropout with a counter-based mask. A call reserves numel stream positions of its generator,
// offset = gen->advance(numel), and keeps element i (row-major over x's shape) iff
// uniform(seed, offset + i) >= p; kept elements are scaled by 1/(1-p). The mask is a pure
// function of (seed, offset, i): it does not depend on threads or chunking, a GPU kernel draws
// the same one, and DropoutBackward recomputes it instead of storing it. So DropoutBackward saves
// no tensor at all, only two integers (seed, offset) and p.
#include "core/rng.h"
#include "ops/cpu_loops.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Uniform numbers at stream positions pos, pos+1, ... of `seed`, drawing each Philox block (4
// positions) once. Equal to Generator(seed).uniform_at(pos) by construction (tested).
class UniformStream {
 public:
  UniformStream(uint64_t seed, uint64_t pos) : seed_(seed), pos_(pos) {}
  float next() {
    if (!filled_ || (pos_ >> 2) != block_) {
      block_ = pos_ >> 2;
      words_ = philox4x32(seed_, 0, block_);
      filled_ = true;
    }
    return uint_to_unit_float(words_[pos_++ & 3]);
  }

 private:
  uint64_t seed_, pos_, block_ = 0;
  std::array<uint32_t, 4> words_{};
  bool filled_ = false;
};

// out[i] = keep(i) ? x[i] / (1 - p) : 0 for contiguous out and x of one shape.
template <class T>
void dropout_kernel(const Tensor& out, const Tensor& x, uint64_t seed, uint64_t offset, double p) {
  using C = compute_t<T>;
  const C scale = C(1.0 / (1.0 - p));
  const float threshold = float(p);
  T* po = typed_base<T>(out);
  const T* px = typed_base<const T>(x);
  parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    UniformStream u(seed, offset + uint64_t(b));
    for (int64_t i = b; i < e; ++i) po[i] = u.next() >= threshold ? T(C(px[i]) * scale) : T(0.0f);
  });
}

// out = mask(seed, offset) * x / (1 - p): the forward, and (with x = dout) the backward.
Tensor apply_mask(const Tensor& x, uint64_t seed, uint64_t offset, double p) {
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() == 0) return out;
  Tensor xc;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);  // a copy only for a strided x (on meta too)
    xc = contiguous(x.detach());
  }
  if (out.is_meta()) return out;
  if (x.device().is_cuda()) {
    cuda::dropout(out, xc, seed, offset, p);  // the same mask (ops/cuda/dropout.cu)
    return out;
  }
  MG_DISPATCH_FLOAT(x.dtype(), "dropout", [&] { dropout_kernel<scalar_t>(out, xc, seed, offset, p); });
  return out;
}

class DropoutBackward : public Node {
 public:
  DropoutBackward(uint64_t seed, uint64_t offset, double p) : seed_(seed), offset_(offset), p_(p) {}
  std::string_view name() const override { return "DropoutBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {apply_mask(g[0], seed_, offset_, p_)}; }

 private:
  uint64_t seed_, offset_;  // the mask, recomputed
  double p_;
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const char* op = "dropout";
  check_defined(op, x, "input");
  check_floating(op, x);
  MG_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  OpNameGuard name(op);
  Generator& g = gen ? *gen : default_generator();
  const uint64_t seed = g.seed();
  const uint64_t offset = g.advance(uint64_t(x.numel()));  // reserved on meta too, so offsets match cpu
  Tensor out = apply_mask(x, seed, offset, p);
  if (auto node = make_node_if_needed<DropoutBackward>({x}, seed, offset, p)) set_history(node, {x}, {out});
  return out;
}

}  // namespace mg
