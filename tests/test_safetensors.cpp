#include "model/safetensors.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

using namespace memtrade;
namespace fs = std::filesystem;

namespace {

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(n >> (8 * i));
  return s;
}

// A raw file: length field, header text, buffer.
std::string raw(const std::string& header, const std::string& buffer) { return le64(header.size()) + header + buffer; }

using memtrade::test::error_of;

// The tensors the round-trip and interoperability tests write: every dtype, a scalar, an empty
// tensor, and odd-sized ones so that later tensors start unaligned.
std::vector<st::TensorData> sample_tensors() {
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[i] = 0.5f * float(i) - 1.0f;
  std::vector<uint16_t> half = {float_to_half_bits(1.0f), float_to_half_bits(-2.5f), float_to_half_bits(65504.0f)};
  std::vector<uint16_t> bf = {float_to_bf16_bits(1.0f), float_to_bf16_bits(-3.0e38f), float_to_bf16_bits(1e-3f),
                              float_to_bf16_bits(0.0f)};
  return {
      {"bytes", DType::u8, {7}, {0, 1, 2, 127, 128, 254, 255}},
      {"small", DType::i8, {5}, bytes_of(std::vector<int8_t>{-128, -1, 0, 1, 127})},
      {"layers.0.weight", DType::f32, {2, 3}, bytes_of(w)},
      {"scale", DType::f64, {}, bytes_of(std::vector<double>{0.1})},
      {"half", DType::f16, {3}, bytes_of(half)},
      {"ids", DType::i32, {2, 1, 2}, bytes_of(std::vector<int32_t>{-2, -1, 0, 2147483647})},
      {"empty", DType::f32, {0, 4}, {}},
      {"bf", DType::bf16, {2, 2}, bytes_of(bf)},
  };
}

class SafeTensors : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir = test::scratch_dir() / ("safetensors_" + std::to_string(counter++));
    fs::create_directories(dir);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // Writes `contents` to a file and returns load()'s error message.
  std::string load_error(const std::string& contents) {
    const fs::path p = dir / "bad.safetensors";
    write_all(p, contents);
    const std::string e = error_of([&] { st::load(p); });
    EXPECT_NE(e.find(std::string("'").append(p.string()).append("'")), std::string::npos) << "message does not name the file: " << e;
    EXPECT_EQ(error_of([&] { st::load_metadata(p); }), e) << "load_metadata validates the header the same way";
    return e;
  }
  fs::path dir;
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

const std::string kOne = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafeTensors, RoundTripOfEveryDtypeScalarAndEmptyTensor) {
  const auto in = sample_tensors();
  const fs::path p = dir / "model.safetensors";
  st::save(p, in);
  const auto out = st::load(p);
  ASSERT_EQ(out.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].name, in[i].name);
    EXPECT_EQ(out[i].dtype, in[i].dtype) << in[i].name;
    EXPECT_EQ(out[i].shape, in[i].shape) << in[i].name;
    EXPECT_EQ(out[i].bytes, in[i].bytes) << in[i].name;
  }
  EXPECT_TRUE(st::load_metadata(p).empty());

  // The layout: a padded header (buffer 8-byte aligned), tensors in the given order, no metadata.
  const std::string file = read_all(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(file[i]);
  EXPECT_EQ(n % 8, 0u);
  std::size_t data_bytes = 0;
  for (const auto& t : in) data_bytes += t.bytes.size();
  EXPECT_EQ(file.size(), 8 + n + data_bytes);
  const auto header = nlohmann::ordered_json::parse(file.substr(8, n));
  EXPECT_FALSE(header.contains("__metadata__"));
  std::size_t k = 0;
  for (const auto& [name, v] : header.items()) EXPECT_EQ(name, in[k++].name);
  EXPECT_EQ(header["scale"]["shape"], nlohmann::json::array());
  EXPECT_EQ(header["bytes"]["dtype"], "U8");
  EXPECT_EQ(header["bf"]["dtype"], "BF16");
  EXPECT_EQ(header["small"]["data_offsets"], nlohmann::json::array({7, 12}));
  EXPECT_EQ(header["empty"]["data_offsets"][0], header["empty"]["data_offsets"][1]);
  EXPECT_FALSE(fs::exists(p.string() + ".tmp." + std::to_string(getpid())));
}

