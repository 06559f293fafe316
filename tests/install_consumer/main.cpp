// The installed-package check (scripts/test-install): builds two tensors with the installed
// headers and libraries, runs one op (matmul) on cpu:0, and checks every element of the result
// against the values computed by hand, exiting non-zero on any mismatch.
#include <cstdio>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

int main() {
  mg::Tensor a = mg::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});   // (2, 3)
  mg::Tensor b = mg::from_vector(std::vector<double>{1, 0, 0, 1, 1, 1}, {3, 2});   // (3, 2)
  std::vector<double> got = mg::matmul(a, b).to_double_vector();                 // (2, 2)
  const std::vector<double> want{4, 5, 10, 11};
  if (got != want) {
    std::fprintf(stderr, "install consumer: matmul gave [%g %g %g %g], expected [4 5 10 11]\n", got[0], got[1],
                 got[2], got[3]);
    return 1;
  }
  std::printf("install consumer: matmul of a (2, 3) and a (3, 2) tensor with the installed memgrad: ok\n");
  return 0;
}
