// Bitmask + packed values (see sparse_format.h).
#include "models/compress/sparse_format.h"

#include "models/compress/sparse_24.h"

#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/safetensors.h"
#include "ops/ops.h"

namespace mg {
namespace {

constexpr const char* kBits = ".__bits";
constexpr const char* kValues = ".__values";
constexpr const char* kMetaPrefix = "sparse.";
constexpr const char* k24Values = ".__24values";
constexpr const char* k24Meta = ".__24meta";
constexpr const char* k24MetaPrefix = "sparse24.";

void check_host(const Tensor& t, const char* op) {
  MG_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), op, ": expected a contiguous cpu tensor");
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out;
}

Shape parse_shape(const std::string& text, const std::string& what) {
  Shape s;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    MG_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos, what, ": bad shape '", text, "'");
    s.push_back(std::stoll(part));
  }
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Tensor nonzero_bits(const Tensor& t0) {
  Tensor t = contiguous(t0);
  check_host(t, "nonzero_bits");
  const int64_t n = t.numel();
  Tensor bits = zeros({(n + 7) / 8}, {.dtype = DType::u8, .device = t.device()});
  uint8_t* b = bits.data<uint8_t>();
  MG_DISPATCH_FLOAT(t.dtype(), "nonzero_bits", [&] {
    const scalar_t* p = t.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i)
      if (float(p[i]) != 0.0f) b[i >> 3] |= uint8_t(1u << (i & 7));
  });
  return bits;
}

void apply_bits_(const Tensor& t, const Tensor& bits) {
  check_host(t, "apply_bits_");
  MG_CHECK(bits.dtype() == DType::u8 && bits.numel() == (t.numel() + 7) / 8, "apply_bits_: a mask of ", bits.numel(),
           " bytes does not fit a tensor of ", t.numel(), " elements");
  const uint8_t* b = bits.data<uint8_t>();
  const int64_t n = t.numel();
  MG_DISPATCH_FLOAT(t.dtype(), "apply_bits_", [&] {
    scalar_t* p = t.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i)
      if (!((b[i >> 3] >> (i & 7)) & 1u)) p[i] = scalar_t(0.0f);
  });
  t.bump_version();
}

int64_t count_bits(const Tensor& bits, int64_t n) {
  const uint8_t* b = bits.data<uint8_t>();
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += (b[i >> 3] >> (i & 7)) & 1u;
  return c;
}

BitmaskSparse to_bitmask_sparse(const Tensor& dense0) {
  Tensor dense = contiguous(dense0);
  check_host(dense, "to_bitmask_sparse");
  BitmaskSparse s{.shape = dense.shape(), .bits = nonzero_bits(dense)};
  const int64_t n = dense.numel(), nnz = count_bits(s.bits, n);
  s.values = empty({nnz}, {.dtype = dense.dtype(), .device = dense.device()});
  const size_t es = dense.element_size();
  const auto* src = static_cast<const char*>(dense.data_ptr());
  auto* dst = static_cast<char*>(s.values.data_ptr());
  const uint8_t* b = s.bits.data<uint8_t>();
  for (int64_t i = 0, k = 0; i < n; ++i)
    if ((b[i >> 3] >> (i & 7)) & 1u) std::memcpy(dst + size_t(k++) * es, src + size_t(i) * es, es);
  return s;
}