TEST_F(SafeTensors, NoTensorsAndOverwrite) {
  const fs::path p = dir / "x.safetensors";
  st::save(p, {});
  EXPECT_TRUE(st::load(p).empty());
  EXPECT_EQ(read_all(p), le64(8) + "{}      ");
  st::save(p, {{"t", DType::i32, {1}, bytes_of(std::vector<int32_t>{42})}});  // replaces the file
  const auto out = st::load(p);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bytes, bytes_of(std::vector<int32_t>{42}));
}

TEST_F(SafeTensors, MetadataRoundTrip) {
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "1200"}, {"quote \"and\" \\ slash", "line\nbreak"}, {"unicode", "\u03c0 \u00e9"}, {"", ""}};
  const fs::path p = dir / "m.safetensors";
  st::save(p, sample_tensors(), meta);
  EXPECT_EQ(st::load_metadata(p), meta);
  EXPECT_EQ(st::load(p).size(), sample_tensors().size());
}

TEST_F(SafeTensors, ReadsTensorsInBufferOrderWhateverTheHeaderOrder) {
  // The header lists b first, but a's data comes first; padding spaces after the JSON.
  const std::string h =
      R"({"b":{"dtype":"I8","shape":[1],"data_offsets":[2,3]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )";
  const fs::path p = dir / "order.safetensors";
  write_all(p, raw(h, "\x01\x02\xff"));
  const auto out = st::load(p);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "a");
  EXPECT_EQ(out[0].bytes, (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(out[1].name, "b");
  EXPECT_EQ(out[1].bytes, (std::vector<uint8_t>{0xff}));
}

// ---------------------------------------------------------------------------------------------
// save() validation

TEST_F(SafeTensors, SaveRejectsInvalidTensors) {
  const fs::path p = dir / "s.safetensors";
  auto err = [&](std::vector<st::TensorData> t) { return error_of([&] { st::save(p, t); }); };
  std::string e = err({{"a", DType::u8, {1}, {1}}, {"a", DType::u8, {1}, {2}}});
  EXPECT_HAS(e, "duplicate tensor name 'a'");
  EXPECT_HAS(e, p.string());
  e = err({{"a", DType::f32, {2, 2}, std::vector<uint8_t>(15)}});
  EXPECT_HAS(e, "15 bytes, but shape [2, 2] of F32 needs 16");
  e = err({{"s", DType::f64, {}, std::vector<uint8_t>(4)}});
  EXPECT_HAS(e, "needs 8");
  EXPECT_HAS(err({{"__metadata__", DType::u8, {1}, {1}}}), "reserved");
  EXPECT_HAS(err({{"", DType::u8, {1}, {1}}}), "empty name");
  EXPECT_HAS(err({{"n", DType::u8, {-1}, {}}}), "invalid shape [-1]");
  EXPECT_FALSE(fs::exists(p));
  e = error_of([&] { st::save(dir / "no" / "such" / "dir.safetensors", {}); });
  EXPECT_HAS(e, "cannot create");
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST_F(SafeTensors, TruncatedFiles) {
  EXPECT_HAS(load_error(""), "truncated: 0 bytes");
  EXPECT_HAS(load_error(std::string("\x10\x00\x00", 3)), "truncated: 3 bytes");

  // A valid file cut short: inside the buffer, then inside the header.
  const fs::path good = dir / "good.safetensors";
  st::save(good, sample_tensors());
  const std::string file = read_all(good);
  std::string e = load_error(file.substr(0, file.size() - 1));
  EXPECT_HAS(e, "out of range");
  EXPECT_HAS(e, "truncated file?");
  e = load_error(file.substr(0, 40));
  EXPECT_HAS(e, "is larger than the 32 bytes that follow it");
}

TEST_F(SafeTensors, HeaderLengthLargerThanFile) {
  EXPECT_HAS(load_error(le64(1000) + kOne), "header length 1000 is larger than");
  EXPECT_HAS(load_error(le64(UINT64_MAX) + kOne), "is larger than");
}

TEST_F(SafeTensors, HeaderNotJson) {
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8",)", "")), "header is not valid JSON");
  EXPECT_HAS(load_error(raw("hello world", "")), "does not start with '{'");
  EXPECT_HAS(load_error(raw("[1, 2]", "")), "does not start with '{'");
  EXPECT_HAS(load_error(raw("", "")), "does not start with '{'");
  EXPECT_HAS(load_error(raw(kOne + std::string(8, '\0'), "xx")), "contains a NUL byte");
  EXPECT_HAS(load_error(raw(kOne + " x", "xx")), "header is not valid JSON");  // text after the object
  EXPECT_HAS(load_error(raw(R"({"a":"x"})", "")), "tensor 'a': its entry is not a JSON object");
}

