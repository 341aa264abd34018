#include "model/tokenizer.hpp"

#include <algorithm>
#include <limits>

#include "common/common.hpp"
#include "model/gguf.hpp"
#include "model/unicode_ranges.hpp"

namespace memtrade::model {

namespace {

enum class Cat : uint8_t { letter, number, space, other };

bool in_ranges(std::span<const unicode::CodeRange> r, uint32_t cp) {
  auto it = std::upper_bound(r.begin(), r.end(), cp, [](uint32_t v, const unicode::CodeRange& x) { return v < x.first; });
  return it != r.begin() && cp <= std::prev(it)->last;
}

// Unicode White_Space.
bool white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

Cat category(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return Cat::letter;
    if (cp >= '0' && cp <= '9') return Cat::number;
    return white_space(cp) ? Cat::space : Cat::other;
  }
  if (white_space(cp)) return Cat::space;
  if (in_ranges(unicode::kLetters, cp)) return Cat::letter;
  if (in_ranges(unicode::kNumbers, cp)) return Cat::number;
  return Cat::other;
}

struct Char {
  uint32_t cp;  // code point, or 0xFFFFFFFF for a byte outside valid UTF-8
  uint32_t start, len;
  Cat cat;
};

// Decodes UTF-8; each byte of an invalid sequence becomes a Char of its own with category other.
std::vector<Char> decode_utf8(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) {
      out.push_back({0xFFFFFFFFu, static_cast<uint32_t>(i), 1, Cat::other});
      ++i;
    } else {
      out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len), category(cp)});
      i += len;
    }
  }
  return out;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) s += static_cast<char>(cp);
  else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to 256 + n.
struct ByteMap {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = printable(b) ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

constexpr int32_t kControl = 3, kUserDefined = 4;  // ggml token types

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::span<const std::string> merges, std::vector<int32_t> token_types)
    : tokens_(std::move(tokens)), types_(std::move(token_types)) {
  MT_CHECK(!tokens_.empty() && tokens_.size() < static_cast<std::size_t>(std::numeric_limits<int32_t>::max()),
           "tokenizer: the vocabulary is empty or too large");
  MT_CHECK(types_.empty() || types_.size() == tokens_.size(),
           "tokenizer: " + std::to_string(types_.size()) + " token types for " + std::to_string(tokens_.size()) + " tokens");
  if (types_.empty()) types_.assign(tokens_.size(), 1);
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    ids_.emplace(tokens_[i], static_cast<int32_t>(i));  // the first id of a repeated string wins
    if ((types_[i] == kControl || types_[i] == kUserDefined) && !tokens_[i].empty())
      specials_.emplace_back(tokens_[i], static_cast<int32_t>(i));
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_map().to_cp[b]);
    const auto it = ids_.find(s);
    byte_id_[b] = it == ids_.end() ? -1 : it->second;
  }
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const auto sp = m.find(' ');
    MT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
             "tokenizer: merge " + std::to_string(r) + " \"" + m + "\" is not two tokens separated by one space");
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
    MT_CHECK(ia != ids_.end() && ib != ids_.end() && iab != ids_.end(),
             "tokenizer: merge " + std::to_string(r) + " \"" + m + "\" names a token that is not in the vocabulary");
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(static_cast<int32_t>(r), iab->second));
  }
}

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  MT_CHECK(model == "gpt2", f.path().string() + ": tokenizer.ggml.model is \"" + model +
                                "\"; only byte-level BPE (\"gpt2\") is implemented");
  auto strings = [&](const char* key) {
    std::vector<std::string> out;
    for (const Json& v : f.get_array(key)) {
      MT_CHECK(v.is_string(), f.path().string() + ": " + key + " must be an array of strings");
      out.push_back(v.get<std::string>());
    }
    return out;
  };
  std::vector<int32_t> types;
  if (f.find("tokenizer.ggml.token_type"))
    for (const Json& v : f.get_array("tokenizer.ggml.token_type")) {
      MT_CHECK(v.is_number_integer(), f.path().string() + ": tokenizer.ggml.token_type must be an array of integers");
      types.push_back(v.get<int32_t>());
    }
  const std::vector<std::string> merges = strings("tokenizer.ggml.merges");
  Tokenizer t = [&] {
    try {
      return Tokenizer(strings("tokenizer.ggml.tokens"), merges, std::move(types));
    } catch (const Error& e) {
      throw Error(f.path().string() + ": " + e.what());
    }
  }();
  t.pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
  auto id = [&](const char* key) {
    if (!f.find(key)) return int32_t{-1};
    const int64_t v = f.get_int(key);
    MT_CHECK(v >= 0 && v < t.vocab_size(), f.path().string() + ": " + key + " = " + std::to_string(v) + " is not a token id");
    return static_cast<int32_t>(v);
  };
  t.bos = id("tokenizer.ggml.bos_token_id");
  t.eos = id("tokenizer.ggml.eos_token_id");
  return t;
}

