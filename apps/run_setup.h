// Opening what a command works on: the training device with its budget, and a run directory
// (new, to resume, or to read) with errors that say what is wrong and which flag fixes it.
#pragma once
#include <string>

#include "apps/run_dir.h"
#include "core/device.h"
#include "core/rng.h"

namespace mg {

// The device, with `memory_limit` ("512MiB"; "" = none) set as its budget.
Device open_device(const std::string& device, const std::string& memory_limit);

// The run directory of a new run: `out`, or runs/<prefix>-<date>-<time> when empty. An existing
// folder that already holds a checkpoint is an error that points to --resume (`cmd` names the
// command in messages, e.g. "gpt train"). The folder is not created here: write_config does, so
// a run with a bad flag leaves nothing behind.
RunDir new_run_dir(const std::string& out, const std::string& prefix, const std::string& cmd);
// The run directory to continue: it must exist, hold config.json and a complete checkpoint.
RunDir resume_run_dir(const std::string& path, const std::string& cmd);
// The run directory to read from (sample, eval): exists, has config.json and a checkpoint.
RunDir existing_run_dir(const std::string& path, const std::string& cmd);

// The generator every Dropout layer draws from (nn layers built without one use the default
// generator). Its state goes into each checkpoint under the role "dropout", so a resumed run
// draws the same masks as an uninterrupted one.
Generator& dropout_generator();

// A flag that cannot change on --resume, named in the error when it was given anyway.
void reject_on_resume(bool given, const std::string& flag, const std::string& cmd);

}  // namespace mg
