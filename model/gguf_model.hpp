// A pretrained Llama-architecture model from a GGUF file (general.architecture = "llama"), as the
// model of model.hpp with fp32 parameters, and its tokenizer.
//
// Configuration from the metadata: llama.{embedding_length, block_count, attention.head_count,
// attention.head_count_kv, feed_forward_length, context_length, rope.freq_base,
// attention.layer_norm_rms_epsilon, vocab_size} (vocab: else the tokenizer's size). The RoPE must rotate
// the whole head (rope.dimension_count = head_dim). No output.weight tensor means tied embeddings.
//
// Tensor names map onto Hugging Face's: token_embd -> model.embed_tokens, blk.N.attn_norm ->
// input_layernorm, attn_{q,k,v,output} -> self_attn.{q,k,v,o}_proj, ffn_norm -> post_attention_layernorm,
// ffn_{gate,up,down} -> mlp.*_proj, output_norm -> model.norm, output -> lm_head. llama.cpp's converter
// permutes the rows of attn_q and attn_k for its interleaved RoPE: within each head, HF row i * hd/2 + j
// (half i of the half-split rotation, pair j) is stored as row 2 j + i. Loading undoes it, so the
// weights are those of transformers' LlamaForCausalLM and the half-split RoPE of layers.hpp applies.
#pragma once

#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "datasets/corpus.hpp"
#include "model/gguf.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace memtrade::model {

struct Pretrained {
  std::string name;                 // general.name
  std::filesystem::path path;
  Config cfg;
  std::vector<float> params;        // param_layout(cfg) order, dequantized to fp32
  std::map<std::string, std::string> stored_type;  // HF tensor name -> its ggml type in the file
  Tokenizer tokenizer;
};

// Throws Error naming the file and the problem (another architecture, a missing key or tensor, a shape
// that does not match the configuration, a non-finite weight).
Config config_from_gguf(const gguf::File& f);
Pretrained load_gguf_model(const std::filesystem::path& path);

// Inverse of llama.cpp's Q/K row permutation for `heads` heads of `head_dim` rows of `cols` columns.
std::vector<float> unpermute_rope_rows(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t cols);

// Where memtrade keeps downloaded model files: $MEMTRADE_MODELS_DIR, else $XDG_CACHE_HOME/memtrade/models,
// else ~/.cache/memtrade/models. scripts/fetch_models.sh fills it.
std::filesystem::path models_dir();
// SmolLM2-135M-Instruct (Q4_1 GGUF) inside models_dir(), and the command that fetches it.
inline constexpr const char* kSmolLM2File = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kFetchModelsCommand = "scripts/fetch_models.sh";
std::filesystem::path smollm2_path();

// SmolLM2 with the fortunes corpus a case names (its corpus_dir and corpus_sha256 keys) tokenized by the
// model's own tokenizer: calibration text is tokens[0, val_start), validation text the last 10%.
struct PretrainedText {
  Pretrained model;
  datasets::Corpus corpus;
  std::vector<int32_t> tokens;
  std::size_t val_start = 0;
  std::span<const int32_t> train() const { return std::span<const int32_t>(tokens).first(val_start); }
  std::span<const int32_t> val() const { return std::span<const int32_t>(tokens).subspan(val_start); }
};
// Throws Skip naming the fetch command when the model file is absent.
PretrainedText load_smollm2_text(const Case& c);

}  // namespace memtrade::model
