// gradcheck (see gradcheck.h): analytical gradients of a random projection of the output
// against central differences, element by element, all in f64.
#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/rng.h"

namespace mg {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad())
      MG_CHECK(inputs[i].dtype() == DType::f64, "gradcheck: input ", i, " is ", inputs[i].dtype(),
               "; gradcheck needs f64 inputs");
  Tensor out = fn(inputs);
  MG_CHECK(out.dtype() == DType::f64, "gradcheck: the function returned ", out.dtype(), ", expected f64");
  Generator gen(opt.seed);
  std::vector<double> r(size_t(out.numel()));
  for (size_t k = 0; k < r.size(); ++k) r[k] = 2.0 * gen.uniform_at(k) - 1.0;
  Tensor rt = from_vector(r, out.shape(), {.dtype = DType::f64});

  auto projected = [&]() {
    NoGradGuard ng;
    std::vector<double> v = fn(inputs).to_double_vector();
    double s = 0;
    for (size_t k = 0; k < v.size(); ++k) s += v[k] * r[k];
    return s;
  };

  for (const Tensor& x : inputs)
    if (x.requires_grad()) x.set_grad(Tensor());
  if (!out.requires_grad()) return {false, "gradcheck: the output does not require grad"};
  backward(out, rt);

  GradcheckResult res;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    std::vector<double> analytic = x.grad().defined() ? x.grad().to_double_vector()
                                                      : std::vector<double>(size_t(x.numel()), 0.0);
    // Perturb through a strided walk over x's logical elements.
    double* base = static_cast<double*>(x.storage()->data()) + x.storage_offset();
    Shape idx(x.shape().size(), 0);
    for (int64_t k = 0; k < x.numel(); ++k) {
      int64_t off = 0;
      for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * x.strides()[d];
      double orig = base[off];
      base[off] = orig + opt.eps;
      double plus = projected();
      base[off] = orig - opt.eps;
      double minus = projected();
      base[off] = orig;
      double numeric = (plus - minus) / (2 * opt.eps);
      double a = analytic[size_t(k)];
      if (!(std::abs(a - numeric) <= opt.atol + opt.rtol * std::abs(numeric))) {
        std::ostringstream os;
        os << "gradcheck: input " << i << " " << shape_str(x.shape()) << " element " << k << ": analytical "
           << a << " vs numerical " << numeric;
        return {false, os.str()};
      }
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < x.shape()[d]) break;
        idx[d] = 0;
      }
    }
  }
  return res;
}

}  // namespace mg