TEST_F(SafeTensors, DuplicateNames) {
  const std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_HAS(load_error(raw(h, "xy")), "duplicate key 'a'");
  // Also inside a tensor's entry.
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x")),
             "duplicate key 'dtype'");
}

TEST_F(SafeTensors, UnknownDtype) {
  std::string e = load_error(raw(R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", "x"));
  EXPECT_HAS(e, "tensor 'a': unknown dtype 'F7'");
  EXPECT_HAS(e, "F64, F32, F16, BF16, I32, I8, U8");
  e = load_error(raw(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", "xxxxxxxx"));
  EXPECT_HAS(e, "unsupported dtype 'I64'");
  e = load_error(raw(R"({"a":{"dtype":5,"shape":[1],"data_offsets":[0,1]}})", "x"));
  EXPECT_HAS(e, "'dtype' is not a string");
}

TEST_F(SafeTensors, ShapeOffsetSizeMismatch) {
  std::string e = load_error(raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"));
  EXPECT_HAS(e, "shape/offset size mismatch: shape [2] of F32 needs 8 bytes, but data_offsets [0, 4] cover 4");
  e = load_error(raw(R"({"a":{"dtype":"F64","shape":[],"data_offsets":[0,4]}})", "xxxx"));
  EXPECT_HAS(e, "size mismatch");
  e = load_error(raw(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""));
  EXPECT_HAS(e, "too large");
}

TEST_F(SafeTensors, BadFields) {
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", "x")), "missing 'shape'");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[1]}})", "x")), "missing 'data_offsets'");
  EXPECT_HAS(load_error(raw(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "x")), "missing 'dtype'");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x")),
             "non-negative integers");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", "x")),
             "non-negative integers");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})", "x")),
             "is not a pair [begin, end]");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", "x")), "end before begin");
  EXPECT_HAS(load_error(raw(R"({"__metadata__":{"k":1}})", "")), "value of 'k' is not a string");
  EXPECT_HAS(load_error(raw(R"({"__metadata__":[]})", "")), "__metadata__ is not a JSON object");
}

TEST_F(SafeTensors, OverlappingOffsets) {
  const std::string h = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  EXPECT_HAS(load_error(raw(h, "xyz")), "tensors 'a' and 'b' have overlapping data_offsets");
  // An empty tensor inside another one's range also overlaps it.
  const std::string e = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                        R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})";
  EXPECT_HAS(load_error(raw(e, "wxyz")), "overlapping");
}

TEST_F(SafeTensors, OutOfRangeOffsets) {
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "xyz")),
             "tensor 'a': data_offsets [2, 4] out of range: the data buffer has only 3 bytes");
}

TEST_F(SafeTensors, BytesNotCovered) {
  EXPECT_HAS(load_error(raw(kOne, "xyz")), "1 trailing bytes are not covered by any tensor");
  EXPECT_HAS(load_error(raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "xyz")),
             "buffer bytes [0, 1) are not covered by any tensor");
  EXPECT_HAS(load_error(raw("{}", "x")), "trailing bytes");
}

TEST_F(SafeTensors, MissingFile) {
  const std::string e = error_of([&] { st::load(dir / "absent.safetensors"); });
  EXPECT_HAS(e, "absent.safetensors");
  EXPECT_HAS(e, "cannot open");
}

// ---------------------------------------------------------------------------------------------
// Interoperability with the reference implementation (the `safetensors` Python package)

