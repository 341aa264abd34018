// The GGUF reader: a small file written by the gguf Python package round-trips (every metadata type,
// five tensor types dequantized bit for bit as the package does); corrupted copies give clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "common/common.hpp"
#include "model/gguf.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace memtrade;

namespace {

// small.gguf and small.json from tests/gguf/make_small_gguf.py, once per process; empty when the gguf
// package is missing.
const fs::path& small_dir() {
  static const fs::path dir = [] {
    const fs::path d = test::scratch_dir() / "gguf";
    const std::string cmd = "python3 " MEMTRADE_SOURCE_DIR "/tests/gguf/make_small_gguf.py '" + d.string() + "' >/dev/null";
    const int rc = std::system(cmd.c_str());
    return rc == 0 ? d : fs::path();
  }();
  return dir;
}

#define REQUIRE_SMALL_FILE()                                                                        \
  if (small_dir().empty()) GTEST_SKIP() << "python3 with the gguf package is needed to write the test file " \
                                           "(python3 -m pip install gguf)"

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path write_bytes(const std::vector<uint8_t>& b, const std::string& name) {
  const fs::path p = small_dir() / name;
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return p;
}

// The error message of opening `bytes` as a GGUF file ("" when it opens).
std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name = "corrupt.gguf") {
  try {
    gguf::File f(write_bytes(bytes, name));
    for (const auto& t : f.tensors()) f.dequantize(t);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// Byte position of a tensor info's field after its name: n_dims, then ne[], type, offset.
std::size_t tensor_info_pos(const std::vector<uint8_t>& b, const std::string& name) {
  // Metadata keys never contain a tensor name in the test file, so the first match is the tensor info.
  const auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
  EXPECT_NE(it, b.end());
  return static_cast<std::size_t>(it - b.begin()) + name.size();
}

template <class T>
void put(std::vector<uint8_t>& b, std::size_t pos, T v) {
  std::memcpy(&b[pos], &v, sizeof v);
}
template <class T>
T get(const std::vector<uint8_t>& b, std::size_t pos) {
  T v;
  std::memcpy(&v, &b[pos], sizeof v);
  return v;
}

}  // namespace

TEST(Gguf, SmallFileRoundTripsEveryValueTypeAndTensorType) {
  REQUIRE_SMALL_FILE();
  std::ifstream js(small_dir() / "small.json");
  const Json expected = Json::parse(js);
  const gguf::File f(small_dir() / "small.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  for (const Json& m : expected["metadata"]) {
    const std::string key = m["key"].get<std::string>();
    const gguf::KeyValue* kv = f.find(key);
    ASSERT_NE(kv, nullptr) << key;
    if (m.contains("type")) {
      EXPECT_EQ(static_cast<int>(kv->type), m["type"].get<int>()) << key;
    }
    EXPECT_EQ(kv->value, m["value"]) << key;
  }
  EXPECT_EQ(f.find("test.array_nested")->elem_type, gguf::ValueType::array);
}

TEST(Gguf, IntegersBeyondInt64AreRejectedNotWrapped) {
  REQUIRE_SMALL_FILE();
  const gguf::File f(small_dir() / "small.gguf");
  EXPECT_EQ(f.find("test.u64")->value.get<uint64_t>(), (uint64_t{1} << 63) + 5);
  EXPECT_THROW(f.get_int("test.u64"), Error);
  EXPECT_EQ(f.get_int("test.i64"), -(int64_t{1} << 62));
  EXPECT_THROW(f.get_int("test.string"), Error);
  EXPECT_THROW(f.get_string("missing.key"), Error);
}

TEST(Gguf, TensorsDequantizeBitForBitAsTheGgufPackage) {
  REQUIRE_SMALL_FILE();
  std::ifstream js(small_dir() / "small.json");
  const Json expected = Json::parse(js);
  const gguf::File f(small_dir() / "small.gguf");
  ASSERT_EQ(f.tensors().size(), expected["tensors"].size());
  for (const Json& e : expected["tensors"]) {
    const gguf::Tensor* t = f.find_tensor(e["name"].get<std::string>());
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(gguf::tensor_type_traits(static_cast<uint32_t>(t->type))->name, e["type"].get<std::string>());
    std::vector<int64_t> shape = e["shape"].get<std::vector<int64_t>>();  // numpy order: rows first
    EXPECT_EQ(t->cols(), shape.back());
    EXPECT_EQ(t->rows(), shape.size() == 2 ? shape[0] : 1);
    EXPECT_EQ(t->offset % f.alignment(), 0u);
    const std::vector<float> v = f.dequantize(*t);
    const auto bits = e["bits"].get<std::vector<uint32_t>>();
    ASSERT_EQ(v.size(), bits.size());
    int64_t differ = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      uint32_t b;
      std::memcpy(&b, &v[i], 4);
      differ += b != bits[i];
    }
    EXPECT_EQ(differ, 0) << t->name;
  }
}

