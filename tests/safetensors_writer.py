# The fixture generators' one writer of safetensors files (tests/gen_*.py): tensors in the given
# order, an 8-byte little-endian header length, a compact JSON header padded with spaces to a
# multiple of 8, then the raw bytes; metadata names the generator and the torch that made it.
import json
import struct

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, generator, extra_metadata=None):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {**(extra_metadata or {}), "generator": generator, "torch": torch.__version__}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    print(f"wrote {len(tensors)} tensors to {path}")
