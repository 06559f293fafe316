// SavedTensor: save (detach, remember version, pack), unpack (version check, unpack), reset.
#include "autograd/saved_tensor.h"

#include <vector>

#include "autograd/node.h"

namespace mg {
namespace {
thread_local std::vector<SavedTensorHooks> t_hooks;
}

SavedTensorHooksGuard::SavedTensorHooksGuard(SavedTensorHooks hooks) { t_hooks.push_back(std::move(hooks)); }
SavedTensorHooksGuard::~SavedTensorHooksGuard() { t_hooks.pop_back(); }
const SavedTensorHooks* current_saved_tensor_hooks() { return t_hooks.empty() ? nullptr : &t_hooks.back(); }

SavedTensor::SavedTensor(Node* owner) : owner_(owner) { owner->saved_.push_back(this); }

void SavedTensor::save(const Tensor& t) {
  MG_INTERNAL_ASSERT(t.defined(), "saving an undefined tensor");
  storage_ = t.storage();
  version_ = t.version();
  state_ = State::saved;
  if (const SavedTensorHooks* h = current_saved_tensor_hooks()) {
    packed_ = h->pack(t.detach());
    unpack_ = h->unpack;
  } else {
    tensor_ = t.detach();
  }
}

Tensor SavedTensor::unpack() const {
  MG_CHECK(state_ != State::released, owner_->name(), ": its saved tensors were already freed by an "
           "earlier backward; call backward with retain_graph to run it twice");
  MG_INTERNAL_ASSERT(state_ == State::saved, "unpacking a saved tensor that was never saved, in ", owner_->name());
  if (auto s = storage_.lock()) {
    MG_CHECK(s->version() == version_, "a tensor saved for the backward of ", owner_->name(),
             " was modified in place after it was saved (version ", version_, " -> ", s->version(),
             ")\n  hint: make a copy before the in-place op, or use the out-of-place form");
  }
  return unpack_ ? unpack_(packed_) : tensor_;
}

void SavedTensor::reset() {
  if (state_ == State::empty) return;
  tensor_ = Tensor();
  packed_.reset();
  unpack_ = nullptr;
  storage_.reset();
  state_ = State::released;
}

}  // namespace mg
