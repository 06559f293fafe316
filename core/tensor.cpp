// Tensor: accessors, autograd fields, raw views, printing, and the factories and memory
// primitives (fill_, copy_, accumulate_) that need no autograd.
#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/cuda/backend.h"
#include "core/flop_counter.h"
#include "core/half_convert.h"
#include "core/parallel.h"
#include "core/strided_loop.h"

namespace mg {

TensorImpl::~TensorImpl() = default;

namespace {

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MG_CHECK(d >= 0, "cannot create a tensor with a negative size: ", shape_str(shape));
  // A shape read from a file can name more bytes than 63 bits hold (tests/fuzz/fuzz_idx.cpp).
  // Zero sizes count as 1: the contiguous strides of an empty tensor must be representable too.
  int64_t bytes = int64_t(dtype_size(dtype));
  for (int64_t d : shape)
    MG_CHECK(!__builtin_mul_overflow(bytes, d > 0 ? d : 1, &bytes), "cannot create a tensor of shape ",
             shape_str(shape), ": its sizes multiply past 63 bits");
  MG_CHECK(device.type != DeviceType::cuda || backend_available(DeviceType::cuda), "no CUDA device: ",
           device.str(), " was requested but this memgrad has no CUDA backend");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(numel_of(shape)) * dtype_size(dtype), device);
  // For the planner's cost model: the elements, and the block whose release ends their reuse.
  count_elements(numel_of(shape), impl->storage->nbytes(), device, impl->storage->block_id());
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return impl;
}

AutogradMeta& autograd_meta(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_unique<AutogradMeta>();
  return *m;
}

template <typename T>
double load_as_double(const void* p) {
  return double(static_cast<compute_t<T>>(*static_cast<const T*>(p)));
}

double read_element(const char* p, DType dt) {
  return MG_DISPATCH_ALL(dt, "read", [&] { return load_as_double<scalar_t>(p); });
}

void write_element(char* p, DType dt, double v) {
  MG_DISPATCH_ALL(dt, "write", [&] {
    *reinterpret_cast<scalar_t*>(p) = convert_scalar<scalar_t, double>(v);
  });
}

// n contiguous elements converted; f32 <-> f16 / bf16 take the vectorised core/half_convert.h.
template <class S, class D, class F>
void convert_contiguous(const S* s, D* d, int64_t n, F convert) {
  constexpr bool f32_half = (std::is_same_v<S, float> && (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)) ||
                            (std::is_same_v<D, float> && (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>));
  if constexpr (f32_half) convert_span(s, d, n);
  else
    for (int64_t i = 0; i < n; ++i) d[i] = convert(s[i]);
}

void check_host(const Tensor& t, const char* op) {
  MG_CHECK(t.device().is_cpu(), op, ": needs a cpu tensor, got one on ", t.device().str());
}

}  // namespace

int64_t Tensor::size(int64_t d) const { return shape()[size_t(wrap_dim(d, dim(), "size"))]; }
int64_t Tensor::stride(int64_t d) const { return strides()[size_t(wrap_dim(d, dim(), "stride"))]; }

