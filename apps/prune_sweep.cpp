// The pruning sweep (see prune_sweep.h): one prune_run per amount, each point's training row
// from `memgrad bench`, its inference peak measured here, and the curve as CSV, table and HTML.
#include "apps/prune_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/gpt_train.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/html.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "optim/precision.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

const Device kHost("cpu:0");

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

double mib(int64_t b) { return double(b) / 1048576.0; }

}  // namespace

std::vector<double> parse_sweep(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    double a = 0.0;
    try {
      a = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MG_CHECK(used > 0 && used == part.size(), "prune: --sweep takes amounts separated by commas (e.g. "
             "0,0.25,0.5,0.75); '", part, "' is not a number");
    MG_CHECK(a >= 0.0 && a < 1.0, "prune: every --sweep amount must be in [0, 1) (the fraction removed), got ", a);
    MG_CHECK(std::find(out.begin(), out.end(), a) == out.end(), "prune: --sweep lists ", a, " twice");
    out.push_back(a);
  }
  MG_CHECK(!out.empty(), "prune: --sweep needs at least one amount (e.g. 0,0.25,0.5,0.75)");
  return out;
}

int64_t inference_peak_bytes(const RunDir& run) {
  const nlohmann::json config = run.read_config();
  const int64_t batch = config.at("batch").get<int64_t>();
  const Precision precision = TechniqueOptions{}.from_config(config).precision;
  const int64_t before = memory_stats(kHost).allocated.current;
  Generator scratch(0);  // every value comes from the checkpoint
  NoGradGuard no_grad;
  AutocastGuard autocast(autocast_for(precision));
  // The model as the eval commands load it (a magnitude-pruned GPT with its sparse layers), then
  // the peak of one forward above what was allocated before: the weights and the activations.
  auto forward_peak = [&](Module& model, const Tensor& input, auto&& forward) {
    model.eval();
    reset_peak_stats(kHost);
    forward(input);
    return memory_stats(kHost).allocated.peak - before;
  };
  auto input = [&](const Shape& shape, DType dtype) {
    MemoryCategoryGuard cat(MemoryCategory::input);
    return zeros(shape, {.dtype = dtype});  // memory does not depend on the values
  };
  if (config.value("command", "") == "gpt train") {
    GPT model(GPTConfig::from_json(config.at("model")), {.gen = &scratch, .device = kHost});
    apply_precision(model, precision);
    run.load_weights(model);
    use_sparse_inference(config, model, false);
    return forward_peak(model, input({batch, model.config().context}, DType::i64),  // (B, T)
                        [&](const Tensor& x) { model.forward(x); });
  }
  MobileNetV2 model(MobileNetV2Config::from_json(config.at("model")), {.gen = &scratch, .device = kHost});
  apply_precision(model, precision);
  run.load_weights(model);
  const MobileNetV2Config& c = model.config();
  return forward_peak(model, input({batch, c.in_channels, c.input_size, c.input_size},  // (B, C, S, S)
                                   model.features->parameters()[0].dtype()),
                      [&](const Tensor& x) { model.forward(x); });
}

SweepResult prune_sweep(const PruneOptions& o, const std::vector<double>& amounts) {
  MG_CHECK(!amounts.empty(), "prune: --sweep needs at least one amount");
  MG_CHECK(o.method != "2:4", "prune: --sweep varies --amount; --method 2:4 has a single one (half of every 4 weights)");
  MG_CHECK(!o.out.empty(), "prune: --out is required (the sweep's folder)");
  MG_CHECK(!fs::exists(o.out) || fs::is_directory(o.out), "prune: --out '", o.out, "' exists and is not a folder");
  MG_CHECK(fs::weakly_canonical(o.out) != fs::weakly_canonical(o.run), "prune: --out must differ from --run");
  SweepResult r;
  r.method = o.method;
  r.out_dir = o.out;
  r.finetune_steps = o.finetune_steps;
  r.bench_steps = o.bench_steps > 0 ? o.bench_steps : 5;
  for (double a : amounts) {
    PruneOptions p = o;
    p.amount = a;
    p.out = (fs::path(o.out) / ("amount-" + fmt("%.2f", a))).string();
    p.bench_steps = 0;  // the bench row of the pruned run alone, below
    p.evaluate_source = false;
    const PruneResult pr = prune_run(p);
    r.kind = pr.kind;
    SweepPoint s;
    s.amount = a;
    s.run_dir = pr.out_dir;
    s.parameters = pr.parameters_after;
    s.parameter_bytes = pr.parameter_bytes_after;
    s.stored_weight_bytes = o.method == "unstructured" ? pr.stored_bytes : pr.parameter_bytes_after;
    s.sparsity = pr.sparsity;
    s.quality_pruned = pr.quality_pruned;
    s.quality_finetuned = pr.quality_finetuned;
    const RunDir run(pr.out_dir);
    const BenchRow row = bench_pruned_run(run, r.bench_steps, run.file("bench"));
    s.train_peak = row.memory.peak;
    s.ms_per_step = row.ms_per_step;
    s.inference_peak = inference_peak_bytes(run);
    r.points.push_back(s);
  }
  fs::create_directories(o.out);
  write_sweep_csv(r, (fs::path(o.out) / "sweep.csv").string());
  write_sweep_html(r, (fs::path(o.out) / "sweep.html").string());
  return r;
}

