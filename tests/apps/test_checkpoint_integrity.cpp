// A real checkpoint (model.safetensors, optimizer.safetensors, state.json of a small Linear with
// AdamW state) damaged one bit at a time: every flip in tensor data is an error naming the file
// and the tensor; a flip anywhere else is an error or harmless (the same weights, optimizer state
// and position), never a resume from silently different numbers.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/run_dir.h"
#include "models/nn/nn.h"
#include "optim/optim.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

struct Snapshot {
  std::vector<std::vector<double>> params, opt_state;
  nlohmann::json state;
};

Snapshot snapshot(const Module& net, const Optimizer& opt, const TrainingState& s) {
  Snapshot out;
  for (const auto& [_, p] : net.named_parameters()) out.params.push_back(p.to_double_vector());
  for (const auto& [_, t] : opt.state_dict()) out.opt_state.push_back(t.to_double_vector());
  out.state = s.to_json();
  return out;
}

bool operator==(const Snapshot& a, const Snapshot& b) {
  return a.params == b.params && a.opt_state == b.opt_state && a.state == b.state;
}

uint64_t data_start(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  return 8 + n;
}

}  // namespace

TEST_CASE("checkpoint integrity: single-bit flips in every file are detected or harmless", "[apps][checksum]") {
  DataTempDir tmp("integrity");
  RunDir run(tmp.file("run"));
  Generator gen(3);
  Linear net(3, 2, true, {.gen = &gen});
  AdamW opt(net.named_parameters(), 1e-2);
  for (const auto& [_, p] : net.named_parameters()) {
    std::vector<double> g(size_t(p.numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.1 * double(i + 1);
    p.set_grad(from_vector(g, p.shape(), {}));
  }
  opt.step();
  TrainingState state{.step = 1, .position = {0, 1}, .generators = {{"dropout", {42, 7}}}, .elapsed_s = 0.25, .peak_bytes = 0};
  run.save_checkpoint(net, opt, state);
  const Snapshot want = snapshot(net, opt, state);

  auto resume = [&]() {
    Generator g2(99);
    Linear other(3, 2, true, {.gen = &g2});
    AdamW other_opt(other.named_parameters(), 1e-2);
    TrainingState s = run.load_checkpoint(other, &other_opt);
    return snapshot(other, other_opt, s);
  };
  REQUIRE(resume() == want);

  int64_t data_flips = 0, data_detected = 0, other_flips = 0, other_errors = 0, harmless = 0;
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    const std::string file = run.checkpoint_dir() + "/" + name;
    const std::string good = read_bytes(file);
    const bool tensors = std::string(name) != "state.json";
    const uint64_t start = tensors ? data_start(good) : good.size();
    for (size_t i = 0; i < good.size(); ++i)
      for (int bit = 0; bit < 8; ++bit) {
        if (i < start && bit != int(i % 8)) continue;  // headers and JSON: one bit per byte
        std::string b = good;
        b[i] = char(b[i] ^ (1 << bit));
        write_bytes(file, b);
        const bool in_data = i >= start;
        (in_data ? data_flips : other_flips)++;
        try {
          const Snapshot got = resume();
          if (in_data || !(got == want)) FAIL_CHECK(name << " byte " << i << " bit " << bit << ": resumed silently");
          ++harmless;
        } catch (const Error& e) {
          const std::string msg = e.what();
          if (in_data) {
            const bool named = msg.find(file) != std::string::npos && msg.find("' is corrupt") != std::string::npos;
            if (!named) FAIL_CHECK(name << " byte " << i << ": " << msg);
            data_detected += named;
          } else {
            ++other_errors;
          }
        }
      }
    write_bytes(file, good);
  }
  std::printf("checkpoint integrity: tensor data: %lld of %lld single-bit flips detected; headers and state.json: "
              "%lld flips, %lld errors, %lld harmless, 0 silent\n",
              (long long)data_detected, (long long)data_flips, (long long)other_flips, (long long)other_errors,
              (long long)harmless);
  CHECK(data_flips > 8 * 50);
  CHECK(data_detected == data_flips);
  REQUIRE(resume() == want);
}

TEST_CASE("checkpoint integrity: state.json carries a checksum, an edited one is refused, an old one loads",
          "[apps][checksum]") {
  DataTempDir tmp("statesum");
  RunDir run(tmp.file("run"));
  Generator gen(3);
  Linear net(3, 2, true, {.gen = &gen});
  AdamW opt(net.named_parameters(), 1e-2);
  TrainingState st;
  st.step = 12;
  st.position = {1, 3};
  run.save_checkpoint(net, opt, st);
  const std::string path = run.checkpoint_dir() + "/state.json";
  nlohmann::json j = read_json_file(path);
  REQUIRE(j.contains("xxh3"));
  CHECK(run.read_checkpoint_state().step == 12);
  j["step"] = 13;  // a plausible edit: still a valid state
  write_bytes(path, j.dump(2));
  CHECK_THROWS_WITH(run.read_checkpoint_state(), Catch::Contains(path) && Catch::Contains("is corrupt"));
  j.erase("xxh3");  // a state.json from before checksums
  write_bytes(path, j.dump(2));
  CHECK(run.read_checkpoint_state().step == 13);
}
