// Byte-level text corpus for the language-modelling workloads: real English text from the Debian
// `fortunes` package (quotations, jokes, poems), plus a fixed train/validation split and
// deterministic batch sampling.
//
// The corpus is the concatenation of every fortune entry of the plain-text files in the fortunes
// directory (sorted by file name). A fortune file holds entries separated by lines that contain
// only "%". Each entry keeps its own line breaks (its last line ends in '\n'); entries are joined
// by a single '\n', so consecutive entries are separated by one blank line. Empty entries are
// dropped. The SHA-256 of the resulting bytes identifies exactly which corpus a result used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/common.hpp"

namespace memtrade::datasets {

struct Corpus {
  std::vector<uint8_t> bytes;
  std::string source;  // "fortunes:<directory>"
  std::string sha256;  // lowercase hex digest of `bytes`
  std::size_t files = 0;
};

// Loads the corpus from `dir`: its regular files whose name has no extension ("art", "computers",
// ...), which skips the *.dat indexes, the *.u8 copies and subdirectories such as off/. Throws
// Error (with the path and an install hint) when the directory is missing, holds no usable file,
// a file cannot be read, or the text is smaller than 64 KiB.
// $MEMTRADE_FORTUNES_DIR when set (e.g. a tree unpacked from the .deb on a machine without apt),
// else /usr/share/games/fortunes.
std::filesystem::path default_fortunes_dir();
Corpus load_fortunes(const std::filesystem::path& dir = default_fortunes_dir());

// Fixed split: the last `val_fraction` of the bytes (rounded down) is validation, the rest
// training. No shuffling, so it is the same everywhere. val_fraction must be in (0, 0.5] and
// both parts must be non-empty.
struct Split {
  std::span<const uint8_t> train, val;
};
Split split(const Corpus& corpus, double val_fraction = 0.1);

// `batch` rows of `context` input bytes each, row-major ([batch][context]), with next-byte
// targets: targets of a row are its inputs shifted by one byte. Row r starts at offset
// floor(u * (data.size() - context)), u = uniform01(seed, step * batch + r), so a (seed, step)
// pair gives the same batch on every machine. Values are bytes 0..255.
struct Batch {
  std::vector<int32_t> inputs, targets;
  int64_t batch = 0, context = 0;
};
Batch sample_batch(std::span<const uint8_t> data, int64_t batch, int64_t context, uint64_t seed, uint64_t step);
// The same over token ids (a tokenized text), with the same starts for the same sizes.
Batch sample_batch(std::span<const int32_t> tokens, int64_t batch, int64_t context, uint64_t seed, uint64_t step);

// SHA-256 (FIPS 180-4) of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::span<const uint8_t> data);

}  // namespace memtrade::datasets
