// TokenWindowDataset: language-model examples cut from a memory-mapped token file. Example i
// is a window x = tokens[s : s+T], y = tokens[s+1 : s+T+1] whose start s is a pure function of
// (seed, epoch, i), so with the loader's batch b and row r (i = b * B + r) a resumed run draws
// the same windows. Only the T + 1 tokens of a window are read: memory stays flat for any
// corpus size. A region [begin, end) of the file separates training from validation tokens.
#pragma once
#include <memory>
#include <utility>

#include "data/dataset.h"
#include "data/token_file.h"

namespace mg {

struct TokenRegion {
  int64_t begin = 0;
  int64_t end = -1;  // -1: to the end of the file
};

// The training and validation regions of `num_tokens` tokens: the last `val_fraction` of the
// file validates, e.g. {[0, 0.9 n), [0.9 n, n)}.
std::pair<TokenRegion, TokenRegion> split_train_val(int64_t num_tokens, double val_fraction = 0.1);

struct TokenWindowOptions {
  int64_t context = 128;  // T
  TokenRegion region;     // where windows are taken from
  uint64_t seed = 0;
  // Random windows (training); false: consecutive non-overlapping windows from `begin`
  // (evaluation sees every token once, in order).
  bool random = true;
  // Examples per epoch; 0: (end - begin - 1) / T, one pass over the region's tokens.
  int64_t samples_per_epoch = 0;
};

class TokenWindowDataset : public Dataset {
 public:
  TokenWindowDataset(std::shared_ptr<const TokenFile> file, TokenWindowOptions options);
  int64_t size() const override { return size_; }
  // input x: (T) i64, target y: (T) i64 with y[t] = x[t + 1]; both views of one (T + 1) buffer.
  Example get(int64_t index, int64_t epoch = 0) const override;
  // The first token of example `index`'s window in epoch `epoch`.
  int64_t window_start(int64_t index, int64_t epoch = 0) const;
  const TokenWindowOptions& options() const { return opt_; }
  const TokenFile& file() const { return *file_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  TokenWindowOptions opt_;
  int64_t size_ = 0;
};

}  // namespace mg
