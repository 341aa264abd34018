#include "model/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "common/common.hpp"
#include "common/dtype.hpp"

namespace memtrade::gguf {

namespace {

constexpr TensorTypeTraits kTensorTypes[] = {
    {TensorType::f32, "F32", 1, 4},   {TensorType::f16, "F16", 1, 2},    {TensorType::q4_0, "Q4_0", 32, 18},
    {TensorType::q4_1, "Q4_1", 32, 20}, {TensorType::q8_0, "Q8_0", 32, 34}, {TensorType::bf16, "BF16", 1, 2},
};

constexpr int kMaxArrayDepth = 8;

// Sequential reads from the file, each checked against what is left of it.
class Cursor {
 public:
  Cursor(const std::filesystem::path& path, std::ifstream& in, uint64_t size) : path_(path), in_(in), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(path_.string() + ": GGUF " + field + ": " + what + " (at byte " + std::to_string(pos_) + " of " +
                std::to_string(size_) + ")");
  }

  void read(void* dst, uint64_t n, const std::string& field) {
    if (n > left()) fail(field, "truncated file: needs " + std::to_string(n) + " bytes, " + std::to_string(left()) + " left");
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_) fail(field, "read error");
    pos_ += n;
  }
  template <class T>
  T get(const std::string& field) {
    T v;
    read(&v, sizeof v, field);
    return v;
  }
  std::string string(const std::string& field) {
    const uint64_t n = get<uint64_t>(field + " (string length)");
    if (n > left()) fail(field, "string of " + std::to_string(n) + " bytes runs past the end of the file");
    std::string s(n, '\0');
    read(s.data(), n, field);
    return s;
  }
  // A count of elements of at least `min_bytes` each that must fit in the rest of the file.
  uint64_t count(const std::string& field, uint64_t min_bytes) {
    const uint64_t n = get<uint64_t>(field);
    if (min_bytes > 0 && n > left() / min_bytes)
      fail(field, "count " + std::to_string(n) + " cannot fit in the " + std::to_string(left()) + " bytes left");
    return n;
  }

 private:
  const std::filesystem::path& path_;
  std::ifstream& in_;
  uint64_t size_, pos_ = 0;
};

bool known_value_type(uint32_t t) { return t <= 12; }

uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::u8: case ValueType::i8: case ValueType::boolean: return 1;
    case ValueType::u16: case ValueType::i16: return 2;
    case ValueType::u32: case ValueType::i32: case ValueType::f32: return 4;
    case ValueType::u64: case ValueType::i64: case ValueType::f64: case ValueType::string: return 8;
    case ValueType::array: return 12;
  }
  return 1;
}

Json read_value(Cursor& c, ValueType t, const std::string& field, int depth, ValueType* elem_type = nullptr) {
  switch (t) {
    case ValueType::u8: return c.get<uint8_t>(field);
    case ValueType::i8: return c.get<int8_t>(field);
    case ValueType::u16: return c.get<uint16_t>(field);
    case ValueType::i16: return c.get<int16_t>(field);
    case ValueType::u32: return c.get<uint32_t>(field);
    case ValueType::i32: return c.get<int32_t>(field);
    case ValueType::f32: return c.get<float>(field);
    case ValueType::u64: return c.get<uint64_t>(field);
    case ValueType::i64: return c.get<int64_t>(field);
    case ValueType::f64: return c.get<double>(field);
    case ValueType::boolean: {
      const uint8_t b = c.get<uint8_t>(field);
      if (b > 1) c.fail(field, "bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b == 1;
    }
    case ValueType::string: return c.string(field);
    case ValueType::array: {
      if (depth >= kMaxArrayDepth) c.fail(field, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      const uint32_t et = c.get<uint32_t>(field + " (array element type)");
      if (!known_value_type(et)) c.fail(field, "unknown array element type " + std::to_string(et));
      const auto e = static_cast<ValueType>(et);
      if (elem_type) *elem_type = e;
      const uint64_t n = c.count(field + " (array length)", min_value_bytes(e));
      Json a = Json::array();
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(c, e, field, depth + 1));
      return a;
    }
  }
  c.fail(field, "unknown value type " + std::to_string(static_cast<uint32_t>(t)));
}

float half(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return to_float(f16_t{b});
}

}  // namespace

const char* value_type_name(ValueType t) {
  static constexpr const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i <= 12 ? names[i] : "unknown";
}

