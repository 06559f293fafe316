// GradScaler (see grad_scaler.h): in-place unscaling with an inf/NaN check on the CPU (one pass
// over each gradient), the same through ops on other devices, and the scale's update rule.
#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/ops.h"

namespace mg {
namespace {

// g *= inv in place; true when every element is finite afterwards (checked on the values before
// scaling as well: inv is a power of two, so finiteness does not change).
bool unscale_cpu(const Tensor& g, double inv) {
  return MG_DISPATCH_FLOAT(g.dtype(), "GradScaler.unscale", [&] {
    using C = compute_t<scalar_t>;
    scalar_t* p = g.data<scalar_t>();
    const C s = C(inv);
    const int64_t n = g.numel();
    constexpr int64_t kChunk = 1 << 15;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<uint8_t> bad(size_t(std::max<int64_t>(chunks, 1)), 0);  // one flag per chunk
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        bool any = false;
        for (int64_t i = c * kChunk, e = std::min(n, i + kChunk); i < e; ++i) {
          const C v = C(p[i]) * s;
          any |= !std::isfinite(v);
          p[i] = scalar_t(v);
        }
        bad[size_t(c)] = any;
      }
    });
    for (uint8_t b : bad)
      if (b) return false;
    return true;
  });
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions opt) : opt_(opt), scale_(opt.init_scale) {
  MG_CHECK(opt_.init_scale > 0 && std::isfinite(opt_.init_scale), "GradScaler: init_scale must be a positive finite "
           "number, got ", opt_.init_scale);
  MG_CHECK(opt_.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ", opt_.growth_factor);
  MG_CHECK(opt_.backoff_factor > 0.0 && opt_.backoff_factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got ",
           opt_.backoff_factor);
  MG_CHECK(opt_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", opt_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  MG_CHECK(loss.defined(), "GradScaler.scale: the loss is an undefined tensor");
  return mul(loss, scale_);
}

bool GradScaler::unscale(Optimizer& opt) {
  if (unscaled_) return !found_inf_;
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  bool finite = true;
  for (auto& group : opt.param_groups()) {
    for (auto& [name, p] : group.params) {
      Tensor g = p.grad();
      if (!g.defined() || g.is_meta() || g.numel() == 0) continue;
      if (g.device().is_cpu() && g.is_contiguous()) {
        finite = unscale_cpu(g, inv) && finite;
      } else {
        // Any device: a new gradient g * inv, and the sum of g * 0 is NaN iff some g is inf/NaN.
        MemoryCategoryGuard tag(MemoryCategory::gradient);
        Tensor scaled = mul(g, inv);
        finite = std::isfinite(sum(mul(g, 0.0)).item_double()) && finite;
        p.set_grad(scaled);
      }
    }
  }
  unscaled_ = true;
  found_inf_ = !finite;
  return finite;
}

bool GradScaler::step(Optimizer& opt) {
  const bool finite = unscale(opt);
  if (finite) opt.step();
  update(!finite);
  return finite;
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= opt_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
  } else if (++growth_tracker_ >= opt_.growth_interval) {
    const double grown = scale_ * opt_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // never grow into an infinite scale
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

nlohmann::json GradScaler::state() const {
  return {{"scale", scale_},
          {"growth_tracker", growth_tracker_},
          {"skipped_steps", skipped_},
          {"growth_factor", opt_.growth_factor},
          {"backoff_factor", opt_.backoff_factor},
          {"growth_interval", opt_.growth_interval}};
}

void GradScaler::load_state(const nlohmann::json& j) {
  MG_CHECK(j.is_object(), "GradScaler.load_state: expected a JSON object, got ", j.type_name());
  auto number = [&](const char* key) {
    MG_CHECK(j.contains(key) && j.at(key).is_number(), "GradScaler.load_state: '", key,
             "' is missing or not a number in ", j.dump());
    return j.at(key);
  };
  auto integer = [&](const char* key) {
    MG_CHECK(j.contains(key) && j.at(key).is_number_integer(), "GradScaler.load_state: '", key,
             "' is missing or not an integer in ", j.dump());
    return j.at(key).get<int64_t>();
  };
  GradScalerOptions o{.init_scale = number("scale").get<double>(),
                      .growth_factor = number("growth_factor").get<double>(),
                      .backoff_factor = number("backoff_factor").get<double>(),
                      .growth_interval = integer("growth_interval")};
  const int64_t tracker = integer("growth_tracker"), skipped = integer("skipped_steps");
  MG_CHECK(tracker >= 0 && skipped >= 0, "GradScaler.load_state: negative counters in ", j.dump());
  GradScaler checked(o);  // validates the scale and factors with the constructor's messages
  opt_ = checked.opt_;
  scale_ = o.init_scale;
  growth_tracker_ = tracker;
  skipped_ = skipped;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace mg