bool Tensor::is_contiguous() const {
  const auto& sz = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = sz.size(); i-- > 0;) {
    if (sz[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sz[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  char* base = static_cast<char*>(storage()->data());
  return base + storage_offset() * int64_t(element_size());
}

double Tensor::item_double() const {
  MG_CHECK(numel() == 1, "item(): tensor has ", numel(), " elements ", shape_str(shape()),
           ", item() needs exactly one");
  if (!device().is_cpu()) {
    MG_CHECK(!is_meta(), "item(): tensor is on meta and has no value");
    char buf[8];
    copy_bytes(buf, kCPU, data_ptr(), device(), element_size());
    return read_element(buf, dtype());
  }
  return read_element(static_cast<const char*>(data_ptr()), dtype());
}

std::vector<double> Tensor::to_double_vector() const {
  MG_CHECK(!is_meta(), "to_vector(): tensor is on meta and has no values");
  std::vector<char> bytes(nbytes());
  copy_to_contiguous_bytes(*this, bytes.data());
  std::vector<double> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = read_element(bytes.data() + i * element_size(), dtype());
  return out;
}

bool Tensor::requires_grad() const {
  const auto& m = impl()->autograd;
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool r) {
  MG_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating tensors can require a "
           "gradient, this one is ", dtype());
  MG_CHECK(is_leaf(), "set_requires_grad: only leaf tensors (not results of ops) can be marked; use "
           "detach() first");
  autograd_meta(*this).requires_grad = r;
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  const auto& m = impl()->autograd;
  return m ? m->grad : undefined;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    MG_CHECK(g.shape() == shape(), "set_grad: gradient shape ", shape_str(g.shape()),
             " does not match tensor shape ", shape_str(shape()));
  autograd_meta(*this).grad = g;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  const auto& m = impl()->autograd;
  return m ? m->grad_fn : none;
}

uint32_t Tensor::output_nr() const {
  const auto& m = impl()->autograd;
  return m ? m->output_nr : 0;
}

void Tensor::set_grad_fn(std::shared_ptr<Node> fn, uint32_t nr) const {
  auto& m = autograd_meta(*this);
  m.grad_fn = std::move(fn);
  m.output_nr = nr;
}

void Tensor::add_grad_ready_hook(GradReadyHook h) const { autograd_meta(*this).grad_ready_hooks.push_back(std::move(h)); }

const std::vector<GradReadyHook>& Tensor::grad_ready_hooks() const {
  static const std::vector<GradReadyHook> none;
  const auto& m = impl()->autograd;
  return m ? m->grad_ready_hooks : none;
}

Tensor Tensor::as_strided(Shape sizes, Shape strides_, int64_t offset) const {
  MG_CHECK(sizes.size() == strides_.size(), "as_strided: ", sizes.size(), " sizes but ", strides_.size(), " strides");
  // The view must stay inside the storage.
  int64_t max_off = offset;
  for (size_t i = 0; i < sizes.size(); ++i) {
    MG_CHECK(sizes[i] >= 0 && strides_[i] >= 0, "as_strided: negative size or stride");
    if (sizes[i] == 0) max_off = -1;
    else if (max_off >= 0) max_off += (sizes[i] - 1) * strides_[i];
  }
  MG_CHECK(offset >= 0 && (max_off < 0 || size_t(max_off + 1) * element_size() <= storage()->nbytes()),
           "as_strided: view ", shape_str(sizes), " at offset ", offset, " reaches outside its storage of ",
           storage()->nbytes(), " bytes");
  auto impl2 = std::make_shared<TensorImpl>();
  impl2->storage = storage();
  impl2->offset = offset;
  impl2->sizes = std::move(sizes);
  impl2->strides = std::move(strides_);
  impl2->dtype = dtype();
  return Tensor(std::move(impl2));
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), storage_offset()); }

// ---- printing ---------------------------------------------------------------------------------

