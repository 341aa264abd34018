// The `lora` technique: fine-tuning a pretrained model fully or through LoRA adapters (model/lora.hpp).
// A case pretrains the model in fp32 on the corpus's training split (`pretrain_steps`), then every
// implementation fine-tunes it for `steps` steps on held-out text (TrainBench's fine-tuning mode):
//   full          (reference) every parameter trains, at ft_lr
//   lora-qv-rN    rank-N adapters on q_proj and v_proj (the LoRA paper's choice), at lora_lr
//   lora-all-rN   rank-N adapters on every linear layer of the blocks (QLoRA's recommendation)
//   qlora-all-rN  the same over a frozen base whose projections are NF4 with double quantization
//                 (qlora.hpp), decoded whole before each GEMM that reads them
// with alpha = lora_alpha (the update scaled by alpha / r). The timed and memory-measured call is one
// optimizer step: peak bytes per tag (the frozen base has no gradients, master copy or moments; each
// adapted projection keeps rows x r activations), the trainable parameters, and the validation loss on
// the held-out text after fine-tuning. The error figures compare the step's gradient of what it trains
// with the float64 step's under the same adapters.
//
// Claims: lora-r64 (the fine-tuning task, and the memory model on Llama-2-7B), lora-3x (memory model,
// GPT-3 175B's parameter count), qlora-65b (memory model, LLaMA-65B). The memory model
// (finetune_model.hpp) is first checked against every ok record's tracked bytes, to the byte.
#include <cmath>
#include <cstdio>

#include "harness/claims.hpp"
#include "impls/lora/finetune_model.hpp"
#include "impls/lora/qlora.hpp"
#include "model/train_bench.hpp"

