// safetensors I/O: the Hugging Face tensor file format (8-byte little-endian header length N,
// N bytes of JSON header padded with spaces, then the packed tensor bytes), so weights move
// between memgrad, PyTorch and Hugging Face. Reading validates every field the way the reference
// implementation does and throws an mg::Error naming the file and the problem; writing is atomic
// (temp file, fsync, rename), so a crash or an error never leaves a half-written file behind.
// Every tensor's XXH3-64 is stored in "__metadata__" as "xxh3:<name>" and verified on loading
// (Note [Checksums]); files without them (Hugging Face's) load unverified.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/named_tensors.h"
#include "core/tensor.h"

namespace mg {

// Writes `tensors` (any strides, any real device) in the given order, plus the string metadata
// and each tensor's checksum (the "__metadata__" entry, omitted when there is neither; keys
// starting with "xxh3:" are reserved). Throws naming the file on a meta or undefined tensor, a
// duplicate name or the reserved name "__metadata__", and on any I/O failure, in which case an
// existing file at `path` is left untouched and no temp file remains.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor, in the file's data order, into new contiguous tensors on `device` (under the
// calling thread's memory category). On kMeta only the header is read: names, shapes and dtypes
// of a file without loading its bytes (the file's size is still checked).
NamedTensors load_safetensors(const std::string& path, Device device = kCPU);

// The "__metadata__" map without the checksum entries (empty when absent). Validates the whole
// header, reads no tensor data.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace mg
