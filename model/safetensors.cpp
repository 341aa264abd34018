#include "model/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>

namespace memtrade::st {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps the header's key order: tensors stay in the given order

// The reference implementation refuses headers over 100 MB; so do we (it also bounds the
// allocation a corrupt length field can cause).
constexpr uint64_t kMaxHeader = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct Code {
  DType type;
  const char* code;
};
constexpr Code kCodes[] = {{DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
                           {DType::i32, "I32"}, {DType::i8, "I8"},   {DType::u8, "U8"}};

std::string supported_list() {
  std::string s;
  for (const auto& c : kCodes) s += (s.empty() ? "" : ", ") + std::string(c.code);
  return s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Elements of `shape` (1 for the scalar shape []); false on a negative dimension or u64 overflow.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t& numel) {
  numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && numel > UINT64_MAX / uint64_t(d)) return false;
    numel *= uint64_t(d);
  }
  return true;
}

// The header of a file, validated; tensors sorted by their position in the buffer.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};
struct Header {
  std::vector<Entry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start;  // file offset of the buffer: 8 + N
};

class Reader {
 public:
  explicit Reader(const fs::path& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("safetensors file '" + path_.string() + "': " + what);
  }

  Header read_header(std::ifstream& in) {
    in.open(path_, std::ios::binary);
    if (!in) fail("cannot open it for reading (does it exist, and is it readable?)");
    std::error_code ec;
    const uint64_t size = fs::file_size(path_, ec);
    if (ec) fail("cannot get its size: " + ec.message());

    // The 8-byte little-endian header length.
    if (size < 8) fail("truncated: " + std::to_string(size) + " bytes, too short for the 8-byte header length");
    uint8_t len[8];
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    if (n > size - 8)
      fail("header length " + std::to_string(n) + " is larger than the " + std::to_string(size - 8) +
           " bytes that follow it (truncated, or not a safetensors file)");
    if (n > kMaxHeader) fail("header length " + std::to_string(n) + " exceeds the 100 MB limit");

    std::string text(n, '\0');
    if (!in.read(text.data(), std::streamsize(n))) fail("could not read the " + std::to_string(n) + "-byte header");
    Header h;
    h.data_start = 8 + n;
    parse(text, size - h.data_start, h);
    return h;
  }

 private:
  // Parses and checks the header text; `buffer` is the size of the byte buffer after it.
  void parse(const std::string& text, uint64_t buffer, Header& h) {
    Json root = parse_json(text);
    if (!root.is_object()) fail("header is not a JSON object");

    for (auto& [name, v] : root.items()) {
      if (name == kMetadataKey) {
        if (!v.is_object()) fail("__metadata__ is not a JSON object");
        for (auto& [k, s] : v.items()) {
          if (!s.is_string()) fail("__metadata__ value of '" + k + "' is not a string (metadata maps strings to strings)");
          h.metadata[k] = s.get<std::string>();
        }
        continue;
      }
      h.tensors.push_back(parse_tensor(name, v, buffer));
    }

    // The data ranges, in buffer order, must tile [0, buffer) exactly. Empty tensors (begin ==
    // end) may sit at any boundary.
    std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t covered = 0;
    const Entry* prev = nullptr;
    for (const Entry& t : h.tensors) {
      if (t.begin < covered)
        fail("tensors '" + prev->name + "' and '" + t.name + "' have overlapping data_offsets ([" +
             std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ") and [" + std::to_string(t.begin) +
             ", " + std::to_string(t.end) + "))");
      if (t.begin > covered)
        fail("buffer bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
             ") are not covered by any tensor (a hole before '" + t.name + "')");
      covered = t.end;
      prev = &t;
    }
    if (covered != buffer)
      fail("the tensors cover " + std::to_string(covered) + " bytes but the buffer has " + std::to_string(buffer) +
           ": " + std::to_string(buffer - covered) + " trailing bytes are not covered by any tensor");
  }

