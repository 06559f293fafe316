// Pipeline schedules and their execution: the printed grids, bubble fractions against
// (p-1)/(m+p-1), 1F1B's bound on micro-batches in flight, gradients equal to a plain
// micro-batched run (dropout on), and stage 0's activation peak under GPipe vs 1F1B.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>

#include "autograd/autocast.h"
#include "core/fault_injection.h"
#include "parallel/pipeline.h"
#include "parallel/split.h"
#include "parallel_test_util.h"

using namespace mg;

namespace {

// The most micro-batches stage s holds at once (forwarded, not yet backwarded).
int64_t max_in_flight(const PipelineSchedule& sched, int64_t s) {
  int64_t now = 0, most = 0;
  for (const auto& st : sched.steps) {
    if (st.stage != s) continue;
    now += st.kind == PipelineStep::Kind::forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

// The reference: micro-batches one after another on the model as it is, each from its own
// random stream, each loss weighted by its share before backward.
double sequential_micro_batches(GPT& gpt, const Tensor& idx, const Tensor& tgt, int64_t micro) {
  const int64_t B = idx.size(0), M = num_micro_batches(B, micro);
  const uint64_t base = default_generator().offset();
  double loss = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t rows = std::min(micro, B - m * micro);
    default_generator().set_offset(micro_batch_stream(base, m));
    Tensor l = gpt.loss(narrow(idx, 0, m * micro, rows), narrow(tgt, 0, m * micro, rows));
    const double w = double(rows) / double(B);
    loss += to(l.detach(), kCPU).item<double>() * w;
    backward(mul(l, w));
  }
  default_generator().set_offset(micro_batch_stream(base, M));
  return loss;
}

}  // namespace

TEST_CASE("pipeline: GPipe and 1F1B schedules, their grids and bubbles", "[parallel]") {
  const PipelineSchedule g = make_schedule(PipelineKind::gpipe, 2, 4);
  CHECK(g.str() ==
        "gpipe schedule, 2 stages x 4 micro-batches, 10 slots\n"
        "  stage 0 | F0 F1 F2 F3 .  .  B0 B1 B2 B3\n"
        "  stage 1 | .  F0 F1 F2 F3 B0 B1 B2 B3 . \n"
        "  bubble 0.200 (theory (p-1)/(m+p-1) = 0.200)\n");
  const PipelineSchedule f = make_schedule(PipelineKind::one_f_one_b, 2, 4);
  CHECK(f.str() ==
        "1f1b schedule, 2 stages x 4 micro-batches, 10 slots\n"
        "  stage 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3\n"
        "  stage 1 | .  F0 B0 F1 B1 F2 B2 F3 B3 . \n"
        "  bubble 0.200 (theory (p-1)/(m+p-1) = 0.200)\n");
  for (auto kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
    for (auto [p, m] : {std::pair<int64_t, int64_t>{3, 6}, {4, 8}, {4, 2}, {1, 3}}) {
      const PipelineSchedule s = make_schedule(kind, p, m);
      INFO(s.str());
      CHECK(s.steps.size() == size_t(2 * p * m));
      CHECK(s.bubble_fraction() == Approx(PipelineSchedule::theoretical_bubble(p, m)));
      for (int64_t st = 0; st < p; ++st)
        CHECK(max_in_flight(s, st) == (kind == PipelineKind::gpipe ? m : std::min(p - st, m)));
    }
  }
  CHECK(parse_pipeline("1f1b") == PipelineKind::one_f_one_b);
  CHECK_THROWS_WITH(parse_pipeline("zb"), Catch::Contains("unknown schedule (known: gpipe, 1f1b)"));
  CHECK_THROWS_WITH(make_schedule(PipelineKind::gpipe, 2, 0), Catch::Contains("--pipeline needs --micro-batch"));
  CHECK_THROWS_WITH(num_micro_batches(4, 5), Catch::Contains("micro-batch 5 must be in [1, batch 4]"));
}

TEST_CASE("pipeline: both schedules give the gradients of a plain micro-batched run", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4"), c("cpu:5");
  auto ref = test::tiny_gpt(a);
  const int64_t B = 5, T = 12, micro = 2;  // 3 micro-batches, the last one smaller
  const Tensor idx = test::random_tokens(B, T, 40, 21, a), tgt = test::random_tokens(B, T, 40, 22, a);
  manual_seed(5);
  const double want_loss = sequential_micro_batches(*ref, idx, tgt, micro);
  const test::StepResult want = test::collect(*ref, scalar_tensor(want_loss));
  const uint64_t want_offset = default_generator().offset();

  for (auto kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
    SECTION(pipeline_name(kind) + " over two devices: bit for bit") {
      auto gpt = test::tiny_gpt(a);
      apply_placement(*gpt, stages_placement(model_layout(*gpt), {a, b}, {2, 2}));
      manual_seed(5);
      const double loss = run_pipeline(make_schedule(kind, 2, 3), gpt_pipeline_stages(*gpt, {2, 2}, idx, tgt, micro), B, micro);
      CHECK(default_generator().offset() == want_offset);
      test::check_identical(test::collect(*gpt, scalar_tensor(loss)), want);
    }
    SECTION(pipeline_name(kind) + " over three devices") {
      // The tied wte takes gradient from stage 0 (embedding) and the last stage (head): with three
      // stages their micro-batches interleave differently, so only wte's sum is reordered.
      auto gpt = test::tiny_gpt(a);
      apply_placement(*gpt, stages_placement(model_layout(*gpt), {a, b, c}, {2, 1, 1}));
      manual_seed(5);
      const double loss =
          run_pipeline(make_schedule(kind, 3, 3), gpt_pipeline_stages(*gpt, {2, 1, 1}, idx, tgt, micro), B, micro);
      const test::StepResult got = test::collect(*gpt, scalar_tensor(loss));
      CHECK(got.loss == want.loss);
      for (const auto& [n, g] : got.grads) {
        INFO(n);
        if (n == "wte.weight") {
          const auto& w = want.grads.at(n);
          double scale = 0, diff = 0;
          for (size_t i = 0; i < w.size(); ++i) {
            scale = std::max(scale, std::abs(w[i]));
            diff = std::max(diff, std::abs(g[i] - w[i]));
          }
          INFO("largest difference " << diff << " of largest gradient " << scale);
          CHECK(diff <= 1e-6 * scale);
        }
        else CHECK(g == want.grads.at(n));
      }
    }
  }
}

TEST_CASE("pipeline: 1F1B holds fewer micro-batches' activations on stage 0 than GPipe", "[parallel]") {
  const Device a("cpu:6"), b("cpu:7");
  const int64_t B = 8, micro = 1, p = 2, M = 8;
  auto peak = [&](PipelineKind kind) {
    auto gpt = test::tiny_gpt(a, 0.0);
    apply_placement(*gpt, stages_placement(model_layout(*gpt), {a, b}, {2, 2}));
    const Tensor idx = test::random_tokens(B, 16, 40, 1, a), tgt = test::random_tokens(B, 16, 40, 2, a);
    const int64_t before = memory_stats(a).category(MemoryCategory::activation).current;
    reset_peak_stats(a);
    run_pipeline(make_schedule(kind, p, M), gpt_pipeline_stages(*gpt, {2, 2}, idx, tgt, micro), B, micro);
    return memory_stats(a).category(MemoryCategory::activation).peak - before;
  };
  const int64_t gpipe = peak(PipelineKind::gpipe), one = peak(PipelineKind::one_f_one_b);
  INFO("stage 0 activation peak: gpipe " << gpipe << " B, 1f1b " << one << " B");
  CHECK(gpipe > 0);
  CHECK(double(one) <= double(gpipe) * double(p) / double(M));
}

TEST_CASE("pipeline: a worker per stage gives the bits of the sequential execution", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4"), c("cpu:5");
  const int64_t B = 6, T = 12, micro = 1;
  const Tensor idx = test::random_tokens(B, T, 40, 31, a), tgt = test::random_tokens(B, T, 40, 32, a);
  struct Case {
    std::vector<Device> devices;
    std::vector<int64_t> counts;
    const char* checkpoint;
    bool bf16;
  };
  // Dropout on everywhere; three stages make the tied wte's two stages run in parallel; selective
  // checkpointing replays dropout in backward; autocast must reach the workers.
  for (const Case& k : {Case{{a, b}, {2, 2}, "none", false}, Case{{a, b, c}, {2, 1, 1}, "selective", false},
                        Case{{a, b, c}, {1, 1, 2}, "blocks", true}}) {
    for (auto kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
      INFO(pipeline_name(kind) << " over " << k.devices.size() << " stages, checkpoint " << k.checkpoint << (k.bf16 ? ", bf16" : ""));
      auto run = [&](PipelineExecution exec) {
        auto gpt = test::tiny_gpt(a);
        gpt->set_checkpoint(CheckpointPolicy::parse(k.checkpoint));
        apply_placement(*gpt, stages_placement(model_layout(*gpt), k.devices, k.counts));
        manual_seed(9);
        const int64_t M = num_micro_batches(B, micro);
        std::optional<AutocastGuard> amp;
        if (k.bf16) amp.emplace(DType::bf16);
        const double loss = run_pipeline(make_schedule(kind, int64_t(k.devices.size()), M),
                                         gpt_pipeline_stages(*gpt, k.counts, idx, tgt, micro), B, micro, exec);
        amp.reset();
        const uint64_t offset = default_generator().offset();
        test::StepResult r = test::collect(*gpt, scalar_tensor(loss));
        return std::make_pair(r, offset);
      };
      const auto [want, want_offset] = run(PipelineExecution::sequential);
      for (int repeat = 0; repeat < 2; ++repeat) {  // workers' timing differs run to run; the bits do not
        const auto [got, got_offset] = run(PipelineExecution::workers);
        CHECK(got_offset == want_offset);
        test::check_identical(got, want);
      }
    }
  }
}

TEST_CASE("pipeline: a worker's out-of-memory stops every worker and reaches the caller", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4");
  auto gpt = test::tiny_gpt(a);
  apply_placement(*gpt, stages_placement(model_layout(*gpt), {a, b}, {2, 2}));
  const Tensor idx = test::random_tokens(4, 16, 40, 1, a), tgt = test::random_tokens(4, 16, 40, 2, a);
  auto run = [&] {
    manual_seed(3);  // the same dropout masks every time
    return run_pipeline(make_schedule(PipelineKind::one_f_one_b, 2, 4), gpt_pipeline_stages(*gpt, {2, 2}, idx, tgt, 1), 4, 1);
  };
  const double want = run();
  gpt->zero_grad();
  const int64_t before_a = memory_stats(a).allocated.current, before_b = memory_stats(b).allocated.current;
  int64_t events = 0;
  {
    FaultGuard count(FaultSite::allocation, INT64_MAX);
    run();
    events = fault_events(FaultSite::allocation);
  }
  gpt->zero_grad();
  REQUIRE(events > 20);
  // The nth allocation fails, on whichever worker makes it: the error reaches the caller, the
  // other worker stops waiting, and the step's memory is all given back.
  for (int64_t n : {int64_t(1), events / 7, events / 3, events / 2, events - 5}) {
    INFO("allocation " << n << " of " << events << " fails");
    {
      FaultGuard fail(FaultSite::allocation, n);
      CHECK_THROWS_AS(run(), OutOfMemoryError);
    }
    gpt->zero_grad();
    CHECK(memory_stats(a).allocated.current == before_a);
    CHECK(memory_stats(b).allocated.current == before_b);
  }
  CHECK(run() == want);  // and the pipeline runs as before
}
