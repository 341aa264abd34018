// Reading and writing checkpoints in the safetensors format, so that the Python ecosystem
// (safetensors.numpy / safetensors.torch) can read memtrade checkpoints and vice versa.
//
// File layout:
//   [8 bytes]  N, the header length, as a little-endian u64
//   [N bytes]  the header: UTF-8 JSON object, padded at the end with spaces (0x20)
//   [rest]     the byte buffer holding all tensor data
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
// where [b, e) is the tensor's byte range relative to the start of the buffer. An optional
// "__metadata__" entry maps strings to strings. Tensor data is row-major (C order) and
// little-endian; e - b == product(shape) * dtype size. The ranges must cover the buffer
// exactly, without holes or overlaps (empty tensors have b == e). Names are unique. A shape []
// is a scalar (one element); a shape with a 0 is an empty tensor (no bytes).
//
// Writers pad the header so that the buffer starts at a multiple of 8 bytes (N % 8 == 0);
// readers do not require it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.hpp"

namespace memtrade::st {

// One tensor: raw little-endian bytes, row-major, bytes.size() == numel(shape) * dtype_size(dtype).
struct TensorData {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// dtype <-> safetensors dtype string: f64 "F64", f32 "F32", f16 "F16", bf16 "BF16", i32 "I32",
// i8 "I8", u8 "U8". Throws Error for other strings (including safetensors dtypes memtrade has
// no DType for, such as "I64" or "BOOL").
const char* dtype_code(DType t);
DType parse_dtype_code(const std::string& code);

// Writes `tensors` (their data in the given order) and `metadata` to `path`, via a temporary
// file in the same directory that is renamed over `path`, so a reader never sees a half-written
// file. Throws Error for duplicate, empty or reserved ("__metadata__") names, negative
// dimensions, a byte count that does not match the shape, or an I/O failure.
void save(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
          const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file; tensors come back in the order of their data in the buffer
// (for files written by save(), the order they were given in). Throws Error naming the file and
// the problem for anything that is not a well-formed safetensors file of supported dtypes.
std::vector<TensorData> load(const std::filesystem::path& path);

// The "__metadata__" map (empty if there is none), after validating the header and file size.
std::map<std::string, std::string> load_metadata(const std::filesystem::path& path);

}  // namespace memtrade::st
