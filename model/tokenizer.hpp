// Byte-level BPE (GPT-2 style), as used by SmolLM2 and most Llama-architecture models whose GGUF file
// says tokenizer.ggml.model = "gpt2".
//
// Encoding, as Hugging Face tokenizers' ByteLevel pre-tokenizer + BPE model do it:
//   1. Special tokens (ggml token type 3 "control" or 4 "user defined", e.g. "<|im_start|>") are split
//      out of the text first, longest match first, and encode to their own id.
//   2. The rest is decoded from UTF-8 (a byte that is not part of valid UTF-8 stands alone) and cut
//      into pieces by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (\p{L} letters and \p{N} numbers by Unicode general category, \s Unicode White_Space).
//   3. Each piece's bytes are mapped to the 256 printable code points of GPT-2's bytes_to_unicode and
//      merged pairwise by the ranked merges (lowest rank first, all its occurrences left to right, until
//      no pair has a rank); the resulting symbols are looked up in the vocabulary.
// Decoding concatenates the tokens' strings and maps the code points back to bytes (special tokens
// decode to their text). decode(encode(x)) == x for every byte string x whose bytes all have a token.
// A vocabulary may lack some bytes (SmolLM2's has no token for 21 of them: 0xC0, 0xC1, 0xF5-0xFF, which
// never occur in UTF-8, and a few control characters); encoding such a byte throws Error naming it
// (Hugging Face's BPE without an unknown token drops it silently).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memtrade::gguf { class File; }

namespace memtrade::model {

class Tokenizer {
 public:
  // From the GGUF metadata tokenizer.ggml.{model, pre, tokens, token_type, merges, bos_token_id,
  // eos_token_id}. Throws Error naming the file and the problem: another tokenizer model, a merge
  // naming a token that is not in the vocabulary.
  static Tokenizer from_gguf(const gguf::File& f);
  // From the vocabulary (id = index), merges ("a b", highest priority first) and the token types
  // (empty: all normal).
  Tokenizer(std::vector<std::string> tokens, std::span<const std::string> merges, std::vector<int32_t> token_types = {});

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int32_t id) const;
  int32_t bos = -1, eos = -1;
  std::string pre;  // tokenizer.ggml.pre, for the record

  // The pre-tokenizer alone (step 2), as byte ranges of `text`.
  static std::vector<std::string_view> split(std::string_view text);

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, merged)
  int32_t byte_id_[256] = {};
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
};

}  // namespace memtrade::model
