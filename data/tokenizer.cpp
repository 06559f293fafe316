// ByteTokenizer (see tokenizer.h): each byte of the text is its own token.
#include "data/tokenizer.h"

namespace mg {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

Tensor ByteTokenizer::encode_tensor(std::string_view text, Device device) const {
  Tensor t = empty({1, int64_t(text.size())}, {.dtype = DType::i64, .device = kCPU});
  auto* p = t.data<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = static_cast<unsigned char>(text[i]);
  if (device == kCPU) return t;
  Tensor out = empty(t.shape(), {.dtype = DType::i64, .device = device});
  copy_(out, t);
  return out;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    MG_CHECK(tokens[i] < kVocabSize, "ByteTokenizer::decode: token ", tokens[i], " at position ", i,
             " is outside the byte vocabulary [0, 256)");
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

std::string ByteTokenizer::decode(const Tensor& tokens) const {
  MG_CHECK(is_integral(tokens.dtype()),
           "ByteTokenizer::decode: tokens must be an integer tensor, got ", tokens.dtype());
  std::vector<double> v = tokens.to_double_vector();
  std::string text(v.size(), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    MG_CHECK(v[i] >= 0 && v[i] < kVocabSize, "ByteTokenizer::decode: token ", int64_t(v[i]), " at position ", i,
             " is outside the byte vocabulary [0, 256)");
    text[i] = static_cast<char>(int(v[i]));
  }
  return text;
}

}  // namespace mg
