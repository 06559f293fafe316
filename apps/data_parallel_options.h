// The data-parallel settings of a training command (--ddp, --zero, --bucket-mb, --ddp-timeout)
// and the process group this rank joined (apps/ddp_setup.h fills it in). A plain struct, so
// TrainOptions can hold it without the apps depending on MPI headers.
#pragma once
#include <memory>

#include <nlohmann/json.hpp>

#include "parallel/process_group.h"

namespace mg {

struct DataParallelOptions {
  bool enabled = false;      // --ddp: one rank of an mpirun job
  int zero = 0;              // --zero 1|2
  double bucket_mb = 25.0;   // --bucket-mb (MiB)
  double timeout_s = 0.0;    // --ddp-timeout; 0: MEMGRAD_DDP_TIMEOUT_S or 300
  std::shared_ptr<ProcessGroup> group{};  // joined by prepare_data_parallel

  int rank() const { return group ? group->rank() : 0; }
  int world_size() const { return group ? group->world_size() : 1; }
  bool is_root() const { return rank() == 0; }
  // config.json's "data_parallel" ({"world_size", "zero", "bucket_mb"}); null when off.
  nlohmann::json to_json() const;
};

}  // namespace mg
