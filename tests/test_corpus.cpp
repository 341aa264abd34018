#include "datasets/corpus.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>

#include "datasets/random.hpp"

using namespace memtrade;
namespace fs = std::filesystem;

namespace {

const fs::path kFortunes = "/usr/share/games/fortunes";

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

using memtrade::test::error_of;

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// SHA-256 of `bytes` from coreutils' sha256sum (an independent implementation), or "" if unavailable.
std::string sha256sum_tool(std::span<const uint8_t> bytes, const fs::path& dir) {
  const fs::path f = dir / "sha_input.bin";
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  FILE* p = popen(("sha256sum '" + f.string() + "' 2>/dev/null").c_str(), "r");
  if (!p) return "";
  char buf[65] = {};
  const std::size_t got = fread(buf, 1, 64, p);
  pclose(p);
  return got == 64 ? std::string(buf, 64) : "";
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir = test::scratch_dir() / ("corpus_" + std::to_string(counter++));
    fs::create_directories(dir);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
  fs::path dir;
};

datasets::Corpus synthetic(std::size_t n) {
  datasets::Corpus c;
  for (std::size_t i = 0; i < n; ++i) c.bytes.push_back(uint8_t(i * 7 + 3));
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SHA-256

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(datasets::sha256_hex(as_bytes("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(datasets::sha256_hex(as_bytes("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // The 448-bit message: its padding needs a second block.
  EXPECT_EQ(datasets::sha256_hex(as_bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // The 896-bit message.
  EXPECT_EQ(datasets::sha256_hex(as_bytes("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                                      "klmnopqrlmnopqrsmnopqrstnopqrstu")),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(datasets::sha256_hex(as_bytes(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_F(TempDir, Sha256MatchesSha256sumAtEveryPaddingBoundary) {
  if (sha256sum_tool(as_bytes("abc"), dir).empty()) GTEST_SKIP() << "sha256sum (coreutils) not available";
  for (std::size_t n : {1, 54, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000}) {
    std::vector<uint8_t> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = uint8_t(datasets::mix64(i + 1000 * n));
    EXPECT_EQ(datasets::sha256_hex(bytes), sha256sum_tool(bytes, dir)) << "length " << n;
  }
}

// ---------------------------------------------------------------------------------------------
// The real corpus

TEST(Fortunes, LoadsTheInstalledCorpus) {
  if (!fs::is_directory(kFortunes))
    GTEST_SKIP() << kFortunes << " is absent; install the corpus with: apt-get install fortunes";
  const auto c = datasets::load_fortunes();
  EXPECT_GT(c.bytes.size(), 1000000u);
  EXPECT_GE(c.files, 10u);
  EXPECT_EQ(c.source, "fortunes:" + kFortunes.string());
  ASSERT_EQ(c.sha256.size(), 64u);
  EXPECT_EQ(c.sha256, datasets::sha256_hex(c.bytes));

  // Mostly printable ASCII text (the rest: UTF-8 and a few backspace overstrikes).
  std::size_t text = 0;
  for (uint8_t b : c.bytes) text += (b >= 0x20 && b < 0x7F) || b == '\n' || b == '\t';
  EXPECT_GT(double(text) / double(c.bytes.size()), 0.99);

  // No separator line survives, and the last entry ends with its newline.
  const std::string s(c.bytes.begin(), c.bytes.end());
  EXPECT_EQ(s.find("\n%\n"), std::string::npos);
  EXPECT_NE(s.rfind("%\n", 0), 0u);
  EXPECT_EQ(s.back(), '\n');

  // Stable across loads.
  const auto again = datasets::load_fortunes(kFortunes);
  EXPECT_EQ(again.sha256, c.sha256);
  EXPECT_EQ(again.bytes, c.bytes);
  std::printf("  fortunes corpus: %zu files, %zu bytes, sha256 %s\n", c.files, c.bytes.size(), c.sha256.c_str());
}

TEST_F(TempDir, InstalledCorpusChecksumMatchesSha256sum) {
  if (!fs::is_directory(kFortunes))
    GTEST_SKIP() << kFortunes << " is absent; install the corpus with: apt-get install fortunes";
  const auto c = datasets::load_fortunes();
  const std::string tool = sha256sum_tool(c.bytes, dir);
  if (tool.empty()) GTEST_SKIP() << "sha256sum (coreutils) not available";
  EXPECT_EQ(c.sha256, tool);
}

TEST_F(TempDir, EntriesAreJoinedBySingleNewlinesAndOnlyExtensionlessFilesCount) {
  const std::string big(70000, 'x');
  write_file(dir / "b", "B1 line\n%\nB2\n%\n");
  write_file(dir / "a", "A1\nA1b\n%\n%\n  \n%\nA2");  // an empty and a blank entry; no final newline
  write_file(dir / "z", big + "\n");
  write_file(dir / "a.dat", "INDEX");
  write_file(dir / "a.u8", "UTF8 COPY");
  write_file(dir / ".hidden", "HIDDEN");
  write_file(dir / "off" / "rude", "OFFENSIVE");
  const auto c = datasets::load_fortunes(dir);
  EXPECT_EQ(c.files, 3u);
  const std::string want = "A1\nA1b\n\nA2\n\nB1 line\n\nB2\n\n" + big + "\n";
  EXPECT_EQ(std::string(c.bytes.begin(), c.bytes.end()), want);
  EXPECT_EQ(c.sha256, datasets::sha256_hex(as_bytes(want)));
  EXPECT_EQ(c.source, "fortunes:" + dir.string());
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_F(TempDir, MissingDirectoryNamesThePathAndTheFix) {
  const fs::path missing = dir / "nope";
  const std::string e = error_of([&] { datasets::load_fortunes(missing); });
  EXPECT_NE(e.find(missing.string()), std::string::npos) << e;
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  EXPECT_NE(e.find("apt-get install fortunes"), std::string::npos) << e;
}

TEST_F(TempDir, PathThatIsAFile) {
  write_file(dir / "file", "x");
  const std::string e = error_of([&] { datasets::load_fortunes(dir / "file"); });
  EXPECT_NE(e.find("is not a directory"), std::string::npos) << e;
}

TEST_F(TempDir, EmptyDirectoryOrOnlyIndexFiles) {
  std::string e = error_of([&] { datasets::load_fortunes(dir); });
  EXPECT_NE(e.find("no fortune files in '" + dir.string() + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("apt-get install fortunes"), std::string::npos) << e;

  write_file(dir / "art.dat", "index");
  write_file(dir / "art.u8", "copy");
  write_file(dir / "off" / "art", "offensive");
  e = error_of([&] { datasets::load_fortunes(dir); });
  EXPECT_NE(e.find("no fortune files"), std::string::npos) << e;
}

TEST_F(TempDir, TinyCorpus) {
  write_file(dir / "small", "Only one short fortune.\n%\nAnd another.\n");
  const std::string e = error_of([&] { datasets::load_fortunes(dir); });
  EXPECT_NE(e.find(dir.string()), std::string::npos) << e;
  EXPECT_NE(e.find("fewer than the 65536"), std::string::npos) << e;
  EXPECT_NE(e.find("apt-get install fortunes"), std::string::npos) << e;
}

TEST_F(TempDir, UnreadableFile) {
  write_file(dir / "locked", std::string(70000, 'x'));
  fs::permissions(dir / "locked", fs::perms::none);
  if (std::ifstream(dir / "locked")) GTEST_SKIP() << "running with permission to read mode-000 files (root)";
  const std::string e = error_of([&] { datasets::load_fortunes(dir); });
  EXPECT_NE(e.find("cannot read '" + (dir / "locked").string() + "'"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------
// Split

TEST(Split, LastFractionIsValidation) {
  const auto c = synthetic(1000);
  const auto s = datasets::split(c, 0.1);
  EXPECT_EQ(s.train.size(), 900u);
  EXPECT_EQ(s.val.size(), 100u);
  EXPECT_EQ(s.train.data(), c.bytes.data());
  EXPECT_EQ(s.val.data(), c.bytes.data() + 900);

  const auto d = datasets::split(c);  // default 0.1
  EXPECT_EQ(d.val.size(), 100u);
  const auto h = datasets::split(c, 0.5);
  EXPECT_EQ(h.train.size(), 500u);
  EXPECT_EQ(h.val.size(), 500u);
  const auto r = datasets::split(synthetic(1001), 0.1);  // rounded down: 100.1 -> 100
  EXPECT_EQ(r.val.size(), 100u);
  EXPECT_EQ(r.train.size(), 901u);
}

TEST(Split, RejectsBadFractionsAndTooLittleData) {
  const auto c = synthetic(1000);
  for (double f : {0.0, -0.1, 0.51, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
    const std::string e = error_of([&] { datasets::split(c, f); });
    EXPECT_NE(e.find("outside (0, 0.5]"), std::string::npos) << f << ": " << e;
  }
  const std::string e = error_of([&] { datasets::split(synthetic(5), 0.1); });
  EXPECT_NE(e.find("too few"), std::string::npos) << e;
}

TEST(Split, RealCorpus) {
  if (!fs::is_directory(kFortunes))
    GTEST_SKIP() << kFortunes << " is absent; install the corpus with: apt-get install fortunes";
  const auto c = datasets::load_fortunes();
  const auto s = datasets::split(c);
  EXPECT_EQ(s.train.size() + s.val.size(), c.bytes.size());
  EXPECT_NEAR(double(s.val.size()) / double(c.bytes.size()), 0.1, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Batches

TEST(Batch, DeterministicShiftedAndInRange) {
  std::vector<uint8_t> bytes(5000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(datasets::mix64(i));
  const std::span<const uint8_t> d(bytes);

  const auto a = datasets::sample_batch(d, 8, 64, 42, 3);
  const auto b = datasets::sample_batch(d, 8, 64, 42, 3);
  EXPECT_EQ(a.batch, 8);
  EXPECT_EQ(a.context, 64);
  ASSERT_EQ(a.inputs.size(), 8u * 64u);
  ASSERT_EQ(a.targets.size(), 8u * 64u);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);

  EXPECT_NE(datasets::sample_batch(d, 8, 64, 42, 4).inputs, a.inputs);  // another step
  EXPECT_NE(datasets::sample_batch(d, 8, 64, 43, 3).inputs, a.inputs);  // another seed

  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t i = 0; i + 1 < 64; ++i) EXPECT_EQ(a.targets[r * 64 + i], a.inputs[r * 64 + i + 1]);
    // Each row is the window of the data at the documented start offset.
    const double u = datasets::uniform01(42, 3 * 8 + uint64_t(r));
    const auto start = std::size_t(std::floor(u * double(bytes.size() - 64)));
    for (int64_t i = 0; i < 64; ++i) {
      EXPECT_EQ(a.inputs[r * 64 + i], bytes[start + i]);
      EXPECT_EQ(a.targets[r * 64 + i], bytes[start + i + 1]);
    }
  }
  for (int32_t v : a.inputs) EXPECT_TRUE(v >= 0 && v <= 255);
  for (int32_t v : a.targets) EXPECT_TRUE(v >= 0 && v <= 255);
}

TEST(Batch, StartsCoverEveryValidOffset) {
  std::vector<uint8_t> bytes(200);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i);  // value = position
  const int64_t ctx = 8;
  std::set<int32_t> starts;
  for (uint64_t step = 0; step < 500; ++step) {
    const auto b = datasets::sample_batch(bytes, 4, ctx, 7, step);
    for (int64_t r = 0; r < 4; ++r) starts.insert(b.inputs[r * ctx]);
  }
  EXPECT_EQ(starts.size(), 200u - ctx);  // every start 0 .. 191 occurs, none beyond
  EXPECT_EQ(*starts.begin(), 0);
  EXPECT_EQ(*starts.rbegin(), 200 - ctx - 1);

  // Exactly context + 1 bytes: the only window is the whole data.
  const auto one = datasets::sample_batch(std::span<const uint8_t>(bytes).first(ctx + 1), 3, ctx, 1, 0);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < ctx; ++i) {
      EXPECT_EQ(one.inputs[r * ctx + i], i);
      EXPECT_EQ(one.targets[r * ctx + i], i + 1);
    }
}

TEST(Batch, RealCorpus) {
  if (!fs::is_directory(kFortunes))
    GTEST_SKIP() << kFortunes << " is absent; install the corpus with: apt-get install fortunes";
  const auto c = datasets::load_fortunes();
  const auto s = datasets::split(c);
  const auto b = datasets::sample_batch(s.val, 16, 256, 1, 0);
  EXPECT_EQ(b.inputs.size(), 16u * 256u);
  EXPECT_EQ(b.inputs, datasets::sample_batch(s.val, 16, 256, 1, 0).inputs);
}

TEST(Batch, Errors) {
  std::vector<uint8_t> bytes(10, 'a');
  std::string e = error_of([&] { datasets::sample_batch(bytes, 1, 10, 0, 0); });  // needs 11 bytes
  EXPECT_NE(e.find("too few for a context of 10"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { datasets::sample_batch(bytes, 1, 9, 0, 0); }), "(no error)");
  e = error_of([&] { datasets::sample_batch(bytes, 0, 4, 0, 0); });
  EXPECT_NE(e.find("must be at least 1"), std::string::npos) << e;
  e = error_of([&] { datasets::sample_batch(bytes, 2, 0, 0, 0); });
  EXPECT_NE(e.find("must be at least 1"), std::string::npos) << e;
  e = error_of([&] { datasets::sample_batch(bytes, 2, -3, 0, 0); });
  EXPECT_NE(e.find("must be at least 1"), std::string::npos) << e;
  e = error_of([&] { datasets::sample_batch(std::span<const uint8_t>{}, 1, 1, 0, 0); });
  EXPECT_NE(e.find("too few"), std::string::npos) << e;
}

TEST(Batch, TokenStreamsSampleTheSameWindowsAsBytes) {
  std::vector<uint8_t> bytes(300);
  std::vector<int32_t> tokens(300);
  for (int i = 0; i < 300; ++i) {
    bytes[i] = static_cast<uint8_t>(i % 251);
    tokens[i] = 1000 + i;
  }
  const auto b = datasets::sample_batch(bytes, 3, 17, 5, 2), t = datasets::sample_batch(tokens, 3, 17, 5, 2);
  ASSERT_EQ(t.inputs.size(), b.inputs.size());
  for (std::size_t i = 0; i < t.inputs.size(); ++i) {
    const int32_t pos = t.inputs[i] - 1000;  // token i sits at position i
    EXPECT_EQ(pos % 251, b.inputs[i]);
    EXPECT_EQ(t.targets[i], t.inputs[i] + 1);
  }
}