const TensorTypeTraits* tensor_type_traits(uint32_t id) {
  for (const auto& t : kTensorTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

int64_t Tensor::rows() const {
  int64_t r = 1;
  for (std::size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}

File::File(const std::filesystem::path& path) : path_(path) {
  std::error_code ec;
  file_size_ = std::filesystem::file_size(path, ec);
  MT_CHECK(!ec, path.string() + ": cannot read the GGUF file: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), path.string() + ": cannot open the GGUF file");
  Cursor c(path, in, file_size_);

  char magic[4];
  c.read(magic, 4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) c.fail("magic", "not a GGUF file (the first 4 bytes are not \"GGUF\")");
  version_ = c.get<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.fail("version", "unsupported version " + std::to_string(version_) + " (2 and 3 are read)");
  const uint64_t n_tensors = c.count("tensor_count", 24);  // name length, n_dims, type, offset at least
  const uint64_t n_kv = c.count("kv_count", 13);           // key length, type, one byte of value

  std::set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    kv.key = c.string("metadata key " + std::to_string(i));
    if (!keys.insert(kv.key).second) c.fail("metadata key \"" + kv.key + "\"", "duplicate key");
    const uint32_t t = c.get<uint32_t>("type of \"" + kv.key + "\"");
    if (!known_value_type(t)) c.fail("metadata \"" + kv.key + "\"", "unknown value type " + std::to_string(t));
    kv.type = static_cast<ValueType>(t);
    kv.value = read_value(c, kv.type, "metadata \"" + kv.key + "\"", 0, &kv.elem_type);
    kv_.push_back(std::move(kv));
  }
  if (const KeyValue* a = find("general.alignment")) {
    if (a->type != ValueType::u32) c.fail("metadata \"general.alignment\"", "must be a u32");
    alignment_ = a->value.get<uint64_t>();
    if (alignment_ == 0 || !std::has_single_bit(alignment_))
      c.fail("metadata \"general.alignment\"", std::to_string(alignment_) + " is not a power of two");
  }

  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Tensor t;
    t.name = c.string("tensor " + std::to_string(i) + " name");
    const std::string field = "tensor \"" + t.name + "\"";
    if (!names.insert(t.name).second) c.fail(field, "duplicate tensor name");
    const uint32_t nd = c.get<uint32_t>(field + " n_dims");
    if (nd < 1 || nd > 4) c.fail(field, "n_dims " + std::to_string(nd) + " is not in 1..4");
    t.elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t n = c.get<uint64_t>(field + " ne[" + std::to_string(d) + "]");
      if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / t.elements))
        c.fail(field, "dimension ne[" + std::to_string(d) + "] = " + std::to_string(n) + " is zero or too large");
      t.ne.push_back(static_cast<int64_t>(n));
      t.elements *= static_cast<int64_t>(n);
    }
    const uint32_t type = c.get<uint32_t>(field + " type");
    const TensorTypeTraits* tt = tensor_type_traits(type);
    if (!tt) c.fail(field, "unsupported ggml tensor type " + std::to_string(type) + " (read: F32, F16, BF16, Q4_0, Q4_1, Q8_0)");
    t.type = tt->type;
    if (t.ne[0] % tt->block != 0)
      c.fail(field, "ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " + tt->name + "'s block of " +
                        std::to_string(tt->block));
    t.bytes = static_cast<uint64_t>(t.elements / tt->block) * static_cast<uint64_t>(tt->block_bytes);
    t.offset = c.get<uint64_t>(field + " offset");
    if (t.offset % alignment_ != 0)
      c.fail(field, "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > file_size_) c.fail("data section", "starts past the end of the file");

  // Every tensor inside the data section, none overlapping another.
  std::vector<const Tensor*> by_offset;
  for (Tensor& t : tensors_) {
    if (t.offset > file_size_ - data_offset_ || t.bytes > file_size_ - data_offset_ - t.offset)
      throw Error(path.string() + ": GGUF tensor \"" + t.name + "\": data [" + std::to_string(t.offset) + ", +" +
                  std::to_string(t.bytes) + ") runs past the end of the file (data section of " +
                  std::to_string(file_size_ - data_offset_) + " bytes)");
    t.offset += data_offset_;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Tensor* a, const Tensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    MT_CHECK(by_offset[i - 1]->offset + by_offset[i - 1]->bytes <= by_offset[i]->offset,
             path.string() + ": GGUF tensors \"" + by_offset[i - 1]->name + "\" and \"" + by_offset[i]->name +
                 "\" overlap");
}

const KeyValue* File::find(const std::string& key) const {
  for (const KeyValue& kv : kv_)
    if (kv.key == key) return &kv;
  return nullptr;
}

const Tensor* File::find_tensor(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {
const KeyValue& require(const File& f, const std::string& key) {
  const KeyValue* kv = f.find(key);
  MT_CHECK(kv, f.path().string() + ": GGUF metadata has no \"" + key + "\"");
  return *kv;
}
[[noreturn]] void wrong_kind(const File& f, const KeyValue& kv, const char* want) {
  throw Error(f.path().string() + ": GGUF metadata \"" + kv.key + "\" is a " + value_type_name(kv.type) +
              ", expected " + want);
}
}  // namespace

int64_t File::get_int(const std::string& key) const {
  const KeyValue& kv = require(*this, key);
  if (!kv.value.is_number_integer()) wrong_kind(*this, kv, "an integer");
  if (kv.value.is_number_unsigned() && kv.value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error(path_.string() + ": GGUF metadata \"" + key + "\" is out of range");
  return kv.value.get<int64_t>();
}

double File::get_float(const std::string& key) const {
  const KeyValue& kv = require(*this, key);
  if (!kv.value.is_number()) wrong_kind(*this, kv, "a number");
  return kv.value.get<double>();
}

std::string File::get_string(const std::string& key) const {
  const KeyValue& kv = require(*this, key);
  if (!kv.value.is_string()) wrong_kind(*this, kv, "a string");
  return kv.value.get<std::string>();
}

const Json& File::get_array(const std::string& key) const {
  const KeyValue& kv = require(*this, key);
  if (!kv.value.is_array()) wrong_kind(*this, kv, "an array");
  return kv.value;
}

std::vector<uint8_t> File::raw(const Tensor& t) const {
  std::ifstream in(path_, std::ios::binary);
  MT_CHECK(in.good(), path_.string() + ": cannot open the GGUF file");
  std::vector<uint8_t> out(t.bytes);
  in.seekg(static_cast<std::streamoff>(t.offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(t.bytes));
  MT_CHECK(in.good(), path_.string() + ": GGUF tensor \"" + t.name + "\": read error (the file changed since it was opened?)");
  return out;
}

std::vector<float> File::dequantize(const Tensor& t) const {
  const std::vector<uint8_t> bytes = raw(t);
  std::vector<float> out(t.elements);
  gguf::dequantize(t.type, bytes.data(), t.elements, out.data());
  return out;
}

void dequantize(TensorType type, const uint8_t* src, int64_t n, float* dst) {
  const TensorTypeTraits* tt = tensor_type_traits(static_cast<uint32_t>(type));
  MT_CHECK(tt && n % tt->block == 0, "gguf::dequantize: " + std::to_string(n) + " elements are not whole blocks");
  switch (type) {
    case TensorType::f32: std::memcpy(dst, src, n * 4); return;
    case TensorType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half(src + 2 * i);
      return;
    case TensorType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = to_float(bf16_t{b});
      }
      return;
    case TensorType::q4_0:
    case TensorType::q4_1:
      for (int64_t b = 0; b < n / 32; ++b, src += tt->block_bytes, dst += 32) {
        const float d = half(src);
        const bool q41 = type == TensorType::q4_1;
        const float m = q41 ? half(src + 2) : 0.f;
        const uint8_t* qs = src + (q41 ? 4 : 2);
        // The product is rounded before the add (this file is compiled with -ffp-contract=off).
        for (int j = 0; j < 16; ++j) {
          const int lo = qs[j] & 15, hi = qs[j] >> 4;
          if (q41) {
            dst[j] = d * static_cast<float>(lo) + m;
            dst[j + 16] = d * static_cast<float>(hi) + m;
          } else {
            dst[j] = d * static_cast<float>(lo - 8);
            dst[j + 16] = d * static_cast<float>(hi - 8);
          }
        }
      }
      return;
    case TensorType::q8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
        const float d = half(src);
        for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(static_cast<int8_t>(src[2 + j]));
      }
      return;
  }
}

}  // namespace memtrade::gguf