  // JSON parse that also rejects duplicate keys in any object (nlohmann would keep the last).
  Json parse_json(const std::string& text) {
    if (text.find_first_not_of(" \t\r\n") == std::string::npos || text[text.find_first_not_of(" \t\r\n")] != '{')
      fail("header is not JSON: it does not start with '{'");
    // nlohmann's parser would stop at a NUL byte and ignore the rest; the format allows only spaces.
    if (text.find('\0') != std::string::npos)
      fail("header is not valid JSON: it contains a NUL byte (header padding must be spaces)");
    std::vector<std::set<std::string>> keys;  // one set per open object
    std::string duplicate;
    auto track = [&](int, Json::parse_event_t ev, Json& parsed) {
      if (ev == Json::parse_event_t::object_start) keys.emplace_back();
      if (ev == Json::parse_event_t::object_end) keys.pop_back();
      if (ev == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    };
    Json root;
    try {
      root = Json::parse(text, track);
    } catch (const Json::exception& e) {
      fail(std::string("header is not valid JSON: ") + e.what());
    }
    if (!duplicate.empty()) fail("duplicate key '" + duplicate + "' in the header");
    return root;
  }

  Entry parse_tensor(const std::string& name, const Json& v, uint64_t buffer) {
    const std::string what = "tensor '" + name + "': ";
    if (!v.is_object()) fail(what + "its entry is not a JSON object");
    // Other fields are ignored, as the reference reader does.
    auto field = [&](const char* key) -> const Json& {
      const auto it = v.find(key);
      if (it == v.end()) fail(what + "missing '" + key + "'");
      return *it;
    };
    Entry t;
    t.name = name;

    const Json& dtype = field("dtype");
    if (!dtype.is_string()) fail(what + "'dtype' is not a string");
    try {
      t.dtype = parse_dtype_code(dtype.get<std::string>());
    } catch (const Error& e) {
      fail(what + e.what());
    }

    const Json& shape = field("shape");
    if (!shape.is_array()) fail(what + "'shape' is not an array");
    for (const Json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
        fail(what + "'shape' " + shape.dump() + " holds something other than non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }

    const Json& off = field("data_offsets");
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(what + "'data_offsets' " + off.dump() + " is not a pair [begin, end] of non-negative integers");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    const std::string range = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.end < t.begin) fail(what + range + " end before begin");
    if (t.end > buffer)
      fail(what + range + " out of range: the data buffer has only " + std::to_string(buffer) +
           " bytes (truncated file?)");

    uint64_t numel = 0;
    if (!checked_numel(t.shape, numel) || numel > UINT64_MAX / dtype_size(t.dtype))
      fail(what + "shape " + shape_str(t.shape) + " is too large");
    const uint64_t need = numel * dtype_size(t.dtype);
    if (t.end - t.begin != need)
      fail(what + "shape/offset size mismatch: shape " + shape_str(t.shape) + " of " + dtype_code(t.dtype) +
           " needs " + std::to_string(need) + " bytes, but " + range + " cover " + std::to_string(t.end - t.begin));
    return t;
  }

  fs::path path_;
};

}  // namespace

const char* dtype_code(DType t) {
  for (const auto& c : kCodes)
    if (c.type == t) return c.code;
  throw Error("safetensors: no dtype code for " + std::string(dtype_name(t)));
}

DType parse_dtype_code(const std::string& code) {
  for (const auto& c : kCodes)
    if (code == c.code) return c.type;
  // Valid safetensors dtypes that memtrade has no DType for get their own message.
  static const std::set<std::string_view> other = {"BOOL", "I16", "U16", "U32", "I64", "U64", "F8_E4M3", "F8_E5M2"};
  if (other.count(code)) throw Error("unsupported dtype '" + code + "' (memtrade reads " + supported_list() + ")");
  throw Error("unknown dtype '" + code + "' (memtrade reads " + supported_list() + ")");
}

void save(const fs::path& path, const std::vector<TensorData>& tensors,
          const std::map<std::string, std::string>& metadata) {
  auto fail = [&](const std::string& what) -> void {
    throw Error("safetensors save '" + path.string() + "': " + what);
  };

  // The header, with the tensors' data laid out back to back in the given order.
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail("a tensor has an empty name");
    if (t.name == kMetadataKey) fail("'__metadata__' is reserved and cannot name a tensor");
    if (!names.insert(t.name).second) fail("duplicate tensor name '" + t.name + "'");
    uint64_t numel = 0;
    if (!checked_numel(t.shape, numel)) fail("tensor '" + t.name + "': invalid shape " + shape_str(t.shape));
    if (t.bytes.size() != numel * dtype_size(t.dtype))
      fail("tensor '" + t.name + "': " + std::to_string(t.bytes.size()) + " bytes, but shape " + shape_str(t.shape) +
           " of " + dtype_code(t.dtype) + " needs " + std::to_string(numel * dtype_size(t.dtype)));
    header[t.name] = {{"dtype", dtype_code(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", Json::array({offset, offset + t.bytes.size()})}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    fail(std::string("tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer then starts 8-byte aligned

  // Write a temporary file next to the target, then rename it over the target.
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create '" + tmp.string() + "' (does the directory exist, and is it writable?)");
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fail("writing '" + tmp.string() + "' failed (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail("cannot rename '" + tmp.string() + "' to it: " + ec.message());
  }
}

std::vector<TensorData> load(const fs::path& path) {
  Reader reader(path);
  std::ifstream in;
  const Header h = reader.read_header(in);
  std::vector<TensorData> out;
  out.reserve(h.tensors.size());
  for (const Entry& e : h.tensors) {
    TensorData t{e.name, e.dtype, e.shape, std::vector<uint8_t>(e.end - e.begin)};
    in.seekg(std::streamoff(h.data_start + e.begin));
    if (!in.read(reinterpret_cast<char*>(t.bytes.data()), std::streamsize(t.bytes.size())))
      reader.fail("could not read the data of tensor '" + e.name + "'");
    out.push_back(std::move(t));
  }
  return out;
}

std::map<std::string, std::string> load_metadata(const fs::path& path) {
  std::ifstream in;
  return Reader(path).read_header(in).metadata;
}

}  // namespace memtrade::st
