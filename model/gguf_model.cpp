#include "model/gguf_model.hpp"

#include <cmath>
#include <cstdlib>

#include "common/common.hpp"
#include "model/train_case.hpp"

namespace memtrade::model {

namespace {

std::string hf_name(const std::string& g) {
  static const std::map<std::string, std::string> global = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  static const std::map<std::string, std::string> layer = {
      {"attn_norm", "input_layernorm"},      {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},        {"attn_output", "self_attn.o_proj"},
      {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  if (auto it = global.find(g); it != global.end()) return it->second;
  // blk.N.<part>.weight
  if (!g.starts_with("blk.")) return {};
  const auto dot = g.find('.', 4), last = g.rfind('.');
  if (dot == std::string::npos || last <= dot) return {};
  const auto it = layer.find(g.substr(dot + 1, last - dot - 1));
  if (it == layer.end() || g.substr(last) != ".weight") return {};
  return "model.layers." + g.substr(4, dot - 4) + "." + it->second + ".weight";
}

}  // namespace

Config config_from_gguf(const gguf::File& f) {
  const std::string arch = f.get_string("general.architecture");
  MT_CHECK(arch == "llama", f.path().string() + ": general.architecture is \"" + arch + "\"; only \"llama\" is read");
  Config c;
  c.dim = f.get_int("llama.embedding_length");
  c.layers = f.get_int("llama.block_count");
  c.heads = f.get_int("llama.attention.head_count");
  c.kv_heads = f.find("llama.attention.head_count_kv") ? f.get_int("llama.attention.head_count_kv") : c.heads;
  c.ffn = f.get_int("llama.feed_forward_length");
  c.context = f.get_int("llama.context_length");
  c.norm_eps = static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon"));
  c.rope_theta = f.find("llama.rope.freq_base") ? static_cast<float>(f.get_float("llama.rope.freq_base")) : 10000.f;
  c.vocab = f.find("llama.vocab_size") ? f.get_int("llama.vocab_size")
                                       : static_cast<int64_t>(f.get_array("tokenizer.ggml.tokens").size());
  c.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  try {
    validate(c);
  } catch (const Error& e) {
    throw Error(f.path().string() + ": " + e.what());
  }
  if (f.find("llama.rope.dimension_count"))
    MT_CHECK(f.get_int("llama.rope.dimension_count") == c.head_dim(),
             f.path().string() + ": llama.rope.dimension_count " + std::to_string(f.get_int("llama.rope.dimension_count")) +
                 " differs from head_dim " + std::to_string(c.head_dim()) + " (partial rotary embeddings are not implemented)");
  return c;
}

std::vector<float> unpermute_rope_rows(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t cols) {
  MT_CHECK(static_cast<int64_t>(w.size()) == heads * head_dim * cols && head_dim % 2 == 0,
           "unpermute_rope_rows: shape mismatch");
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j) {
        const float* src = &w[(h * head_dim + 2 * j + i) * cols];
        std::copy(src, src + cols, &out[(h * head_dim + i * half + j) * cols]);
      }
  return out;
}

Pretrained load_gguf_model(const std::filesystem::path& path) {
  const gguf::File f(path);
  Pretrained m{.name = {}, .path = path, .cfg = config_from_gguf(f), .params = {}, .stored_type = {},
               .tokenizer = Tokenizer::from_gguf(f)};
  m.name = f.find("general.name") ? f.get_string("general.name") : path.filename().string();
  MT_CHECK(m.tokenizer.vocab_size() <= m.cfg.vocab,
           path.string() + ": the tokenizer has " + std::to_string(m.tokenizer.vocab_size()) +
               " tokens, more than the model's vocabulary of " + std::to_string(m.cfg.vocab));
  const ParamLayout L = param_layout(m.cfg);
  std::map<std::string, const gguf::Tensor*> by_hf;
  for (const gguf::Tensor& t : f.tensors()) {
    const std::string n = hf_name(t.name);
    if (!n.empty()) by_hf[n] = &t;
  }
  m.params.resize(L.total);
  for (const ParamTensor& p : L.tensors) {
    const auto it = by_hf.find(p.name);
    MT_CHECK(it != by_hf.end(), path.string() + ": no GGUF tensor for " + p.name);
    const gguf::Tensor& t = *it->second;
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.shape.back();
    MT_CHECK(t.rows() == rows && t.cols() == cols && t.ne.size() == p.shape.size(),
             path.string() + ": GGUF tensor \"" + t.name + "\" is [" + std::to_string(t.rows()) + " x " +
                 std::to_string(t.cols()) + "], the configuration needs [" + std::to_string(rows) + " x " +
                 std::to_string(cols) + "] for " + p.name);
    std::vector<float> w = f.dequantize(t);
    if (p.name.ends_with("q_proj.weight")) w = unpermute_rope_rows(w, m.cfg.heads, m.cfg.head_dim(), cols);
    if (p.name.ends_with("k_proj.weight")) w = unpermute_rope_rows(w, m.cfg.kv_heads, m.cfg.head_dim(), cols);
    for (int64_t i = 0; i < p.size; ++i)
      MT_CHECK(std::isfinite(w[i]), path.string() + ": GGUF tensor \"" + t.name + "\" holds a non-finite value at " +
                                        std::to_string(i));
    std::copy(w.begin(), w.end(), m.params.begin() + p.offset);
    m.stored_type[p.name] = gguf::tensor_type_traits(static_cast<uint32_t>(t.type))->name;
  }
  return m;
}

std::filesystem::path models_dir() {
  if (const char* d = std::getenv("MEMTRADE_MODELS_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "memtrade" / "models";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home && *home ? home : "/tmp") / ".cache" / "memtrade" / "models";
}

std::filesystem::path smollm2_path() { return models_dir() / kSmolLM2File; }

PretrainedText load_smollm2_text(const Case& c) {
  const std::filesystem::path path = smollm2_path();
  if (!std::filesystem::exists(path))
    throw Skip(path.string() + " is absent: run " + std::string(kFetchModelsCommand) +
               " (or set MEMTRADE_MODELS_DIR to the folder holding " + kSmolLM2File + ")");
  PretrainedText d{load_gguf_model(path), {}, {}, 0};
  TrainCase corpus_case;
  corpus_case.corpus_dir = c.text("corpus_dir", "");
  corpus_case.corpus_sha256 = c.text("corpus_sha256", "");
  d.corpus = load_case_corpus(corpus_case);
  d.tokens = d.model.tokenizer.encode(
      std::string_view(reinterpret_cast<const char*>(d.corpus.bytes.data()), d.corpus.bytes.size()));
  d.val_start = d.tokens.size() * 9 / 10;
  return d;
}

}  // namespace memtrade::model
