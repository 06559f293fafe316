// NamedTensors: an ordered list of (name, tensor) pairs, the currency of state dicts, optimizer
// parameter lists and safetensors files. It lives in core (next to Tensor) so that every library
// above can pass one around without depending on models/ (where Module produces them).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace mg