namespace {
void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& s, size_t d, size_t& pos,
               bool floating, int indent) {
  if (s.empty()) {
    os << v[pos++];
    return;
  }
  os << "[";
  int64_t n = s[d];
  const int64_t edge = 3;
  bool summarize = n > 2 * edge + 1 && v.size() > 1000;
  int64_t inner = 1;
  for (size_t k = d + 1; k < s.size(); ++k) inner *= s[k];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && i == edge) {
      os << "..., ";
      pos += size_t((n - 2 * edge) * inner);
      i = n - edge - 1;
      continue;
    }
    if (d + 1 == s.size()) {
      if (floating) os << std::fixed << v[pos++];
      else os << static_cast<long long>(v[pos++]);
    } else {
      print_rec(os, v, s, d + 1, pos, floating, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == s.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
  }
  os << "]";
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os.precision(4);
  os << "tensor(";
  if (is_meta()) {
    os << "..., size=" << shape_str(shape());
  } else {
    std::vector<double> v = to_double_vector();
    size_t pos = 0;
    print_rec(os, v, shape(), 0, pos, is_floating(dtype()), 7);
  }
  os << ", dtype=" << dtype() << ", device=" << device().str();
  if (requires_grad()) os << (is_leaf() ? ", requires_grad=true" : ", requires_grad=true (computed)");
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- factories ---------------------------------------------------------------------------------

Tensor empty(const Shape& shape, const TensorOptions& opt) {
  Tensor t(make_impl(shape, opt.dtype, opt.device));
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor zeros(const Shape& shape, const TensorOptions& opt) { return full(shape, 0.0, opt); }
Tensor ones(const Shape& shape, const TensorOptions& opt) { return full(shape, 1.0, opt); }

Tensor full(const Shape& shape, double value, const TensorOptions& opt) {
  TensorOptions o = opt;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  fill_(t, value);
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor arange(double start, double end, double step, const TensorOptions& opt) {
  MG_CHECK(step != 0, "arange: step must not be zero");
  double n = std::ceil((end - start) / step);
  int64_t count = n > 0 ? int64_t(n) : 0;
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = start + double(i) * step;
  return from_vector(v, {count}, opt);
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opt) {
  MG_CHECK(int64_t(values.size()) == numel_of(shape), "from_vector: ", values.size(), " values do not fill shape ",
           shape_str(shape), " (", numel_of(shape), " elements)");
  if (opt.device.is_meta()) {  // no values to hold: no host staging either (a meta step allocates on meta only)
    Tensor t = empty(shape, {.dtype = opt.dtype, .device = opt.device});
    if (opt.requires_grad) t.set_requires_grad(true);
    return t;
  }
  TensorOptions host = opt;
  host.device = opt.device.is_cpu() ? opt.device : kCPU;
  host.requires_grad = false;
  Tensor t = empty(shape, host);
  char* p = static_cast<char*>(t.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) write_element(p + i * t.element_size(), t.dtype(), values[i]);
  if (!opt.device.is_cpu()) {
    Tensor d = empty(shape, {.dtype = opt.dtype, .device = opt.device});
    copy_bytes(d.is_meta() ? nullptr : d.data_ptr(), d.device(), t.data_ptr(), t.device(), t.nbytes());
    t = d;
  }
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor scalar_tensor(double value, const TensorOptions& opt) { return full({}, value, opt); }

// ---- memory primitives -------------------------------------------------------------------------

void fill_(const Tensor& t, double value) {
  t.bump_version();
  if (t.is_meta() || t.numel() == 0) return;
  if (t.device().is_cuda()) return cuda::fill(t, value);
  check_host(t, "fill_");
  MG_DISPATCH_ALL(t.dtype(), "fill_", [&] {
    scalar_t v = convert_scalar<scalar_t, double>(value);
    scalar_t* base = static_cast<scalar_t*>(t.storage()->data()) + t.storage_offset();
    if (t.is_contiguous()) {
      int64_t n = t.numel();
      parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(base + b, base + e, v); });
      return;
    }
    for_each_row<1>(t.shape(), {t.strides().data()}, {0}, 0, num_rows(t.shape()),
                    [&](const std::array<int64_t, 1>& off, int64_t len, const std::array<int64_t, 1>& st) {
                      for (int64_t i = 0; i < len; ++i) base[off[0] + i * st[0]] = v;
                    });
  });
}

void copy_(const Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.shape() == src.shape(), "copy_: shapes differ: ", shape_str(dst.shape()), " vs ", shape_str(src.shape()));
  dst.bump_version();
  if (dst.numel() == 0) return;
  // Between two meta devices the staging below allocates as it does between two devices with
  // data (a meta step's offload: meta:0 -> meta:1), so only the bytes are skipped; any other copy
  // into meta is shapes only.
  const bool meta_to_meta = dst.is_meta() && src.is_meta() && dst.device() != src.device();
  if (dst.is_meta() && !meta_to_meta) return;
  if (dst.device() == src.device() && dst.device().is_cuda()) return cuda::copy(dst, src);
  if (dst.device() != src.device()) {
    MG_CHECK(!src.is_meta() || meta_to_meta, "copy_: cannot copy from meta to ", dst.device().str(),
             ": meta tensors have no data");
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
      if (!meta_to_meta) copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes());
      return;
    }
    // Convert and compact on the source device, move the bytes, scatter on the destination.
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor packed = src;
    if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
      packed = empty(src.shape(), {.dtype = dst.dtype(), .device = src.device()});
      copy_(packed, src);
    }
    if (dst.is_contiguous()) return copy_(dst, packed);
    Tensor landed = empty(dst.shape(), {.dtype = dst.dtype(), .device = dst.device()});
    copy_(landed, packed);
    return copy_(dst, landed);
  }
  MG_CHECK(dst.device().is_cpu(), "copy_: no kernel for ", dst.device().str());
  MG_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
    using D = scalar_t;
    D* d = static_cast<D*>(dst.storage()->data()) + dst.storage_offset();
    MG_DISPATCH_ALL(src.dtype(), "copy_", [&] {
      using S = scalar_t;
      const S* s = static_cast<const S*>(src.storage()->data()) + src.storage_offset();
      auto convert = [](S x) { return convert_scalar<D, S>(x); };
      if (dst.is_contiguous() && src.is_contiguous()) {
        if (dst.dtype() == src.dtype()) {
          std::memcpy(static_cast<void*>(d), static_cast<const void*>(s), dst.nbytes());
        } else {
          parallel_for(0, dst.numel(), 1 << 15, [&](int64_t b, int64_t e) {
            convert_contiguous(s + b, d + b, e - b, convert);
          });
        }
        return;
      }
      int64_t rows = num_rows(dst.shape());
      parallel_for(0, rows, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, dst.shape().empty() ? 1 : dst.shape().back())),
                   [&](int64_t rb, int64_t re) {
                     for_each_row<2>(dst.shape(), {dst.strides().data(), src.strides().data()}, {0, 0}, rb, re,
                                     [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& st) {
                                       for (int64_t i = 0; i < len; ++i) d[off[0] + i * st[0]] = convert(s[off[1] + i * st[1]]);
                                     });
                   });
    });
  });
}

