// Activation offload through saved-tensor hooks (see offload.h). pack: an activation on another
// device than the target is copied there (a fresh contiguous tensor in the target's pool, tagged
// activation) and its original dropped by the caller; unpack: copied back to the device it came
// from, tagged activation (backward would otherwise tag it gradient), and freed after its node ran.
#include "autograd/offload.h"

#include <any>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/memory_category.h"

namespace mg {

namespace {

// A saved tensor either kept as it is or parked on the target device.
struct Packed {
  Tensor kept;                      // not offloaded
  std::shared_ptr<Tensor> parked;   // offloaded copy (shared between savers of the same region)
  Device home = kCPU;
};

Tensor copy_to(const Tensor& x, Device d) {
  MemoryCategoryGuard tag(MemoryCategory::activation);
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = d});
  copy_(out, x);
  return out;
}

}  // namespace

struct ActivationOffload::State {
  Device target;
  OffloadStats stats;
  // (storage, offset, sizes, strides) -> the parked copy, while the original storage is alive
  // (so a recycled address can never match a dead region).
  using Key = std::tuple<const Storage*, int64_t, Shape, Shape>;
  std::map<Key, std::pair<std::weak_ptr<Storage>, std::weak_ptr<Tensor>>> parked;
};

ActivationOffload::ActivationOffload(Device target) : state_(std::make_shared<State>()) {
  state_->target = target;
  std::weak_ptr<State> weak = state_;
  SavedTensorHooks hooks;
  hooks.pack = [weak](const Tensor& t) -> std::any {
    auto st = weak.lock();
    Packed p;
    p.home = t.device();
    if (!st || t.device() == st->target || t.storage()->category() != MemoryCategory::activation) {
      p.kept = t;
      return p;
    }
    // Meta parks on meta (shapes and bytes: how the planner measures offload); data never moves
    // to or from meta.
    MG_CHECK(t.is_meta() == st->target.is_meta(), "activation offload: cannot park a tensor of ", t.device().str(),
             " on ", st->target.str(), " (meta offloads to another meta device, data to a device with data)");
    const State::Key key{t.storage().get(), t.storage_offset(), t.shape(), t.strides()};
    auto it = st->parked.find(key);
    if (it != st->parked.end() && !it->second.first.expired())
      if (auto copy = it->second.second.lock()) {
        p.parked = copy;
        return p;
      }
    p.parked = std::make_shared<Tensor>(copy_to(t, st->target));
    st->parked[key] = {t.storage(), p.parked};
    st->stats.tensors += 1;
    st->stats.bytes += t.numel() * int64_t(t.element_size());
    return p;
  };
  hooks.unpack = [](const std::any& a) -> Tensor {
    const Packed& p = std::any_cast<const Packed&>(a);
    return p.parked ? copy_to(*p.parked, p.home) : p.kept;
  };
  hooks_ = std::make_unique<SavedTensorHooksGuard>(std::move(hooks));
}

ActivationOffload::~ActivationOffload() = default;
const OffloadStats& ActivationOffload::stats() const { return state_->stats; }
Device ActivationOffload::target() const { return state_->target; }

}  // namespace mg
