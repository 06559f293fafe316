// Tensor basics: factories, dtypes and f16/bf16 rounding, devices, views without copies,
// printing, item(), and error messages for bad input.
#include <catch2/catch.hpp>

#include "core/tensor.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;

TEST_CASE("factories fill and convert values", "[tensor]") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(ones({4}, {.dtype = DType::i64}).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(full({2}, 2.5, {.dtype = DType::f64}).to_vector<double>() == std::vector<double>{2.5, 2.5});
  CHECK(arange(0, 5).to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, {.dtype = DType::f64}).numel() == 4);
  Tensor v = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = DType::i32});
  CHECK(v.dtype() == DType::i32);
  CHECK(v.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(select(select(v, 0, 1), 0, 2).item<int>() == 6);
}

TEST_CASE("item, scalar tensors and one-element checks", "[tensor]") {
  CHECK(scalar_tensor(3.5).item<double>() == 3.5);
  CHECK_THROWS_WITH(zeros({2}).item<double>(), Catch::Contains("exactly one"));
}

TEST_CASE("f16 and bf16 round to nearest even on store", "[tensor]") {
  // 1 + 2^-11 is exactly halfway between two f16 values: ties go to even (1.0).
  CHECK(float(Half(1.0f + 1.0f / 2048)) == 1.0f);
  CHECK(float(Half(1.0f + 3.0f / 2048)) == 1.0f + 2.0f / 1024);
  CHECK(float(Half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(float(Half(70000.0f))));
  CHECK(float(Half(5.9604644775390625e-8f)) == 5.9604644775390625e-8f);  // smallest subnormal
  CHECK(float(BFloat16(1.0f + 1.0f / 256)) == 1.0f);                      // halfway, to even
  CHECK(float(BFloat16(3.140625f)) == 3.140625f);
  CHECK(std::isnan(float(BFloat16(std::nanf("")))));
  Tensor h = from_vector(std::vector<double>{0.1, -2.0, 1000.5}, {3}, {.dtype = DType::f16});
  test::check_values(h, {0.0999755859375, -2.0, 1000.5}, 0, 0);
}

TEST_CASE("devices parse and print", "[tensor]") {
  CHECK(Device("cpu:1") == Device(DeviceType::cpu, 1));
  CHECK(Device("cpu").str() == "cpu:0");
  CHECK(Device("meta").is_meta());
  CHECK_THROWS_WITH(Device("gpu:0"), Catch::Contains("bad device 'gpu:0'"));
  CHECK_THROWS_WITH(Device("cpu:x"), Catch::Contains("must be a number"));
  CHECK_THROWS_WITH(zeros({2}, {.device = "cuda:0"}), Catch::Contains("no CUDA device"));
}

TEST_CASE("views share storage and do not copy", "[tensor]") {
  Tensor x = arange(0, 24, 1, {.dtype = DType::f64});
  Tensor r = reshape(x, {2, 3, 4});
  CHECK(r.storage() == x.storage());
  Tensor t = transpose(r, 0, 2);  // (4, 3, 2)
  CHECK(t.storage() == x.storage());
  CHECK(!t.is_contiguous());
  CHECK(t.shape() == Shape{4, 3, 2});
  Tensor n = narrow(r, 2, 1, 2);  // (2, 3, 2)
  CHECK(n.storage() == x.storage());
  CHECK(n.to_vector<double>() == std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
  Tensor s = select(r, 1, 2);  // (2, 4)
  CHECK(s.to_vector<double>() == std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23});
  Tensor e = expand(from_vector(std::vector<double>{1, 2}, {2, 1}, {.dtype = DType::f64}), {2, 3});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(e.to_vector<double>() == std::vector<double>{1, 1, 1, 2, 2, 2});
  CHECK(unsqueeze(x, 0).shape() == Shape{1, 24});
  CHECK(squeeze(unsqueeze(x, 1), 1).shape() == Shape{24});
  // A transposed tensor cannot be viewed flat; reshape copies, view refuses.
  CHECK_THROWS_WITH(view(t, {24}), Catch::Contains("use reshape"));
  Tensor flat = reshape(t, {24});
  CHECK(flat.storage() != x.storage());
  CHECK(flat.to_vector<double>()[1] == 12);  // t[0,0,1] = r[1,0,0]
  Tensor c = contiguous(t);
  CHECK(c.is_contiguous());
  CHECK(contiguous(c).storage() == c.storage());  // no copy when already contiguous
  CHECK(slice(x, 0, 1, 10, 3).to_vector<double>() == std::vector<double>{1, 4, 7});
}

TEST_CASE("shape errors name the op and the shapes", "[tensor]") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(reshape(x, {4, 2}), Catch::Contains("reshape") && Catch::Contains("(4, 2)"));
  CHECK_THROWS_WITH(add(x, zeros({4})), Catch::Contains("do not broadcast"));
  CHECK_THROWS_WITH(add(x, zeros({2, 3}, {.dtype = DType::f64})), Catch::Contains("dtypes differ"));
  CHECK_THROWS_WITH(add(x, zeros({2, 3}, {.device = "cpu:1"})), Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
  CHECK_THROWS_WITH(narrow(x, 1, 2, 2), Catch::Contains("outside dimension 1"));
  CHECK_THROWS_WITH(transpose(x, 0, 5), Catch::Contains("out of range"));
}

TEST_CASE("printing shows values, dtype and device", "[tensor]") {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  std::string s = x.str();
  CHECK(s.find("1.0000") != std::string::npos);
  CHECK(s.find("dtype=f32") != std::string::npos);
  CHECK(s.find("device=cpu:0") != std::string::npos);
  CHECK(empty({3}, {.device = kMeta}).str().find("size=(3,)") != std::string::npos);
}

TEST_CASE("to(device) and cast move and convert data", "[tensor]") {
  Tensor x = from_vector(std::vector<double>{1.5, -2.25}, {2});
  Tensor y = to(x, Device("cpu:1"));
  CHECK(y.device() == Device("cpu:1"));
  CHECK(y.to_vector<double>() == std::vector<double>{1.5, -2.25});
  Tensor i = cast(x, DType::i32);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, -2});
  Tensor b = cast(x, DType::bf16);
  CHECK(b.to_vector<double>() == std::vector<double>{1.5, -2.25});
}