namespace {

const char* quality_name(const SweepResult& r) { return r.kind == "gpt" ? "val_loss" : "accuracy"; }
// The point's quality after the fine-tune, or right after pruning when there was none.
double final_quality(const SweepPoint& p) { return std::isnan(p.quality_finetuned) ? p.quality_pruned : p.quality_finetuned; }

}  // namespace

std::string SweepResult::table() const {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "prune sweep: %s, %s, %lld fine-tune steps per amount; bench %lld steps (technique none); bytes are "
                "the allocator's (cpu:0)\n",
                kind.c_str(), method.c_str(), (long long)finetune_steps, (long long)bench_steps);
  os << line;
  const bool gpt = kind == "gpt";
  std::snprintf(line, sizeof line, "%7s %12s %11s %11s %11s %11s %9s %10s %10s\n", "amount", "parameters",
                "param MiB", "stored MiB", "train MiB", "infer MiB", "ms/step", gpt ? "loss pruned" : "acc pruned",
                gpt ? "loss tuned" : "acc tuned");
  os << line;
  auto q = [&](double v) {
    if (std::isnan(v)) return std::string("-");
    return gpt ? fmt("%.4f", v) : fmt("%.2f%%", 100.0 * v);
  };
  for (const SweepPoint& p : points) {
    std::snprintf(line, sizeof line, "%7.2f %12lld %11.3f %11.3f %11.2f %11.2f %9.1f %10s %10s\n", p.amount,
                  (long long)p.parameters, mib(p.parameter_bytes), mib(p.stored_weight_bytes), mib(p.train_peak),
                  mib(p.inference_peak), p.ms_per_step, q(p.quality_pruned).c_str(), q(p.quality_finetuned).c_str());
    os << line;
  }
  os << "written: " << out_dir << "/sweep.csv, " << out_dir << "/sweep.html\n";
  return os.str();
}

void write_sweep_csv(const SweepResult& r, const std::string& path) {
  std::ofstream f(path + ".tmp");
  MG_CHECK(f.good(), "prune: cannot write '", path, "'");
  const std::string q = quality_name(r);
  f << "amount,method,parameters,parameter_bytes,stored_weight_bytes,sparsity,train_peak_bytes,ms_per_step,"
       "inference_peak_bytes,"
    << q << "_pruned," << q << "_finetuned,finetune_steps,run\n";
  for (const SweepPoint& p : r.points)
    f << p.amount << ',' << r.method << ',' << p.parameters << ',' << p.parameter_bytes << ',' << p.stored_weight_bytes
      << ',' << p.sparsity << ',' << p.train_peak << ',' << p.ms_per_step << ',' << p.inference_peak << ','
      << p.quality_pruned << ',' << p.quality_finetuned << ',' << r.finetune_steps << ',' << p.run_dir << '\n';
  f.close();
  MG_CHECK(f.good(), "prune: cannot write '", path, "'");
  fs::rename(path + ".tmp", path);
}