void accumulate_(const Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
           "accumulate_: gradient ", shape_str(src.shape()), " ", src.dtype(), " on ", src.device().str(),
           " does not match ", shape_str(dst.shape()), " ", dst.dtype(), " on ", dst.device().str());
  dst.bump_version();
  if (dst.is_meta() || dst.numel() == 0) return;
  if (dst.device().is_cuda()) return cuda::accumulate(dst, src);
  check_host(dst, "accumulate_");
  MG_DISPATCH_NUMERIC(dst.dtype(), "accumulate_", [&] {
    scalar_t* d = static_cast<scalar_t*>(dst.storage()->data()) + dst.storage_offset();
    const scalar_t* s = static_cast<const scalar_t*>(src.storage()->data()) + src.storage_offset();
    using C = compute_t<scalar_t>;
    if (dst.is_contiguous() && src.is_contiguous()) {
      parallel_for(0, dst.numel(), 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = scalar_t(C(d[i]) + C(s[i]));
      });
      return;
    }
    for_each_row<2>(dst.shape(), {dst.strides().data(), src.strides().data()}, {0, 0}, 0, num_rows(dst.shape()),
                    [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& st) {
                      for (int64_t i = 0; i < len; ++i) {
                        scalar_t& x = d[off[0] + i * st[0]];
                        x = scalar_t(C(x) + C(s[off[1] + i * st[1]]));
                      }
                    });
  });
}

void copy_to_contiguous_bytes(const Tensor& t, void* dst) {
  MG_CHECK(!t.is_meta(), "cannot read the data of a meta tensor");
  if (!t.device().is_cpu()) {
    if (t.is_contiguous()) return copy_bytes(dst, kCPU, t.data_ptr(), t.device(), t.nbytes());
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor packed = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});  // compacted on the device
    copy_(packed, t);
    return copy_bytes(dst, kCPU, packed.data_ptr(), packed.device(), packed.nbytes());
  }
  if (t.is_contiguous()) {
    std::memcpy(dst, t.data_ptr(), t.nbytes());
    return;
  }
  size_t es = t.element_size();
  const char* base = static_cast<const char*>(t.storage()->data()) + t.storage_offset() * int64_t(es);
  char* out = static_cast<char*>(dst);
  for_each_row<1>(t.shape(), {t.strides().data()}, {0}, 0, num_rows(t.shape()),
                  [&](const std::array<int64_t, 1>& off, int64_t len, const std::array<int64_t, 1>& st) {
                    for (int64_t i = 0; i < len; ++i, out += es) std::memcpy(out, base + (off[0] + i * st[0]) * int64_t(es), es);
                  });
}

}  // namespace mg
