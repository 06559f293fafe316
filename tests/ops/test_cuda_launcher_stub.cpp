// ops/cuda_launcher_stub.cpp: in a build without CUDA the launchers of ops/cuda/launchers.h exist
// (so op files dispatch on is_cuda() with no preprocessor) and each throws an mg::Error naming the
// op and "built without CUDA", as do core's fill/copy/accumulate kernels (core/cuda_stub.cpp).
// The CUDA build has the real launchers: there the case says it is skipped.
#include <catch2/catch.hpp>

#include "core/cuda/backend.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"

using namespace mg;
using Catch::Matchers::Contains;

TEST_CASE("cuda launcher stub: every launcher throws 'built without CUDA' naming its op", "[cuda_stub]") {
  if (cuda::is_built()) {
    WARN("skipped: this build has the CUDA launchers (ops/cuda/), not the stub");
    return;
  }
  Tensor a = ones({2, 2}), b = ones({2, 2}), out = empty({2, 2});
  const auto without_cuda = Contains("built without CUDA");
  CHECK_THROWS_WITH(cuda::matmul(out, a, b, Tensor()), Contains("matmul: tensor on cpu") && without_cuda);
  CHECK_THROWS_WITH(cuda::unary(cuda::UnaryOp::exp, out, a), without_cuda);
  CHECK_THROWS_WITH(cuda::binary(cuda::BinaryOp::add, out, a, b), without_cuda);
  CHECK_THROWS_WITH(cuda::softmax_forward(out, a, 1, 2, 2, false), Contains("softmax") && without_cuda);
  CHECK_THROWS_WITH(cuda::cross_entropy_count(from_vector(std::vector<double>{0, 1}, {2}, {.dtype = DType::i64}), 2, -100),
                    Contains("cross_entropy") && without_cuda);
  CHECK_THROWS_WITH(cuda::dropout(out, a, 1, 0, 0.5), Contains("dropout") && without_cuda);
  CHECK_THROWS_WITH(cuda::flash_attention_forward({}, a, a, a, out, a), Contains("flash attention") && without_cuda);
  CHECK_THROWS_WITH(cuda::flash_attention_backward({}, a, a, a, out, a, a, Tensor(), out, Tensor(), Tensor()),
                    Contains("flash attention backward") && without_cuda);
  CHECK_THROWS_WITH(cuda::sgd_step(a, b, Tensor(), Tensor(), {}), Contains("sgd step") && without_cuda);
  CHECK_THROWS_WITH(cuda::fake_quantize_per_tensor(out, Tensor(), a, 0.1f, 10.f, 3),
                    Contains("fake_quantize_per_tensor") && without_cuda);
  CHECK_THROWS_WITH(cuda::fake_quantize_learned_backward(out, Tensor(), a, b, ones({2}), {0.f, 255.f, 3.f},
                                                         fq::ScaleDivision::by_inverse, 0.1),
                    Contains("fake_quantize_learned backward") && without_cuda);
  CHECK_FALSE(cuda::have_cudnn());
  CHECK_THROWS_WITH(cuda::fill(out, 1.0), Contains("fill_") && without_cuda);
  CHECK_THROWS_WITH(cuda::copy(out, a), Contains("copy_") && without_cuda);
  CHECK_THROWS_WITH(cuda::accumulate(out, a), Contains("accumulate_") && without_cuda);
}
