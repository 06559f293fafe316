// DistributedDataParallel's bucket (internal to parallel/ddp*.cpp): the parameters it holds,
// their place in its flat buffer, and, under ZeRO, this rank's pieces of them (Note [ZeRO shards]).
#pragma once
#include <string>
#include <vector>

#include "parallel/ddp.h"

namespace mg {

struct DistributedDataParallel::Bucket {
  DType dtype = DType::f32;
  Device device = kCPU;
  std::vector<size_t> params;    // indices into params_
  std::vector<int64_t> offsets;  // each parameter's first element in the bucket
  int64_t numel = 0, padded = 0;  // padded: a multiple of the world size (Note [ZeRO shards])
  Tensor flat;    // (padded) the gradients, while a step runs (stages 0, 1; stage 2 per launch)
  Tensor shard;   // (padded / N) stage 2: this rank's slice of the reduced gradients
  int64_t pending = 0;
  bool ready = false, launched = false;
  // ZeRO: this rank's pieces of the parameters (views) and their place in the bucket.
  struct Piece {
    size_t param;
    int64_t begin, length;  // in the bucket
    std::string name;
    Tensor view;  // (length) of the parameter's storage
  };
  std::vector<Piece> pieces;
};

}  // namespace mg
