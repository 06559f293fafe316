// Placement: which device each part of a model lives on (model parallelism). A module's
// parameters, gradients and optimizer state live on its device; the activations cross devices
// through to(), an autograd op, where a placed module moves its input (UnaryModule::operator()).
// Written as 'wte,wpe,h.0-1=cpu:0;h.2-3,ln_f=cpu:1': groups of module paths (a component 'A-B'
// expands to A..B) '=' a device. apply_placement checks it against the model before moving anything.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "models/nn/module.h"
#include "parallel/model_layout.h"

namespace mg {

struct Placement {
  std::vector<std::pair<std::string, Device>> entries;  // module path -> device, expanded

  // Parses the map syntax above; errors name the group and what is wrong (no '=', a bad range,
  // a bad device, a path given twice).
  static Placement parse(const std::string& spec);
  // The map syntax again, runs of numbered paths folded into ranges (parse(str()) == *this up to order).
  std::string str() const;
  // The distinct devices in order of first appearance.
  std::vector<Device> devices() const;
};

// Each leaf module of the layout with its device, in forward order.
struct ResolvedPlacement {
  ModelLayout layout;
  std::vector<std::pair<std::string, Device>> leaves;
  Device device_of(const std::string& leaf) const;
  // Where the batch goes in (GPT: token ids and targets) and where the logits and loss come
  // out (a MobileNetV2's labels go there).
  Device input_device() const { return device_of(layout.input); }
  Device output_device() const { return device_of(layout.output); }
  // The modules on `d`, runs folded ("wte,wpe,h.0-3,ln_f"; a block split across devices by its
  // sublayers), for reports and errors.
  std::string modules_on(Device d) const;
  // Every device with its modules: "cpu:0 holds wte,wpe,h.0-3; cpu:1 holds h.4-7,ln_f".
  std::string str() const;
};

// The error with the placement appended, so an out-of-memory on one device (which the
// allocator's message names) also says which modules live there. Rethrow what it returns.
OutOfMemoryError with_placement(const OutOfMemoryError& e, const ResolvedPlacement& r);

// Checks a placement against the model and returns where every leaf goes. One error lists every
// problem: an unknown module path, a module that cannot be placed on its own, a module placed
// twice (also through a containing module) or not at all, a device that does not exist.
ResolvedPlacement resolve_placement(Module& model, const Placement& placement);

// Moves every leaf module (parameters, buffers, gradients) to its device and sets the input
// device of every placeable module whose parameters all live on one device, so the forward
// moves activations where they cross. Call before building the optimizer (its state is created
// on each parameter's device at the first step) and with no graph alive. Returns the resolution.
ResolvedPlacement apply_placement(Module& model, const Placement& placement);

// Folds numbered paths into ranges: {"h.0", "h.1", "h.2", "ln_f"} -> "h.0-2,ln_f".
// cpu:N and meta:N always exist; cuda:N when this memgrad has the CUDA backend and the machine
// has that GPU (else false, and `why` says what there is).
bool device_exists(Device d, std::string& why);

std::string fold_paths(const std::vector<std::string>& paths);

}  // namespace mg