TEST(Gguf, CorruptedCopiesGiveErrorsNamingTheFileAndField) {
  REQUIRE_SMALL_FILE();
  const std::vector<uint8_t> good = read_bytes(small_dir() / "small.gguf");
  ASSERT_EQ(open_error(good), "");

  auto bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_NE(open_error(bad_magic).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(open_error(bad_magic).find("corrupt.gguf"), std::string::npos);

  auto version = good;
  put<uint32_t>(version, 4, 7);
  EXPECT_NE(open_error(version).find("unsupported version 7"), std::string::npos);

  auto count = good;  // more tensors than the file could describe
  put<uint64_t>(count, 8, uint64_t{1} << 40);
  EXPECT_NE(open_error(count).find("tensor_count"), std::string::npos) << open_error(count);

  const std::size_t q8 = tensor_info_pos(good, "q8.weight");  // n_dims(4) ne[2](16) type(4) offset(8)
  ASSERT_EQ(get<uint32_t>(good, q8), 2u);
  auto past_end = good;
  put<uint64_t>(past_end, q8 + 24, get<uint64_t>(good, q8 + 24) + (uint64_t{1} << 20));
  EXPECT_NE(open_error(past_end).find("runs past the end of the file"), std::string::npos) << open_error(past_end);

  auto overlap = good;  // q8.weight's data placed where f32.weight's are
  put<uint64_t>(overlap, q8 + 24, get<uint64_t>(good, tensor_info_pos(good, "f32.weight") + 24));
  EXPECT_NE(open_error(overlap).find("overlap"), std::string::npos) << open_error(overlap);

  auto unaligned = good;
  put<uint64_t>(unaligned, q8 + 24, get<uint64_t>(good, q8 + 24) + 1);
  EXPECT_NE(open_error(unaligned).find("not a multiple of the alignment"), std::string::npos);

  auto type = good;
  put<uint32_t>(type, q8 + 20, 99);
  EXPECT_NE(open_error(type).find("unsupported ggml tensor type 99"), std::string::npos);

  auto dims = good;  // ne[0] = 63 is not a whole number of Q8_0 blocks
  put<uint64_t>(dims, q8 + 4, 63);
  EXPECT_NE(open_error(dims).find("not a multiple of Q8_0's block of 32"), std::string::npos) << open_error(dims);

  // Every truncation fails with an error (the header parts name the field, the data parts the tensor).
  uint64_t data_end = 0;  // the writer pads the file after the last tensor's data
  const gguf::File small(small_dir() / "small.gguf");  // named: a temporary's tensors() would dangle in the loop
  for (const auto& t : small.tensors()) data_end = std::max(data_end, t.offset + t.bytes);
  for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{11}, std::size_t{40}, q8, good.size() / 2,
                        static_cast<std::size_t>(data_end) - 1}) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string e = open_error(cut);
    EXPECT_NE(e, "") << "truncated to " << n << " bytes";
    EXPECT_NE(e.find("corrupt.gguf"), std::string::npos) << e;
  }
}

TEST(Gguf, RandomByteFlipsNeverCrash) {
  REQUIRE_SMALL_FILE();
  const std::vector<uint8_t> good = read_bytes(small_dir() / "small.gguf");
  const gguf::File f(small_dir() / "small.gguf");
  std::mt19937_64 rng(1);
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % f.data_offset()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    errors += open_error(b) != "";  // an Error or a valid file; anything else fails the test
  }
  EXPECT_GT(errors, 0);
}
