// The standard layers as Modules: each owns its parameters (initialised like PyTorch's defaults,
// from the InitOptions' generator) and calls the functional op of ops/ops.h in forward, inside
// its forward_scope() so the profiler sees where the memory went. Containers: Sequential (a chain
// of UnaryModules, children "0", "1", ...) and ModuleList (an indexed list, no forward).
// Shapes: N batch, C channels/features, H W spatial, V vocabulary.
#pragma once
#include <memory>
#include <vector>

#include "models/nn/module.h"
#include "ops/ops.h"

namespace mg {

// x: (..., in) -> (..., out). weight (out, in) and bias (out) ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const InitOptions& init = {});
  Tensor forward(const Tensor& x) override;
  int64_t in_features, out_features;
  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined without bias

 protected:
  // For subclasses that store the weight in another form (models/compress/ quantized layers):
  // sizes only, no parameters registered.
  Linear(std::string type_name, int64_t in_features, int64_t out_features);
};

// x: (N, Cin, H, W) -> (N, Cout, H', W'). weight (Cout, Cin/groups, K, K) and bias (Cout)
// ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = Cin/groups * K * K (PyTorch's default).
class Conv2d : public UnaryModule {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dParams params = {},
         bool bias = true, const InitOptions& init = {});
  Tensor forward(const Tensor& x) override;
  int64_t in_channels, out_channels, kernel_size;
  Conv2dParams params;
  Tensor weight;  // (Cout, Cin/groups, K, K)
  Tensor bias;    // (Cout), undefined without bias
};

// x: (N, C, H, W) or (N, C). Training normalises with the batch statistics and updates the
// running ones (new = (1 - momentum) * old + momentum * batch); eval uses the running ones.
// Parameters weight = 1, bias = 0; buffers running_mean = 0, running_var = 1 (in the init dtype)
// and num_batches_tracked (i64 scalar, counts training forwards as in PyTorch).
class BatchNorm2d : public UnaryModule {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       const InitOptions& init = {});
  Tensor forward(const Tensor& x) override;
  // relu6(forward(x)) through batch_norm_relu6: saves no separate tensor for the ReLU6.
  Tensor forward_relu6(const Tensor& x);
  int64_t num_features;
  double eps, momentum;
  Tensor weight, bias;              // (C)
  Tensor running_mean, running_var; // (C)
  Tensor num_batches_tracked;       // () i64

 private:
  Tensor normalize(const Tensor& x, bool relu6);
};

// x: (..., C) -> (..., C), normalised over the last dim; weight = 1, bias = 0.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool bias = true, const InitOptions& init = {});
  Tensor forward(const Tensor& x) override;
  int64_t normalized_size;
  double eps;
  Tensor weight;  // (C)
  Tensor bias;    // (C), undefined without bias
};

// indices: (...) i64/i32 -> (..., C). weight (V, C) ~ N(0, std^2) (PyTorch: std = 1).
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, double std = 1.0, const InitOptions& init = {});
  Tensor forward(const Tensor& indices) override;
  int64_t num_embeddings, embedding_dim;
  Tensor weight;  // (V, C)
};

// Zeroes elements with probability p while training (scaling the rest by 1/(1-p)); identity in
// eval. The mask comes from `gen` (the default generator when null).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  double p;

 private:
  Generator* gen_;
};

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class ReLU6 : public UnaryModule {
 public:
  ReLU6() : UnaryModule("ReLU6") {}
  Tensor forward(const Tensor& x) override;
};

// The tanh approximation (GPT-2's): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
class GELU : public UnaryModule {
 public:
  GELU() : UnaryModule("GELU") {}
  Tensor forward(const Tensor& x) override;
};

class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

// Runs its layers in order; they are children "0", "1", ... (as in PyTorch's nn.Sequential).
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  // Appends a layer (named by its index) and returns it typed.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    layers_.push_back(m);
    add_child(std::to_string(layers_.size() - 1), m);
    return m;
  }
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const;
  // Swaps layer i for `m` (models/compress/: folded or quantized layers).
  void replace(size_t i, std::shared_ptr<UnaryModule> m);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

// An indexed list of modules (children "0", "1", ...) with no forward of its own: the owner
// calls its elements. Its elements' forward scopes read "<list name>.<i>" (e.g. "h.3"), since
// the list itself never runs a forward that would push its name.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(modules_.size()), m);
    modules_.push_back(m);
    set_scope_name_of(*m, element_scope(modules_.size() - 1));
    return m;
  }
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // Element i as its concrete type (an error naming both types when it is not one).
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    MG_CHECK(m != nullptr, "ModuleList: element ", i, " is a ", (*this)[i]->type_name(), ", not the requested type");
    return m;
  }

 protected:
  void set_scope_name(const std::string& s) override;

 private:
  std::string element_scope(size_t i) const;
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace mg