TEST_F(SafeTensors, PythonSafetensorsReadsOursAndWeReadTheirs) {
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not available (pip install safetensors numpy)";

  // numpy has no bfloat16, so the file for Python's values leaves the BF16 tensor out; the
  // reference reader still validates the header of a file with it ("full").
  auto tensors = sample_tensors();
  std::erase_if(tensors, [](const st::TensorData& t) { return t.dtype == DType::bf16; });
  const fs::path ours = dir / "ours.safetensors", theirs = dir / "theirs.safetensors", script = dir / "check.py";
  const fs::path full = dir / "full.safetensors";
  st::save(ours, tensors, {{"origin", "memtrade"}, {"step", "7"}});
  st::save(full, sample_tensors());

  write_all(script, R"PY(
import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

ours, theirs, full = sys.argv[1], sys.argv[2], sys.argv[3]
t = load_file(ours)
want = {
    "bytes": np.array([0, 1, 2, 127, 128, 254, 255], np.uint8),
    "small": np.array([-128, -1, 0, 1, 127], np.int8),
    "layers.0.weight": (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3),
    "scale": np.array(0.1, np.float64),
    "half": np.array([1.0, -2.5, 65504.0], np.float16),
    "ids": np.array([-2, -1, 0, 2147483647], np.int32).reshape(2, 1, 2),
    "empty": np.zeros((0, 4), np.float32),
}
assert sorted(t) == sorted(want), sorted(t)
for k, v in want.items():
    assert t[k].dtype == v.dtype and t[k].shape == v.shape, (k, t[k].dtype, t[k].shape)
    assert np.array_equal(t[k], v), (k, t[k])
with safe_open(ours, framework="np") as f:
    assert f.metadata() == {"origin": "memtrade", "step": "7"}, f.metadata()
with safe_open(full, framework="np") as f:
    assert sorted(f.keys()) == sorted(list(want) + ["bf"]), f.keys()
    assert f.get_slice("bf").get_dtype() == "BF16" and f.get_slice("bf").get_shape() == [2, 2]
    assert np.array_equal(f.get_tensor("ids"), want["ids"])  # after the unaligned tensors

save_file({
    "w": np.array([[1.5, -2.25], [3.0, 1e-3]], np.float32),
    "ids": np.arange(-3, 4, dtype=np.int32),
    "h": np.array([0.5, -65504.0, np.inf], np.float16),
    "pi": np.array(np.pi, np.float64),
    "u": np.arange(5, dtype=np.uint8),
    "e": np.zeros((0, 3), np.int8),
}, theirs, metadata={"from": "python"})
)PY");
  const std::string cmd = "python3 '" + script.string() + "' '" + ours.string() + "' '" + theirs.string() + "' '" + full.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the Python check failed: " << cmd;

  const auto got = st::load(theirs);
  std::map<std::string, st::TensorData> by_name;
  for (const auto& t : got) by_name[t.name] = t;
  ASSERT_EQ(by_name.size(), 6u);
  auto expect = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    ASSERT_TRUE(by_name.count(name)) << name;
    const auto& t = by_name[name];
    EXPECT_EQ(t.dtype, dtype) << name;
    EXPECT_EQ(t.shape, shape) << name;
    EXPECT_EQ(t.bytes, bytes) << name;
  };
  expect("w", DType::f32, {2, 2}, bytes_of(std::vector<float>{1.5f, -2.25f, 3.0f, 1e-3f}));
  expect("ids", DType::i32, {7}, bytes_of(std::vector<int32_t>{-3, -2, -1, 0, 1, 2, 3}));
  expect("h", DType::f16, {3},
         bytes_of(std::vector<uint16_t>{float_to_half_bits(0.5f), float_to_half_bits(-65504.0f),
                                        float_to_half_bits(std::numeric_limits<float>::infinity())}));
  expect("pi", DType::f64, {}, bytes_of(std::vector<double>{M_PI}));
  expect("u", DType::u8, {5}, {0, 1, 2, 3, 4});
  expect("e", DType::i8, {0, 3}, {});
  EXPECT_EQ(st::load_metadata(theirs), (std::map<std::string, std::string>{{"from", "python"}}));
}