namespace memtrade::lora {

void register_technique(Registry& r);

namespace {

using model::LoraOptions;
using model::LoraTargets;
using model::TrainBench;

struct Variant {
  std::string name;
  Method method;
  LoraOptions lora;
};

// "full", "lora-qv-r16", "lora-all-r64", "qlora-all-r16"; empty name when it is none of these.
Variant parse_variant(const std::string& name, float alpha) {
  if (name == "full") return {name, Method::full, {}};
  int r = 0;
  char where[16] = {};
  const bool q = name.starts_with("qlora-");
  if (std::sscanf(name.c_str() + (q ? 1 : 0), "lora-%15[a-z]-r%d", where, &r) != 2 || r <= 0) return {};
  LoraOptions o;
  o.rank = r;
  o.alpha = alpha;
  const std::string w = where;
  if (w == "qv") o.targets = LoraTargets::qv;
  else if (w == "all") o.targets = LoraTargets::all_linear;
  else return {};
  return {name, q ? Method::qlora : Method::lora, o};
}

model::Config config_of(const Json& m) {
  model::Config c;
  c.vocab = m.at("vocab").get<int64_t>();
  c.dim = m.at("dim").get<int64_t>();
  c.layers = m.at("layers").get<int64_t>();
  c.heads = m.at("heads").get<int64_t>();
  c.kv_heads = m.value("kv_heads", c.heads);
  c.ffn = m.at("ffn").get<int64_t>();
  c.context = m.value("context", int64_t{4096});
  c.tie_embeddings = m.value("tie_embeddings", false);
  return c;
}

// The memory model's figures for a record's case and implementation.
FinetuneMemory model_of(const Record& r) {
  const Variant v = parse_variant(r.impl, static_cast<float>(r.kase.params.value("lora_alpha", 16.0)));
  MT_CHECK(!v.name.empty(), "lora: unknown implementation " + r.impl);
  FinetuneSetup s;
  s.cfg = model::config_from_case(r.kase);
  s.method = v.method;
  s.lora = v.lora;
  s.batch = r.kase.integer("batch", 1);
  s.seq = r.kase.integer("seq", 1);
  const auto policy = precision::parse_policy(r.kase.text("policy", "fp32"));
  s.weight_bytes = static_cast<int64_t>(dtype_size(precision::traits(policy).weights));
  s.master = precision::traits(policy).master_fp32;
  const std::string cp = r.kase.text("checkpoint", "none");
  MT_CHECK(cp == "none" || cp == "full", "lora: the memory model covers checkpointing none and full, not " + cp);
  s.checkpoint = cp == "full";
  return finetune_memory(s);
}

// Every ok CPU record's tracked bytes against the memory model; the first mismatch as an error message.
std::string validate_model(const std::vector<Record>& recs, int& validated) {
  validated = 0;
  for (const Record& r : recs) {
    // The model's activations are the CPU step's (the flash kernels save the log-sum-exp; the CUDA step
    // keeps the attention probabilities instead).
    if (r.technique != "lora" || r.status != "ok" || r.backend != Backend::cpu) continue;
    if (precision::parse_policy(r.kase.text("policy", "fp32")) == precision::Policy::bf16_pure) continue;  // bf16 moments
    const FinetuneMemory m = model_of(r);
    const std::pair<const char*, double> tags[] = {{"weights", m.weights}, {"grads", m.grads}, {"master", m.master},
                                                   {"optimizer", m.optimizer}, {"activations", m.activations}};
    for (const auto& [tag, bytes] : tags)
      if (r.counter(std::string("peak_bytes_") + tag) != bytes)
        return r.name + ": tracked " + tag + fmt(" %.0f B, the memory model says %.0f B", r.counter(std::string("peak_bytes_") + tag), bytes);
    ++validated;
  }
  return "";
}

FinetuneSetup setup_of(const Json& data, Method method, int64_t rank, LoraTargets targets, bool checkpoint) {
  FinetuneSetup s;
  s.cfg = config_of(data.at("model"));
  s.method = method;
  s.lora.rank = rank;
  s.lora.alpha = 16;
  s.lora.targets = targets;
  s.batch = data.value("batch", int64_t{1});
  s.seq = data.value("seq", int64_t{512});
  s.weight_bytes = 2;
  s.master = true;
  s.checkpoint = checkpoint;
  return s;
}

// lora-r64: "LoRA r=64 is close to full fine-tuning and adds about 10% memory". Measured on the fine-tuning
// task: the validation loss of lora-all-r64 over full fine-tuning's (`band`); memory model on the
// configured model (Llama-2-7B, bf16 base, seq/batch as given, checkpointing): what the r=64 all-linear
// adapters add (their state and kept activations) over the same step without them (`memory_band`).
ClaimResult check_lora_r64(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec), memory_band = claim_band(spec, "memory_band");
  int validated = 0;
  if (const std::string bad = validate_model(recs, validated); !bad.empty())
    return {"", "error", "the memory model disagrees with a measured step: " + bad};
  std::string measured;
  std::vector<std::string> verdicts;
  for (const Record& full : recs) {
    if (full.technique != "lora" || full.impl != "full" || full.status != "ok" || !full.counters.count("val_loss")) continue;
    const Record* r64 = same_case(recs, full, "lora-all-r64");
    if (!r64 || !r64->counters.count("val_loss")) continue;
    const double ratio = r64->counter("val_loss") / full.counter("val_loss");
    measured += "policy " + full.kase.text("policy", "fp32") + fmt(": validation loss full %.4f, lora-all-r64 %.4f (x%.4f)", full.counter("val_loss"),
                                   r64->counter("val_loss"), ratio);
    for (const char* other : {"lora-qv-r64", "qlora-all-r16", "qlora-all-r64"})
      if (const Record* o = same_case(recs, full, other); o && o->counters.count("val_loss"))
        measured += std::string(", ") + other + fmt(" %.4f (x%.4f)", o->counter("val_loss"), o->counter("val_loss") / full.counter("val_loss"));
    measured += fmt(", before fine-tuning %.4f; ", full.counter("val_loss_pretrained"));
    verdicts.push_back(decide(ratio, 0, band));
  }
  if (verdicts.empty()) return {"", "out_of_scope", "needs full and lora-all-r64 runs of one case"};
  const FinetuneSetup with = setup_of(spec.data, Method::lora, 64, LoraTargets::all_linear, true);
  const FinetuneMemory m = finetune_memory(with);
  FinetuneSetup none = with;
  none.lora.rank = 0;
  none.method = Method::full;
  // The frozen base and the base's activations: the LoRA step without adapters.
  const double base = m.base_weights + finetune_memory(none).activations;
  const double added = m.total() - base;
  measured += spec.data.at("model").value("name", std::string("model")) +
              fmt(" (memory model): r=64 on all linear layers = %.0fM trainable parameters (%.2f%%), adding %.2f GB", m.trainable * 1e-6,
                  100.0 * static_cast<double>(m.trainable) / static_cast<double>(m.params), added * 1e-9) +
              fmt(" to %.2f GB (+%.1f%%)", base * 1e-9, 100 * added / base);
  verdicts.push_back(decide(added / base, 0, memory_band));
  return {measured, combine_verdicts(verdicts),
          "loss band " + band.str() + " (ratio to full fine-tuning, measured on the fine-tuning task, one run per case); "
          "memory band " + memory_band.str() + " (memory model, bf16 base, fp32 master and moments for the adapters, " +
              std::to_string(with.batch) + " x " + std::to_string(with.seq) + " tokens, full checkpointing), checked "
              "against " + std::to_string(validated) + " measured step(s) to the byte"};
}

// lora-3x: "LoRA cuts trainable parameters 10,000x and GPU memory 3x" (GPT-3 175B with Adam). Memory
// model on a Llama-shaped configuration with GPT-3 175B's parameter count: trainable parameters of full
// fine-tuning over LoRA r=4 on q,v (`band`), and the step's memory (bf16 mixed precision, the data's
// batch and seq) full over LoRA (`memory_band`).
ClaimResult check_lora_3x(const ClaimSpec& spec, const std::vector<Record>&) {
  const Band band = claim_band(spec), memory_band = claim_band(spec, "memory_band");
  const int64_t r = spec.data.value("rank", int64_t{4});
  const FinetuneMemory full = finetune_memory(setup_of(spec.data, Method::full, 0, LoraTargets::qv, false));
  const FinetuneMemory lo = finetune_memory(setup_of(spec.data, Method::lora, r, LoraTargets::qv, false));
  const double params_ratio = static_cast<double>(full.trainable) / static_cast<double>(lo.trainable);
  const double mem_ratio = full.total() / lo.total();
  const double state_ratio = (full.total() - full.activations) / (lo.total() - lo.activations);
  const std::string name = spec.data.at("model").value("name", std::string("model"));
  return {name + fmt(" (memory model, %.1fB parameters): trainable %.0fx fewer (%.1fM adapters at r=", full.params * 1e-9,
                     params_ratio, lo.trainable * 1e-6) +
              std::to_string(r) + fmt(" on q,v); step memory %.0f GB -> %.0f GB (x%.2f", full.total() * 1e-9, lo.total() * 1e-9, mem_ratio) +
              fmt("; model state alone x%.2f)", state_ratio),
          combine_verdicts({decide(params_ratio, 0, band), decide(mem_ratio, 0, memory_band)}),
          "memory model, not a measurement; mixed precision AdamW (16-bit weights and gradients, fp32 master and "
          "moments: 16 B per trained parameter) against a frozen 16-bit base; the source's 1.2 TB -> 350 GB implies "
          "about 7 B per parameter for full fine-tuning; trainable band " + band.str() + ", memory band " + memory_band.str()};
}

// qlora-65b: "QLoRA fine-tunes 65B on one 24 GB GPU". Memory model on LLaMA-65B: QLoRA r=64 on every
// linear layer (NF4-DQ base), full checkpointing, the data's batch and seq: the step's memory in GB
// against `band`; the paper's 48 GB beside it, and 16-bit full fine-tuning's figure.
ClaimResult check_qlora_65b(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  int validated = 0;
  if (const std::string bad = validate_model(recs, validated); !bad.empty())
    return {"", "error", "the memory model disagrees with a measured step: " + bad};
  const FinetuneMemory q = finetune_memory(setup_of(spec.data, Method::qlora, 64, LoraTargets::all_linear, true));
  const FinetuneMemory full = finetune_memory(setup_of(spec.data, Method::full, 0, LoraTargets::qv, true));
  const double gb = q.total() * 1e-9;
  const std::string name = spec.data.at("model").value("name", std::string("model"));
  std::string also;
  for (const Json& m : spec.data.value("also", Json::array())) {
    Json d = spec.data;
    d["model"] = m;
    const double other = finetune_memory(setup_of(d, Method::qlora, 64, LoraTargets::all_linear, true)).total() * 1e-9;
    also += "; " + m.value("name", std::string("model")) + fmt(" %.1f GB (fits 24 GB: ", other) + (other <= 24 ? "yes)" : "no)");
  }
  return {name + fmt(" QLoRA r=64 (memory model): %.1f GB = NF4-DQ base %.1f GB + adapters' state %.2f GB", gb,
                     q.base_weights * 1e-9, (q.total() - q.base_weights - q.activations) * 1e-9) +
              fmt(" + activations %.2f GB; 16-bit full fine-tuning with AdamW: %.0f GB", q.activations * 1e-9, full.total() * 1e-9) +
              "; fits 48 GB (the paper): " + (gb <= 48 ? "yes" : "no") +
              "; fits 24 GB (the seed): " + (gb <= 24 ? "yes" : "no") + also,
          decide(gb, 0, band),
          "memory model, not a measurement (memtrade has no 65B run); band " + band.str() + " GB; bf16 adapters with fp32 "
          "master and moments, " + std::to_string(spec.data.value("batch", int64_t{1})) + " x " +
              std::to_string(spec.data.value("seq", int64_t{512})) + " tokens, full checkpointing; excludes workspace and the "
              "CUDA context; the model is checked against " + std::to_string(validated) + " measured step(s) to the byte"};
}

}  // namespace

