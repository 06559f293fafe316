// The README's C++ example, built and run by the test suite so it stays true: train a small MLP on
// two spirals on its own device pool under a 16 MiB budget, print that pool's memory statistics,
// and catch the OutOfMemoryError of a tensor that does not fit.
#include <cstdio>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "data/synthetic.h"
#include "models/nn/nn.h"
#include "ops/ops.h"
#include "optim/optim.h"

int main() {
  mg::Device dev("cpu:1");                             // its own pool, budget and statistics
  mg::set_memory_limit(dev, mg::parse_bytes("16MiB"));  // a small GPU

  mg::Generator gen(42);
  mg::InitOptions init{.gen = &gen, .device = dev};
  mg::Sequential net({std::make_shared<mg::Linear>(2, 128, true, init), std::make_shared<mg::ReLU>(),
                      std::make_shared<mg::Linear>(128, 2, true, init)});
  mg::AdamW opt(mg::weight_decay_groups(net.named_parameters(), 1e-2, 0.01));
  mg::LabeledPoints data = mg::two_spirals(512, gen, 0.02, dev);  // x (1024, 2), y (1024)

  for (int step = 0; step < 50; ++step) {
    mg::Tensor loss = mg::cross_entropy(net.forward(data.x), data.y);
    mg::backward(loss);  // frees each node's saved activations as it goes
    opt.step();
    opt.zero_grad();     // drops the gradients: their memory returns to the cache
    if (step % 10 == 0) std::printf("step %2d  loss %.4f\n", step, loss.item());
  }
  std::printf("%s", mg::memory_summary(dev).c_str());

  try {
    mg::Tensor too_big = mg::empty({64, 1024, 1024}, {.device = dev});  // 256 MiB > 16 MiB
  } catch (const mg::OutOfMemoryError& e) {
    std::printf("caught: %.60s...\n", e.what());  // what, where, by category, and what would help
  }
  return 0;
}
