#include "datasets/corpus.hpp"

#include <cstdlib>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string_view>
#include <system_error>

#include "datasets/random.hpp"

namespace memtrade::datasets {

// ---------------------------------------------------------------------------------------------
// SHA-256, FIPS 180-4. The message is padded with a 1 bit, zeros, and its bit length as a
// big-endian u64 so the total is a multiple of 512 bits; each 512-bit block is expanded into 64
// words and mixed into eight 32-bit state words by 64 rounds.
namespace {

constexpr std::array<uint32_t, 64> kRound = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress(std::array<uint32_t, 8>& h, const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t)  // big-endian words
    w[t] = uint32_t(block[4 * t]) << 24 | uint32_t(block[4 * t + 1]) << 16 | uint32_t(block[4 * t + 2]) << 8 |
           uint32_t(block[4 * t + 3]);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

}  // namespace

std::string sha256_hex(std::span<const uint8_t> data) {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const std::size_t full = data.size() / 64;
  for (std::size_t i = 0; i < full; ++i) compress(h, data.data() + 64 * i);

  // The tail plus padding fills one block, or two when fewer than 9 bytes remain for 0x80 + length.
  uint8_t tail[128] = {};
  const std::size_t rest = data.size() - 64 * full;
  std::copy(data.begin() + 64 * full, data.end(), tail);
  tail[rest] = 0x80;
  const std::size_t tail_len = rest + 9 <= 64 ? 64 : 128;
  const uint64_t bits = uint64_t(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = uint8_t(bits >> (8 * i));
  for (std::size_t off = 0; off < tail_len; off += 64) compress(h, tail + off);

  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (uint32_t word : h)
    for (int shift = 28; shift >= 0; shift -= 4) out += hex[(word >> shift) & 0xF];
  return out;
}

// ---------------------------------------------------------------------------------------------
// Fortune files.
namespace {

constexpr std::size_t kMinBytes = 64 * 1024;
constexpr const char* kInstallHint = "apt-get install fortunes";

// Appends the entries of one fortune file to `out` (see the header for the format).
void append_entries(std::string_view text, std::vector<uint8_t>& out) {
  std::string entry;
  auto flush = [&] {
    const bool blank = std::all_of(entry.begin(), entry.end(), [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    });
    if (!blank) {
      if (!out.empty()) out.push_back('\n');
      out.insert(out.end(), entry.begin(), entry.end());
    }
    entry.clear();
  };
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    if (line == "%") {
      flush();
    } else {
      entry.append(line);
      entry.push_back('\n');  // a last line without a newline still gets one
    }
    pos = end + 1;
  }
  flush();
}

}  // namespace

std::filesystem::path default_fortunes_dir() {
  if (const char* d = std::getenv("MEMTRADE_FORTUNES_DIR"); d && *d) return d;
  return "/usr/share/games/fortunes";
}

Corpus load_fortunes(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const std::string where = std::string("'").append(dir.string()).append("'");
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw Error("fortunes corpus: directory " + where + " does not exist (install the Debian fortunes package: " +
                kInstallHint + ")");
  if (!fs::is_directory(dir, ec))
    throw Error("fortunes corpus: " + where + " is not a directory (pass the fortunes directory, e.g. "
                "/usr/share/games/fortunes, installed by: " + kInstallHint + ")");

  // Regular files whose name has no '.' at all: "art" yes; "art.dat", "art.u8", ".hidden" no.
  std::vector<fs::path> files;
  try {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.find('.') == std::string::npos) files.push_back(e.path());
    }
  } catch (const fs::filesystem_error& err) {
    throw Error("fortunes corpus: cannot list " + where + ": " + err.what() + " (check its permissions)");
  }
  if (files.empty())
    throw Error("fortunes corpus: no fortune files in " + where +
                " (expected plain-text files without an extension; install them with: " + kInstallHint + ")");
  std::sort(files.begin(), files.end());

  Corpus c;
  c.source = "fortunes:" + dir.string();
  c.files = files.size();
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in)
      throw Error("fortunes corpus: cannot read '" + f.string() +
                  "' (check its permissions, or reinstall it: apt-get install --reinstall fortunes)");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    append_entries(text, c.bytes);
  }
  if (c.bytes.size() < kMinBytes)
    throw Error("fortunes corpus: " + where + " holds only " + std::to_string(c.bytes.size()) +
                " bytes of fortune text, fewer than the 65536 needed (install the full set: " + kInstallHint + ")");
  c.sha256 = sha256_hex(c.bytes);
  return c;
}

Split split(const Corpus& corpus, double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction <= 0.5))  // also rejects NaN
    throw Error("corpus split: validation fraction " + std::to_string(val_fraction) + " is outside (0, 0.5]");
  const std::size_t n = corpus.bytes.size();
  const auto n_val = static_cast<std::size_t>(std::floor(static_cast<double>(n) * val_fraction));
  if (n_val == 0 || n_val == n)
    throw Error("corpus split: " + std::to_string(n) + " bytes are too few to split with validation fraction " +
                std::to_string(val_fraction));
  const std::span<const uint8_t> all(corpus.bytes);
  return {all.first(n - n_val), all.last(n_val)};
}

namespace {
template <class T>
Batch sample(std::span<const T> data, int64_t batch, int64_t context, uint64_t seed, uint64_t step) {
  if (batch < 1 || context < 1)
    throw Error("sample_batch: batch (" + std::to_string(batch) + ") and context (" + std::to_string(context) +
                ") must be at least 1");
  if (data.size() < static_cast<uint64_t>(context) + 1)
    throw Error("sample_batch: " + std::to_string(data.size()) + " tokens of data are too few for a context of " +
                std::to_string(context) + " (need at least context + 1)");
  Batch b;
  b.batch = batch;
  b.context = context;
  const std::size_t ctx = static_cast<std::size_t>(context);
  b.inputs.resize(static_cast<std::size_t>(batch) * ctx);
  b.targets.resize(b.inputs.size());
  // Valid starts are 0 .. data.size() - context - 1, so that the last target exists.
  const uint64_t starts = data.size() - ctx;
  for (int64_t r = 0; r < batch; ++r) {
    const double u = uniform01(seed, step * static_cast<uint64_t>(batch) + static_cast<uint64_t>(r));
    const uint64_t start = std::min<uint64_t>(static_cast<uint64_t>(u * static_cast<double>(starts)), starts - 1);
    const std::size_t row = static_cast<std::size_t>(r) * ctx;
    for (std::size_t i = 0; i < ctx; ++i) {
      b.inputs[row + i] = data[start + i];
      b.targets[row + i] = data[start + i + 1];
    }
  }
  return b;
}
}  // namespace

Batch sample_batch(std::span<const uint8_t> data, int64_t batch, int64_t context, uint64_t seed, uint64_t step) {
  return sample(data, batch, context, seed, step);
}
Batch sample_batch(std::span<const int32_t> tokens, int64_t batch, int64_t context, uint64_t seed, uint64_t step) {
  return sample(tokens, batch, context, seed, step);
}

}  // namespace memtrade::datasets