Tensor to_dense(const BitmaskSparse& s) {
  const int64_t n = numel_of(s.shape);
  MG_CHECK(s.bits.dtype() == DType::u8 && s.bits.numel() == (n + 7) / 8, "to_dense: the bitmask has ",
           s.bits.numel(), " bytes, a tensor of shape ", shape_str(s.shape), " needs ", (n + 7) / 8);
  MG_CHECK(count_bits(s.bits, n) == s.values.numel(), "to_dense: the bitmask marks ", count_bits(s.bits, n),
           " nonzeros but ", s.values.numel(), " values are stored");
  Tensor out = zeros(s.shape, {.dtype = s.values.dtype(), .device = s.values.device()});
  const size_t es = out.element_size();
  const auto* src = static_cast<const char*>(s.values.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const uint8_t* b = s.bits.data<uint8_t>();
  for (int64_t i = 0, k = 0; i < n; ++i)
    if ((b[i >> 3] >> (i & 7)) & 1u) std::memcpy(dst + size_t(i) * es, src + size_t(k++) * es, es);
  return out;
}

int64_t save_sparse_safetensors(const std::string& path, const NamedTensors& tensors, SparseLayout layout) {
  NamedTensors entries;
  std::map<std::string, std::string> meta{{"format", "memgrad-bitmask-sparse"}};
  int64_t bytes = 0;
  for (const auto& [name, t0] : tensors) {
    const Tensor t = t0.device().is_cpu() ? contiguous(t0) : to(t0, kCPU);
    if (layout == SparseLayout::two_four && is_floating(t.dtype()) && t.numel() > 0 && is_24_sparse(t)) {
      Sparse24 s = to_sparse_24(t);
      entries.emplace_back(name + k24Values, s.values);
      entries.emplace_back(name + k24Meta, s.meta);
      meta[k24MetaPrefix + name] = shape_text(t.shape());
      bytes += s.nbytes();
      continue;
    }
    if (is_floating(t.dtype()) && t.numel() > 0) {
      BitmaskSparse s = to_bitmask_sparse(t);
      if (s.nbytes() < int64_t(t.nbytes())) {
        entries.emplace_back(name + kBits, s.bits);
        entries.emplace_back(name + kValues, s.values);
        meta[kMetaPrefix + name] = shape_text(t.shape());
        bytes += s.nbytes();
        continue;
      }
    }
    entries.emplace_back(name, t);
    bytes += int64_t(t.nbytes());
  }
  save_safetensors(path, entries, meta);
  return bytes;
}

NamedTensors load_sparse_safetensors(const std::string& path, int64_t* stored_bytes) {
  const std::map<std::string, std::string> meta = load_safetensors_metadata(path);
  std::map<std::string, Tensor> parts;
  NamedTensors file = load_safetensors(path);
  int64_t bytes = 0;
  for (const auto& [name, t] : file) {
    parts[name] = t;
    bytes += int64_t(t.nbytes());
  }
  NamedTensors out;
  for (const auto& [name, t] : file) {
    if (ends_with(name, kValues) || ends_with(name, k24Meta)) continue;  // read with its bits / values
    if (ends_with(name, k24Values)) {
      const std::string base = name.substr(0, name.size() - std::strlen(k24Values));
      auto m = meta.find(k24MetaPrefix + base);
      auto mt = parts.find(base + k24Meta);
      MG_CHECK(m != meta.end() && mt != parts.end(), "load_sparse_safetensors: '", path, "': 2:4 entry '", base,
               "' lacks its ", m == meta.end() ? "shape in the metadata" : "metadata tensor");
      const std::string what = "load_sparse_safetensors: '" + path + "': entry '" + base + "'";
      try {
        out.emplace_back(base, to_dense(Sparse24{.shape = parse_shape(m->second, what), .values = t, .meta = mt->second}));
      } catch (const Error& e) {
        MG_THROW(what, ": ", e.what());
      }
      continue;
    }
    if (!ends_with(name, kBits)) {
      out.emplace_back(name, t);
      continue;
    }
    const std::string base = name.substr(0, name.size() - std::strlen(kBits));
    auto m = meta.find(kMetaPrefix + base);
    auto v = parts.find(base + kValues);
    MG_CHECK(m != meta.end() && v != parts.end(), "load_sparse_safetensors: '", path, "': sparse entry '", base,
             "' lacks its ", m == meta.end() ? "shape in the metadata" : "values");
    const std::string what = "load_sparse_safetensors: '" + path + "': entry '" + base + "'";
    try {
      out.emplace_back(base, to_dense(BitmaskSparse{.shape = parse_shape(m->second, what), .bits = t, .values = v->second}));
    } catch (const Error& e) {
      MG_THROW(what, ": ", e.what());
    }
  }
  if (stored_bytes) *stored_bytes = bytes;
  return out;
}

}  // namespace mg
