// ByteTokenizer: text <-> tokens with one token per byte (vocab 256), the tokenizer of the
// gpt-mini / gpt-small workloads. UTF-8 passes through unchanged (a multi-byte character is
// several tokens), so every string round-trips exactly and no vocabulary file is needed.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace mg {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;
  int64_t vocab_size() const { return kVocabSize; }

  std::vector<uint32_t> encode(std::string_view text) const;
  // A (1, T) i64 tensor of the tokens (what a GPT forward or generate call takes).
  Tensor encode_tensor(std::string_view text, Device device = kCPU) const;
  // Throws naming the position of a token >= 256.
  std::string decode(std::span<const uint32_t> tokens) const;
  // Any integer tensor of tokens, in row-major order.
  std::string decode(const Tensor& tokens) const;
};

}  // namespace mg
