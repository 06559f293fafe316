// TokenWindowDataset (see token_window_dataset.h): seeded random windows over a token region.
#include "data/token_window_dataset.h"

#include "core/error.h"

namespace mg {

std::pair<TokenRegion, TokenRegion> split_train_val(int64_t num_tokens, double val_fraction) {
  MG_CHECK(num_tokens > 0, "split_train_val: no tokens to split (", num_tokens, ")");
  MG_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "split_train_val: val_fraction must be in [0, 1), got ",
           val_fraction);
  auto n_val = int64_t(double(num_tokens) * val_fraction);
  return {TokenRegion{0, num_tokens - n_val}, TokenRegion{num_tokens - n_val, num_tokens}};
}

TokenWindowDataset::TokenWindowDataset(std::shared_ptr<const TokenFile> file, TokenWindowOptions options)
    : file_(std::move(file)), opt_(options) {
  MG_CHECK(file_ != nullptr, "TokenWindowDataset: the token file is null");
  MG_CHECK(opt_.context >= 1, "TokenWindowDataset: context must be at least 1, got ", opt_.context);
  if (opt_.region.end < 0) opt_.region.end = file_->size();
  const int64_t begin = opt_.region.begin, end = opt_.region.end;
  MG_CHECK(0 <= begin && begin <= end && end <= file_->size(), "TokenWindowDataset: region [", begin, ", ", end,
           ") is outside '", file_->path(), "', which has ", file_->size(), " tokens");
  MG_CHECK(end - begin >= opt_.context + 1, "TokenWindowDataset: region [", begin, ", ", end, ") of '", file_->path(),
           "' has ", end - begin, " tokens, but a window of context ", opt_.context, " needs ", opt_.context + 1,
           "\n  hint: use a smaller context or a larger validation fraction");
  const int64_t windows = (end - begin - 1) / opt_.context;  // non-overlapping windows
  MG_CHECK(opt_.samples_per_epoch >= 0, "TokenWindowDataset: samples_per_epoch must be >= 0, got ", opt_.samples_per_epoch);
  MG_CHECK(opt_.random || opt_.samples_per_epoch <= windows, "TokenWindowDataset: ", opt_.samples_per_epoch,
           " sequential windows of ", opt_.context, " tokens do not fit in region [", begin, ", ", end, ")");
  size_ = opt_.samples_per_epoch > 0 ? opt_.samples_per_epoch : windows;
}

int64_t TokenWindowDataset::window_start(int64_t index, int64_t epoch) const {
  MG_CHECK(index >= 0 && index < size_, "TokenWindowDataset: index ", index, " is outside [0, ", size_, ")");
  if (!opt_.random) return opt_.region.begin + index * opt_.context;
  // Starts s in [begin, end - T - 1] so that y's last token (s + T) is inside the region.
  const auto starts = uint64_t(opt_.region.end - opt_.region.begin - opt_.context);
  Generator g(derive_seed(opt_.seed, {uint64_t(epoch)}));
  return opt_.region.begin + int64_t(bounded(bits64_at(g, uint64_t(index)), starts));
}

Example TokenWindowDataset::get(int64_t index, int64_t epoch) const {
  const int64_t T = opt_.context;
  const int64_t s = window_start(index, epoch);
  Tensor window = empty({T + 1}, {.dtype = DType::i64});  // (T + 1)
  file_->read(s, T + 1, window.data<int64_t>());
  return {window.as_strided({T}, {1}, 0), window.as_strided({T}, {1}, 1)};
}

}  // namespace mg