const std::string& Tokenizer::token(int32_t id) const {
  MT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: id " + std::to_string(id) + " is outside the vocabulary of " +
                                             std::to_string(vocab_size()));
  return tokens_[id];
}

std::vector<std::string_view> Tokenizer::split(std::string_view text) {
  const std::vector<Char> c = decode_utf8(text);
  const std::size_t n = c.size();
  std::vector<std::string_view> out;
  auto emit = [&](std::size_t i, std::size_t j) {
    const std::size_t b = c[i].start, e = c[j - 1].start + c[j - 1].len;
    out.push_back(text.substr(b, e - b));
  };
  auto run = [&](std::size_t j, Cat cat) {
    while (j < n && c[j].cat == cat) ++j;
    return j;
  };
  for (std::size_t i = 0; i < n;) {
    // 's 't 're 've 'm 'll 'd
    if (c[i].cp == '\'' && i + 1 < n) {
      const uint32_t a = c[i + 1].cp, b = i + 2 < n ? c[i + 2].cp : 0;
      std::size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
    const std::size_t k = c[i].cp == ' ' && i + 1 < n && c[i + 1].cat != Cat::space ? i + 1 : i;
    if (c[k].cat != Cat::space) {
      const std::size_t j = run(k, c[k].cat);
      emit(i, j);
      i = j;
      continue;
    }
    // '\s+(?!\S)': a whitespace run not followed by a non-space, else all of it but its last character
    // when that leaves something; '\s+' otherwise.
    const std::size_t j = run(i, Cat::space);
    const std::size_t end = j == n || j - i == 1 ? j : j - 1;
    emit(i, end);
    i = end;
  }
  return out;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (unsigned char b : piece) {
    MT_CHECK(byte_id_[b] >= 0, "tokenizer: the text holds byte 0x" + std::string(1, "0123456789abcdef"[b >> 4]) +
                                   "0123456789abcdef"[b & 15] + ", which has no token in this vocabulary");
    sym.push_back(byte_id_[b]);
  }
  while (sym.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max(), merged = -1, left = -1, right = -1;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
      if (it != merges_.end() && it->second.first < best) {
        best = it->second.first;
        merged = it->second.second;
        left = sym[i];
        right = sym[i + 1];
      }
    }
    if (merged < 0) break;
    std::size_t w = 0;
    for (std::size_t i = 0; i < sym.size(); ++i) {
      if (i + 1 < sym.size() && sym[i] == left && sym[i + 1] == right) {
        sym[w++] = merged;
        ++i;
      } else {
        sym[w++] = sym[i];
      }
    }
    sym.resize(w);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  auto plain = [&](std::string_view s) {
    for (std::string_view piece : split(s)) {
      auto [it, fresh] = cache.try_emplace(piece);
      if (fresh) encode_piece(piece, it->second);
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  };
  std::size_t pos = 0, from = 0;
  while (pos < text.size() && !specials_.empty()) {
    const auto it = std::find_if(specials_.begin(), specials_.end(),
                                 [&](const auto& s) { return text.substr(pos).starts_with(s.first); });
    if (it == specials_.end()) {
      ++pos;
      continue;
    }
    plain(text.substr(from, pos - from));
    out.push_back(it->second);
    pos += it->first.size();
    from = pos;
  }
  plain(text.substr(from));
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  const ByteMap& m = byte_map();
  for (int32_t id : ids) {
    const std::string& t = token(id);
    if (types_[id] == kControl || types_[id] == kUserDefined) {
      out += t;
      continue;
    }
    for (const Char& ch : decode_utf8(t)) {
      const auto it = m.to_byte.find(ch.cp);
      MT_CHECK(it != m.to_byte.end(), "tokenizer: token " + std::to_string(id) + " holds a character outside the byte map");
      out += static_cast<char>(it->second);
    }
  }
  return out;
}

}  // namespace memtrade::model
