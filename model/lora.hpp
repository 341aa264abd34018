// LoRA adapters (Hu et al. 2021) on the model of model.hpp: the base weights are frozen and each adapted
// linear layer y = W x gains a low-rank update, y = W x + (alpha / r) B (A x), with A [r x in] and
// B [out x r]. A starts Kaiming-uniform (PyTorch's nn.Linear default, bound 1 / sqrt(in)), B at zero, so
// the adapted model starts equal to the base. Only the adapters have gradients and optimizer states.
//
// The adapters live in one flat array of their own (AdapterLayout), in the order layer, projection
// (q, k, v, o, gate, up, down), A before B. Their tensor names are PEFT's
// ("base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight"), so save_adapters writes a
// directory a PEFT user loads with PeftModel.from_pretrained (adapter_model.safetensors and
// adapter_config.json).
#pragma once

#include <array>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace memtrade::model {

// The seven linear projections of a layer, in the order of the adapter layout.
enum class Proj { q, k, v, o, gate, up, down };
inline constexpr int kProjCount = 7;
const char* proj_name(Proj p);  // "q_proj", ..., "down_proj" (Hugging Face Llama module names)

// Which projections get adapters: q and v (the LoRA paper's choice), every attention projection, or
// every linear layer of the blocks (QLoRA's recommendation). lm_head and the embedding never do.
enum class LoraTargets { qv, attention, all_linear };
const char* lora_targets_name(LoraTargets t);        // "qv", "attention", "all-linear"
LoraTargets parse_lora_targets(const std::string& s);  // Error naming the accepted names
bool adapted(LoraTargets t, Proj p);

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters (every parameter trains)
  float alpha = 16;  // the update is scaled by alpha / rank
  LoraTargets targets = LoraTargets::qv;
  float scaling() const { return rank > 0 ? alpha / static_cast<float>(rank) : 0.f; }
};

// Shape of projection p of a layer: {out, in}.
std::array<int64_t, 2> proj_shape(const Config& c, Proj p);
// Offset of projection p of layer l in the model's ParamLayout.
int64_t proj_offset(const ParamLayout& L, int64_t l, Proj p);

struct AdapterLayout {
  struct Site {
    int64_t a = -1, b = -1;  // element offsets of A [r x in] and B [out x r]; -1: not adapted
    bool on() const { return a >= 0; }
  };
  std::vector<ParamTensor> tensors;               // PEFT names; every adapter decays under AdamW
  std::vector<std::array<Site, kProjCount>> layer;  // per layer, per Proj
  int64_t total = 0;
};
// Throws Error for rank <= 0, rank > min(in, out) of an adapted projection, or alpha <= 0.
AdapterLayout adapter_layout(const Config& c, const LoraOptions& o);

// A ~ U(-1/sqrt(in), 1/sqrt(in)) from a stream seeded by `seed`, B = 0.
std::vector<float> lora_init(const Config& c, const LoraOptions& o, uint64_t seed);

// W + (alpha / r) B A for every adapted projection, in double, rounded once to fp32; other parameters
// copied. unmerge_adapters subtracts it again (exact only up to that rounding).
std::vector<float> merge_adapters(const Config& c, const LoraOptions& o, std::span<const float> base,
                                  std::span<const float> adapters);
std::vector<float> unmerge_adapters(const Config& c, const LoraOptions& o, std::span<const float> merged,
                                    std::span<const float> adapters);

// Writes dir/adapter_model.safetensors (fp32 tensors under PEFT's names) and dir/adapter_config.json
// (peft_type LORA, r, lora_alpha, target_modules, task_type CAUSAL_LM, base model name).
void save_adapters(const std::filesystem::path& dir, const Config& c, const LoraOptions& o,
                   std::span<const float> adapters, const std::string& base_model = "memtrade");
// Reads a PEFT adapter directory (or an adapter_model.safetensors file beside its adapter_config.json):
// o receives r, lora_alpha and the targets; the values are returned in the adapter layout's order
// (fp32, bf16 or fp16 tensors, converted to fp32). Error naming the file and the problem for a
// missing, extra or mis-shaped tensor, unsupported targets or options (bias, DoRA, rslora), or a
// malformed config.
std::vector<float> load_adapters(const std::filesystem::path& dir, const Config& c, LoraOptions& o);

}  // namespace memtrade::model
