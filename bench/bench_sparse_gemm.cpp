// Where sparse inference pays on this machine: the bitmask sparse x dense GEMM (ops/sparse_gemm.h,
// the path cpuid picks, and AVX2 too when AVX-512 is there) against the dense f32 linear op
// (cpu_gemm) on gpt-mini's and gpt-small's Linear shapes at 8 x 128 tokens, over sparsities
// 0.5 to 0.98, and the 2:4 kernel (sparse24_linear) on the same shapes. Prints the CPU (lscpu's
// model name), a table of median times and the lowest sparsity from which the sparse kernel stays
// faster, per shape and path, and the 2:4 row with the weight's bytes dense and 2:4.
// Run: OMP_NUM_THREADS=1 build/release/bench/bench_sparse_gemm [repeats] (one thread: the figures in
// docs/TECHNIQUES.md; more threads on a shared machine measure the neighbours)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "ops/cpu_gemm.h"
#include "ops/ops.h"
#include "ops/sparse_gemm.h"

namespace {

using namespace mg;

std::string cpu_name() {
  std::string name = "unknown CPU";
  if (FILE* f = popen("lscpu 2>/dev/null", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      std::string s(line);
      if (s.rfind("Model name:", 0) == 0) {
        name = s.substr(s.find(':') + 1);
        name.erase(0, name.find_first_not_of(" \t"));
        if (!name.empty() && name.back() == '\n') name.pop_back();
      }
    }
    pclose(f);
  }
  return name;
}

Tensor uniform(const Shape& shape, uint64_t seed) {
  Tensor t = empty(shape);
  Generator g(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2.0f * g.uniform_at(uint64_t(i)) - 1.0f;
  return t;
}

// Median milliseconds of `repeats` calls after one warm-up.
template <typename F>
double median_ms(int repeats, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

struct Shape3 {
  const char* name;
  int64_t M, N, K;  // y (M, N) = x (M, K) W^T, W (N, K)
};

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(3, std::atoi(argv[1])) : 7;
  NoGradGuard no_grad;
  std::printf("bench_sparse_gemm: bitmask sparse x dense vs dense f32 linear (%s), %d thread(s), median of %d\n",
              cpu_gemm_backend(), num_threads(), repeats);
  std::printf("CPU: %s; best sparse path: %s\n", cpu_name().c_str(), sparse_gemm_path_name(sparse_gemm_best_path()));
  const std::vector<Shape3> shapes = {{"gpt-mini c_fc", 1024, 1024, 256},
                                      {"gpt-mini mlp c_proj", 1024, 256, 1024},
                                      {"gpt-small c_fc", 1024, 2048, 512}};
  const std::vector<double> sparsities = {0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98};
  std::vector<SparseGemmPath> paths = {sparse_gemm_best_path()};
  if (paths[0] == SparseGemmPath::avx512 && sparse_gemm_path_supported(SparseGemmPath::avx2))
    paths.push_back(SparseGemmPath::avx2);
  for (const Shape3& s : shapes) {
    const Tensor x = uniform({s.M, s.K}, 1), w0 = uniform({s.N, s.K}, 2), b = uniform({s.N}, 3);
    const double dense = median_ms(repeats, [&] { linear(x, w0, b); });
    std::printf("\n%s: M %lld, N %lld, K %lld; dense %.3f ms\n", s.name, (long long)s.M, (long long)s.N,
                (long long)s.K, dense);
    std::printf("%9s", "sparsity");
    for (SparseGemmPath p : paths) std::printf(" %12s ms %8s", sparse_gemm_path_name(p), "speedup");
    std::printf("\n");
    std::vector<double> crossover(paths.size(), -1.0);
    for (double sp : sparsities) {
      // Magnitude pruning of a uniform weight: |w| < sp zeroes about sp of it.
      Tensor w = clone(w0);
      float* p = w.data<float>();
      for (int64_t i = 0; i < w.numel(); ++i)
        if (std::abs(p[i]) < float(sp)) p[i] = 0.0f;
      const BitmaskSparse bs = to_bitmask_sparse(w);
      const Tensor off = bitmask_row_offsets(bs.bits, s.N, s.K);
      std::printf("%9.2f", 1.0 - double(bs.values.numel()) / double(w.numel()));
      for (size_t i = 0; i < paths.size(); ++i) {
        const double ms = median_ms(repeats, [&] { bitmask_linear(x, bs.bits, bs.values, off, s.N, b, paths[i]); });
        std::printf(" %15.3f %8.2fx", ms, dense / ms);
        if (ms < dense && crossover[i] < 0) crossover[i] = sp;
        if (ms >= dense) crossover[i] = -1.0;  // must stay faster from there on
      }
      std::printf("\n");
    }
    {  // 2:4: half the weights, regular, no bitmask scan
      Tensor w = clone(w0);
      prune_24_(w);
      const Sparse24 s24 = to_sparse_24(w);
      std::printf("%9s", "2:4");
      for (SparseGemmPath p : paths) {
        const double ms = median_ms(repeats, [&] { sparse24_linear(x, s24.values, s24.meta, s.N, b, p); });
        std::printf(" %15.3f %8.2fx", ms, dense / ms);
      }
      std::printf("   weight %.2f MiB dense -> %.2f MiB 2:4\n", double(w.nbytes()) / 1048576.0,
                  double(s24.nbytes()) / 1048576.0);
    }
    for (size_t i = 0; i < paths.size(); ++i) {
      if (crossover[i] >= 0)
        std::printf("%s: %s beats the dense GEMM from sparsity %.2f on\n", s.name, sparse_gemm_path_name(paths[i]),
                    crossover[i]);
      else
        std::printf("%s: %s does not stay faster than the dense GEMM up to sparsity %.2f\n", s.name,
                    sparse_gemm_path_name(paths[i]), sparsities.back());
    }
  }
  return 0;
}
