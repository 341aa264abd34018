// Reading GGUF files (llama.cpp's model format, versions 2 and 3) and dequantizing the ggml block types
// memtrade's models use.
//
// File layout (little-endian):
//   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
//   kv_count x  { string key, u32 value_type, value }          metadata
//   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32), then the data section
// A string is u64 length + bytes (no terminator). Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
// 6 f32, 7 bool (one byte), 8 string, 9 array (u32 element type, u64 count, elements; arrays may
// nest), 10 u64, 11 i64, 12 f64. ne[0] is the fastest-varying dimension: a [rows x cols] row-major
// matrix is stored with ne = {cols, rows}. A tensor's offset is relative to the data section and a
// multiple of the alignment.
//
// The reader validates everything it reads against the file's size before using it: magic, version,
// counts and string lengths that cannot fit in what is left of the file, unknown value or tensor types,
// dimensions (1..4, each > 0, no overflow, ne[0] a multiple of the type's block), offsets that are not
// aligned, tensors that run past the end of the file or overlap another, duplicate keys or names. Every
// error is an Error naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/registry.hpp"  // Json

namespace memtrade::gguf {

enum class ValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
const char* value_type_name(ValueType t);

// The ggml tensor types this reader dequantizes (ids as in ggml.h). A block holds `block` elements in
// `block_bytes` bytes:
//   F32, F16, BF16   one element per block
//   Q4_0   32 elements: fp16 d, 16 bytes of 4-bit codes q;           x = d * (q - 8)
//   Q4_1   32 elements: fp16 d, fp16 m, 16 bytes of 4-bit codes q;   x = d * q + m
//   Q8_0   32 elements: fp16 d, 32 int8 codes q;                     x = d * q
// In the 4-bit blocks byte j holds element j in its low nibble and element j + 16 in its high nibble.
enum class TensorType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 8, bf16 = 30 };
struct TensorTypeTraits {
  TensorType type;
  const char* name;
  int64_t block;
  int64_t block_bytes;
};
// Nullptr for a type id this reader does not know.
const TensorTypeTraits* tensor_type_traits(uint32_t id);

struct KeyValue {
  std::string key;
  ValueType type = ValueType::u8;
  ValueType elem_type = ValueType::u8;  // arrays: the type of the elements (the outermost level)
  Json value;                           // numbers, bool, string, or an array of them
};

struct Tensor {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] fastest
  TensorType type = TensorType::f32;
  uint64_t offset = 0;      // absolute offset of the data in the file
  uint64_t bytes = 0;
  int64_t elements = 0;
  // [rows x cols] of a matrix (ne = {cols, rows}); a vector is [1 x ne[0]].
  int64_t rows() const;
  int64_t cols() const { return ne[0]; }
};

class File {
 public:
  // Reads and validates the header, metadata and tensor infos; the tensor data stay in the file.
  explicit File(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::vector<KeyValue>& metadata() const { return kv_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }

  // Nullptr when absent.
  const KeyValue* find(const std::string& key) const;
  const Tensor* find_tensor(const std::string& name) const;
  // The value of a key that must be present, as an integer / float / string / array; Error naming the
  // file and the key when it is missing or of another kind.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  const Json& get_array(const std::string& key) const;

  // The tensor's bytes as stored, and its elements dequantized to fp32 (row-major [rows x cols]).
  std::vector<uint8_t> raw(const Tensor& t) const;
  std::vector<float> dequantize(const Tensor& t) const;

 private:
  std::filesystem::path path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32, data_offset_ = 0, file_size_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<Tensor> tensors_;
};

// Dequantizes n elements (a multiple of the type's block) of `type` from `src` into `dst`, computing in
// fp32 exactly as the reference (gguf-py) does: d * q rounded, then + m for Q4_1 (no fused multiply-add).
void dequantize(TensorType type, const uint8_t* src, int64_t n, float* dst);

}  // namespace memtrade::gguf