namespace {

// One line chart (amount on x) of one or more series, as static SVG markup.
struct Series {
  std::string name, color;
  std::vector<double> y;
};

std::string line_chart(const std::string& id, const std::string& title, const std::vector<double>& x,
                       const std::vector<Series>& series) {
  constexpr double kW = 420, kH = 240, kL = 64, kR = 16, kT = 30, kB = 44;
  double lo = 0.0, hi = 0.0;
  bool any = false;
  for (const Series& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) {
        lo = any ? std::min(lo, v) : v;
        hi = any ? std::max(hi, v) : v;
        any = true;
      }
  if (!any) lo = 0.0, hi = 1.0;
  if (lo > 0.0 && lo < 0.5 * hi) lo = 0.0;  // start at zero unless the values sit far from it
  if (hi - lo < 1e-12) hi = lo + (lo == 0.0 ? 1.0 : std::abs(lo) * 0.1);
  const double pad = 0.05 * (hi - lo);
  lo -= lo == 0.0 ? 0.0 : pad;
  hi += pad;
  auto px = [&](double a) { return kL + (kW - kL - kR) * a; };  // amounts lie in [0, 1)
  auto py = [&](double v) { return kT + (kH - kT - kB) * (1.0 - (v - lo) / (hi - lo)); };
  std::ostringstream s;
  s << "<svg id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s << "<text x=\"" << kL << "\" y=\"16\" font-size=\"13\">" << html_escape(title) << "</text>\n";
  s << "<line x1=\"" << kL << "\" y1=\"" << kH - kB << "\" x2=\"" << kW - kR << "\" y2=\"" << kH - kB
    << "\" stroke=\"#000\"/>\n<line x1=\"" << kL << "\" y1=\"" << kT << "\" x2=\"" << kL << "\" y2=\"" << kH - kB
    << "\" stroke=\"#000\"/>\n";
  for (int i = 0; i <= 4; ++i) {  // y ticks
    const double v = lo + (hi - lo) * i / 4.0;
    s << "<text x=\"" << kL - 4 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\">" << fmt("%.4g", v)
      << "</text>\n<line x1=\"" << kL << "\" y1=\"" << py(v) << "\" x2=\"" << kW - kR << "\" y2=\"" << py(v)
      << "\" stroke=\"#ddd\"/>\n";
  }
  for (int i = 0; i <= 4; ++i) {  // x ticks: the amount, 0 to 1
    const double a = i / 4.0;
    s << "<text x=\"" << px(a) << "\" y=\"" << kH - kB + 16 << "\" text-anchor=\"middle\">" << fmt("%.2f", a)
      << "</text>\n";
  }
  s << "<text x=\"" << (kL + kW - kR) / 2 << "\" y=\"" << kH - 8 << "\" text-anchor=\"middle\">amount pruned</text>\n";
  double legend_x = kL + 8;
  for (const Series& se : series) {
    std::string pts;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isfinite(se.y[i])) pts += fmt("%.2f", px(x[i])) + "," + fmt("%.2f", py(se.y[i])) + " ";
    s << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << se.color << "\" stroke-width=\"2\"/>\n";
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isfinite(se.y[i]))
        s << "<circle class=\"point\" data-series=\"" << html_escape(se.name) << "\" data-amount=\"" << x[i]
          << "\" data-value=\"" << fmt("%.6g", se.y[i]) << "\" cx=\"" << px(x[i]) << "\" cy=\"" << py(se.y[i])
          << "\" r=\"3\" fill=\"" << se.color << "\"><title>" << html_escape(se.name) << " at " << fmt("%.2f", x[i])
          << ": " << fmt("%.6g", se.y[i]) << "</title></circle>\n";
    s << "<rect x=\"" << legend_x << "\" y=\"" << kT + 2 << "\" width=\"10\" height=\"10\" fill=\"" << se.color
      << "\"/><text x=\"" << legend_x + 14 << "\" y=\"" << kT + 11 << "\">" << html_escape(se.name) << "</text>\n";
    legend_x += 20 + 7.0 * double(se.name.size());
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

void write_sweep_html(const SweepResult& r, const std::string& path) {
  std::vector<double> x;
  Series param{"parameters", "#4e79a7", {}}, stored{"stored weights", "#76b7b2", {}};
  Series train{"training peak", "#e15759", {}}, infer{"inference peak", "#f28e2b", {}};
  Series ms{"ms/step", "#888", {}};
  Series q{r.kind == "gpt" ? "val loss" : "accuracy %", "#59a14f", {}};
  for (const SweepPoint& p : r.points) {
    x.push_back(p.amount);
    param.y.push_back(mib(p.parameter_bytes));
    stored.y.push_back(mib(p.stored_weight_bytes));
    train.y.push_back(mib(p.train_peak));
    infer.y.push_back(mib(p.inference_peak));
    ms.y.push_back(p.ms_per_step);
    q.y.push_back(r.kind == "gpt" ? final_quality(p) : 100.0 * final_quality(p));
  }
  std::ofstream f(path + ".tmp");
  MG_CHECK(f.good(), "prune: cannot write '", path, "'");
  f << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>memgrad prune sweep</title></head>\n"
       "<body style=\"font-family:sans-serif\">\n<h1>memgrad prune sweep: "
    << html_escape(r.kind + ", " + r.method) << "</h1>\n<p>" << r.finetune_steps
    << " fine-tune steps per amount; bytes (MiB) are the allocator's: parameter and stored bytes, the peak "
       "allocated of a training step and of an inference forward; step time is the median of a "
    << r.bench_steps << "-step bench (technique none); quality after the fine-tune.</p>\n";
  f << line_chart("chart-params", "parameter bytes (MiB)", x, {param, stored});
  f << line_chart("chart-peaks", "peak allocated (MiB)", x, {train, infer});
  f << line_chart("chart-time", "training step time (ms, median)", x, {ms});
  f << line_chart("chart-quality", r.kind == "gpt" ? "validation loss (nats)" : "test accuracy (%)", x, {q});
  f << "<pre>" << html_escape(r.table()) << "</pre>\n</body></html>\n";
  f.close();
  MG_CHECK(f.good(), "prune: cannot write '", path, "'");
  fs::rename(path + ".tmp", path);
}

}  // namespace mg