void register_technique(Registry& r) {
  Technique t = model::train_bench_technique(
      "lora", "fine-tuning a pretrained model: full, or LoRA adapters on q,v or every linear layer", false, true,
      {num_param("lora_alpha", "LoRA alpha (the update is scaled by alpha / r)", 16.0, 0),
       num_param("lora_lr", "learning rate of the LoRA implementations (0: ft_lr, else lr)", 0.0, 0)});
  std::vector<model::BenchImpl> impls;
  impls.push_back({"full", Role::reference, "full fine-tuning (every parameter trains)", [](const TrainBench&, model::TrainOptions&) {}});
  const auto nf4 = quantized_base("nf4-dq");
  for (const std::string name :
       {"lora-qv-r4", "lora-qv-r16", "lora-qv-r64", "lora-all-r16", "lora-all-r64", "qlora-all-r16", "qlora-all-r64"}) {
    const bool q = name.starts_with("qlora");
    impls.push_back({name, Role::optimized,
                     std::string(q ? "QLoRA (NF4-DQ base) " : "LoRA ") + (name.find("qv") != std::string::npos ? "on q,v" : "on every linear layer") +
                         ", rank " + name.substr(name.rfind('r') + 1),
                     [name, q, nf4](const TrainBench& b, model::TrainOptions& o) {
                       o.lora = parse_variant(name, static_cast<float>(b.kase.params.value("lora_alpha", 16.0))).lora;
                       if (q) o.base_format = nf4;
                       if (const double lr = b.kase.params.value("lora_lr", 0.0); lr > 0) o.lr = static_cast<float>(lr);
                     }});
  }
  model::add_train_bench_impls(t, impls);
  t.claims["lora-r64"] = check_lora_r64;
  t.claims["lora-3x"] = check_lora_3x;
  t.claims["qlora-65b"] = check_qlora_65b;
  r.add(std::move(t));
}

}  // namespace memtrade::lora
