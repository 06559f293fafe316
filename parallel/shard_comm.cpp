// f and g of tensor parallelism (see shard_comm.h): each is one Node whose backward is the other
// one's forward. Note [Shard reduction order]: both sums run in device order on one device, so a
// tensor-parallel step is deterministic run to run; against a single device only the split
// matmul's partial sums are reassociated.
#include "parallel/shard_comm.h"

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Sums tensors (some may be undefined: an output no gradient reached) onto `root`, in order.
Tensor ordered_sum(const std::vector<Tensor>& xs, Device root) {
  Tensor acc;
  for (const Tensor& x : xs) {
    if (!x.defined()) continue;
    Tensor here = to(x, root);
    acc = acc.defined() ? add(acc, here) : here;
  }
  return acc;
}

class BroadcastToDevicesBackward : public Node {
 public:
  explicit BroadcastToDevicesBackward(Device src) : src_(src) {}
  std::string_view name() const override { return "BroadcastToDevicesBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {ordered_sum(g, src_)}; }

 private:
  Device src_;
};

class ReduceToDeviceBackward : public Node {
 public:
  explicit ReduceToDeviceBackward(std::vector<Device> devices) : devices_(std::move(devices)) {}
  std::string_view name() const override { return "ReduceToDeviceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    std::vector<Tensor> out;
    for (const Device& d : devices_) out.push_back(to(g[0], d));
    return out;
  }

 private:
  std::vector<Device> devices_;
};

}  // namespace

std::vector<Tensor> broadcast_to_devices(const Tensor& x, const std::vector<Device>& devices) {
  MG_CHECK(x.defined(), "broadcast_to_devices: undefined input");
  MG_CHECK(!devices.empty(), "broadcast_to_devices: no devices");
  OpNameGuard name("broadcast_to_devices");
  std::vector<Tensor> out;
  {
    NoGradGuard no_grad;  // the copies are recorded as one node below
    for (const Device& d : devices) out.push_back(to(x.detach(), d));
  }
  if (auto node = make_node_if_needed<BroadcastToDevicesBackward>({x}, x.device())) set_history(node, {x}, out);
  return out;
}

Tensor reduce_to_device(const std::vector<Tensor>& parts, Device root) {
  MG_CHECK(!parts.empty(), "reduce_to_device: no parts");
  std::vector<Device> devices;
  for (const Tensor& p : parts) {
    MG_CHECK(p.defined() && p.shape() == parts[0].shape() && p.dtype() == parts[0].dtype(),
             "reduce_to_device: every part needs the shape and dtype of the first, ", parts[0].shape(), " ",
             parts[0].dtype(), "; got ", p.defined() ? shape_str(p.shape()) : std::string("(undefined)"));
    devices.push_back(p.device());
  }
  OpNameGuard name("reduce_to_device");
  Tensor out;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> detached;
    for (const Tensor& p : parts) detached.push_back(p.detach());
    // One part already on root: a copy, so the output is not the input under another grad_fn.
    out = parts.size() == 1 && devices[0] == root ? clone(detached[0]) : ordered_sum(detached, root);
  }
  if (auto node = make_node_if_needed<ReduceToDeviceBackward>(parts, devices)) set_history(node, parts, {out});
  return out;
}

}  // namespace mg
