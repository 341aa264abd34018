// Two techniques of the inference KV cache (kv_cache.hpp):
//
// `kvcache`: the decode-attention kernel over a cache of `batch` requests of `context` tokens each (one
// layer), keys and values N(0, 1) (seeded), stored in `kv_dtype`, one new query per request. The oracle
// is the float64 attention over the same stored (dequantized) records, so the error measures the
// kernel's arithmetic; the storage type's own error is what kvcache_model measures. Implementations:
// contiguous (reference: each request's tokens in one reserved range) and paged (blocks of `block`
// tokens from a pool, appended round-robin across the requests so that their blocks interleave as a
// server's do), and paged-offload (the newest hot_tokens of each request on the device, the older blocks
// in the host pool, staged to the device before every step: the copy's time is in the step's; its bytes
// at PCIe 4 / 5 speeds are given as a model). Time per decode step; bandwidth over the K/V bytes read.
// All three also run on CUDA (decode_attention.cu), the cache in the device pool; paged-offload's host
// pool is pinned and its staging copies run on a second stream, overlapped with the kernel.
//
// `kvcache_model`: SmolLM2-135M (model/gguf_model.hpp) run by the decoder (decoder.hpp), teacher forced
// through the cache token by token on validation windows of the tokenized fortunes corpus, per KV
// storage type: perplexity against the full-sequence fp32 forward's on the same windows, and the exact
// KV bytes per token. Skipped, naming the fetch command, without the model file.
#include <cmath>
#include <mutex>
#include <optional>

#include "datasets/random.hpp"
#include "harness/claims.hpp"
#include "harness/registry.hpp"
#include "harness/stats.hpp"
#include "impls/kvcache/decode_attention.hpp"
#include "impls/kvcache/decoder.hpp"
#include "impls/kvcache/serving.hpp"
#include "model/gguf_model.hpp"
#include "model/train.hpp"

namespace memtrade::kvcache {

void register_technique(Registry& r);

namespace {

// ---- kvcache: the decode kernel ----

struct DecodeProblem final : Problem {
  KvShape shape;
  int64_t batch = 0, context = 0, heads = 0, block = 16, hot_tokens = 256, copy_chunks = 8;
  std::vector<float> k, v, q;  // k, v: [batch][context][kv_heads][hd]; q: [batch][heads][hd]
  std::vector<double> oracle;  // [batch][heads][hd]
};

// Fills a cache with the problem's tokens, appending round-robin across requests a block's worth at a time;
// the entries are encoded on the host and copied to the cache's device (KvCache::write_tokens: a copy per
// block, the KIVI types' residual slots one more; a memcpy on the CPU) right after their appends, before an
// offloading cache moves their block to the host.
std::vector<int64_t> fill(KvCache& c, const DecodeProblem& p) {
  std::vector<int64_t> reqs;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t r = c.add(p.context);
    if (r < 0) throw OutOfMemory("device", "kv", static_cast<std::size_t>(p.context * p.shape.token_bytes()), 0, 0);
    reqs.push_back(r);
  }
  const int64_t per = p.shape.kv_heads * p.shape.head_dim;
  for (int64_t t = 0; t < p.context; t += p.block)
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t n = std::min(p.block, p.context - t);
      for (int64_t i = 0; i < n; ++i) MT_CHECK(c.append(reqs[b]), "kvcache: the cache refused a token it was sized for");
      const int64_t off = (b * p.context + t) * per;
      c.write_tokens(reqs[b], 0, t, n, &p.k[off], &p.v[off]);
    }
  return reqs;
}

std::unique_ptr<Problem> prepare_decode(const Case& c) {
  auto p = std::make_unique<DecodeProblem>();
  p->batch = c.integer("batch");
  p->context = c.integer("context");
  p->heads = c.integer("heads");
  p->block = c.integer("block", 16);
  p->hot_tokens = c.integer("hot_tokens", 256);
  p->copy_chunks = c.integer("copy_chunks", 8);
  p->shape = KvShape{1, c.integer("kv_heads"), c.integer("head_dim"), parse_kv_type(c.text("kv_dtype"))};
  MT_CHECK(p->heads % p->shape.kv_heads == 0 && p->shape.head_dim <= 256,
           "case " + c.id + ": heads must be a multiple of kv_heads, head_dim at most 256");
  const uint64_t seed = static_cast<uint64_t>(c.integer("seed", 1));
  const int64_t n = p->batch * p->context * p->shape.kv_heads * p->shape.head_dim;
  p->k.resize(n);
  p->v.resize(n);
  // Counter-based draws: the same values on any number of threads (32K tokens x batch 8: 268M of them).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    p->k[i] = static_cast<float>(datasets::normal(seed, 2 * i));
    p->v[i] = static_cast<float>(datasets::normal(seed, 2 * i + 1));
  }
  p->q.resize(p->batch * p->heads * p->shape.head_dim);
  for (std::size_t i = 0; i < p->q.size(); ++i) p->q[i] = static_cast<float>(datasets::normal(seed + 1, i));
  auto dev = make_cpu_device();
  ContiguousCache cache(*dev, p->shape);
  const auto reqs = fill(cache, *p);
  const int64_t per = p->heads * p->shape.head_dim;
  p->oracle.resize(p->batch * per);
  for (int64_t b = 0; b < p->batch; ++b)
    decode_attention_ref(cache, reqs[b], 0, &p->q[b * per], p->heads, &p->oracle[b * per]);
  return p;
}

// paged-offload's cache for `requests` requests of `tokens` tokens: each keeps its newest hot_tokens
// (rounded up to blocks) in the device pool and moves older blocks to the host pool as it grows.
std::unique_ptr<PagedCache> offload_cache(Device& dev, const KvShape& s, int64_t block, int64_t hot_tokens,
                                          int64_t requests, int64_t tokens) {
  const int64_t blocks = (tokens + block - 1) / block, hot = (hot_tokens + block - 1) / block;
  auto c = std::make_unique<PagedCache>(dev, s, block, requests * std::min(hot, blocks));
  c->enable_offload(requests * std::max<int64_t>(1, blocks - hot), hot);
  return c;
}

class DecodeWorkload final : public Workload {
 public:
  DecodeWorkload(const DecodeProblem& p, bool paged, Device& dev, bool offload = false) : p_(p), dev_(dev) {
    const bool cuda = dev.backend() == Backend::cuda;
    if (offload) {
      auto c = offload_cache(dev, p.shape, p.block, p.hot_tokens, p.batch, p.context);
      offload_ = c.get();
      cache_ = std::move(c);
    } else if (paged) {
      cache_ = std::make_unique<PagedCache>(dev, p.shape, p.block, p.batch * ((p.context + p.block - 1) / p.block));
    } else {
      cache_ = std::make_unique<ContiguousCache>(dev, p.shape);
    }
    reqs_ = fill(*cache_, p);
    out_ = Buffer(dev.memory(), p.oracle.size() * sizeof(float), Tag::io);
    if (cuda) {  // the queries on the device, and the block table uploaded once (the cache does not change)
      q_ = Buffer(dev.memory(), p.q.size() * sizeof(float), Tag::io);
      dev.copy(q_.data(), p.q.data(), p.q.size() * sizeof(float), CopyKind::host_to_device);
      if (offload_) offload_->select_staged(reqs_, 0);  // the plan reads the cold blocks in their staging slots
      cuda_ = std::make_unique<CudaDecode>(dev, plan_decode(*cache_, reqs_, 0, p.heads));
    }
  }
  void run() override {
    if (offload_) offload_->reset_traffic();
    if (cuda_ && offload_)  // the staging copies on a second stream, each chunk's splits launched once it is in
      return cuda_->run_staged(q_.as<float>(), out_.as<float>(), offload_->staging_slots(), p_.copy_chunks,
                               [this](int64_t from, int64_t to) { offload_->copy_staged(from, to, true); });
    if (cuda_) return cuda_->run(q_.as<float>(), out_.as<float>());
    cache_->stage(reqs_, 0);
    decode_attention(*cache_, reqs_, 0, p_.q.data(), p_.heads, out_.as<float>());
  }
  ErrorStats error() override {
    std::vector<float> o(p_.oracle.size());
    dev_.copy(o.data(), out_.data(), o.size() * sizeof(float), CopyKind::device_to_host);
    return error_stats(std::vector<double>(o.begin(), o.end()), p_.oracle);
  }
  Work work() const override {
    Work w;
    w.bytes = bytes_read();
    w.flops = 4.0 * static_cast<double>(p_.batch * p_.heads * p_.context * p_.shape.head_dim);
    // Every type's kernel multiplies and adds in fp32 (records decoded in registers), so the fp32 GEMM
    // rate is its arithmetic ceiling, as the copy bandwidth is its memory ceiling: frac_of_gemm_ceiling
    // beside frac_of_copy_ceiling says which of the two a case is near.
    w.gemm_dtype = "fp32";
    w.read_stream = true;  // every K and V record once, in order
    // A decode step finds its KV records in DRAM: between two steps of a request the other layers' records
    // and the weights pass through the cache. Unflushed, a quick case's 32-128 MiB stayed in a large L3
    // and its bandwidth fractions passed the memory ceilings.
    w.cold_cache = true;
    w.items = static_cast<double>(p_.batch);
    w.item_unit = "tokens";
    return w;
  }
  void add_counters(std::map<std::string, double>& c) override {
    c["kv_bytes_per_token"] = static_cast<double>(p_.shape.token_bytes());
    c["kv_bytes_read"] = bytes_read();
    c["kv_reserved_bytes"] = static_cast<double>(cache_->reserved_bytes());
    const double host = offload_ ? static_cast<double>(offload_->host_reserved_bytes()) : 0.0;
    c["kv_utilization"] = static_cast<double>(cache_->used_bytes()) / (static_cast<double>(cache_->reserved_bytes()) + host);
    if (offload_) {
      const double moved = static_cast<double>(offload_->traffic().to_device);  // one step's staging copies
      c["kv_host_bytes"] = host;
      c["kv_staging_bytes"] = static_cast<double>(offload_->staging_bytes());
      c["kv_to_device_bytes_per_step"] = moved;
      add_modelled_link_time(c, moved);
    }
  }

 private:
  // What one step reads from the cache: every request's records, and for the KIVI types the fp16 residual of
  // the tokens after the last complete group (decode_bytes_read).
  double bytes_read() const {
    int64_t n = 0;
    for (const int64_t r : reqs_) n += decode_bytes_read(*cache_, r);
    return static_cast<double>(n);
  }

  const DecodeProblem& p_;
  Device& dev_;
  std::unique_ptr<KvCache> cache_;
  PagedCache* offload_ = nullptr;  // cache_, when it offloads
  std::vector<int64_t> reqs_;
  Buffer out_, q_;                     // q_: CUDA only
  std::unique_ptr<CudaDecode> cuda_;  // the CUDA kernel's plan (CUDA only)
};

// ---- kvcache_model: perplexity through the cache ----

// SmolLM2 and its tokenized corpus, once per process.
std::shared_ptr<const model::PretrainedText> smollm2(const Case& c) {
  static std::mutex mu;
  static std::shared_ptr<const model::PretrainedText> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (!cached) cached = std::make_shared<const model::PretrainedText>(model::load_smollm2_text(c));
  return cached;
}

struct QualityProblem final : Problem {
  std::shared_ptr<const model::PretrainedText> data;
  KvShape shape;
  std::optional<quant::Spec> weights;  // projections' format (none: fp32)
  bool int8_activations = false;       // batch-1 matvecs through packed-a8
  datasets::Batch windows;            // batch x seq validation tokens
  std::vector<double> full_losses;    // per (row, position), from the full-sequence fp32 forward
  int64_t block = 16, hot_tokens = 256, host_layers = 0;
};

std::unique_ptr<Problem> prepare_quality(const Case& c) {
  auto p = std::make_unique<QualityProblem>();
  p->data = smollm2(c);
  const model::Config& cfg = p->data->model.cfg;
  p->shape = KvShape{cfg.layers, cfg.kv_heads, cfg.head_dim(), parse_kv_type(c.text("kv_dtype"))};
  p->shape.residual = c.integer("residual", kKiviGroup);
  p->shape.validate();  // residual: a multiple of 32, and only for the KIVI types
  p->block = c.integer("block", 16);
  p->hot_tokens = c.integer("hot_tokens", 256);
  p->host_layers = c.integer("host_layers", 0);
  MT_CHECK(p->host_layers <= cfg.layers, "kvcache_model: host_layers " + std::to_string(p->host_layers) +
                                             " is more than the model's " + std::to_string(cfg.layers) + " layers");
  if (const std::string w = c.text("weights", "fp32"); w != "fp32") p->weights = quant::parse_spec(w);
  p->int8_activations = c.text("activations", "fp32") == "int8";
  const int64_t batch = c.integer("batch", 4), seq = c.integer("seq", 128);
  p->windows = datasets::sample_batch(p->data->val(), batch, seq,
                                      static_cast<uint64_t>(c.integer("seed", 1)) + 1000, 0);
  const KvType t = p->shape.type;
  if (t == KvType::fp8_e4m3_static || t == KvType::int4_smooth) {  // calibrated on windows of the training tokens
    const datasets::Batch calib = datasets::sample_batch(p->data->train(), c.integer("kv_calib_windows", 8), seq,
                                                         static_cast<uint64_t>(c.integer("seed", 1)) + 2000, 0);
    if (t == KvType::fp8_e4m3_static)
      p->shape.static_scales = calibrate_kv_scales(cfg, p->data->model.params, p->weights, calib);
    else
      p->shape.key_smoothing = calibrate_key_smoothing(cfg, p->data->model.params, p->weights, calib);
  }
  // The reference losses: the full-sequence forward (model/train_core.hpp) in fp32, one row at a time.
  auto dev = make_cpu_device();
  model::TrainOptions o;
  o.batch = 1;
  o.seq = seq;
  o.inference_only = true;
  auto tr = model::make_trainer_cpu(cfg, o, *dev, p->data->model.params);
  for (int64_t b = 0; b < batch; ++b) {
    datasets::Batch row{{p->windows.inputs.begin() + b * seq, p->windows.inputs.begin() + (b + 1) * seq},
                        {p->windows.targets.begin() + b * seq, p->windows.targets.begin() + (b + 1) * seq}, 1, seq};
    const std::vector<float> z = tr->logits(row);
    const int64_t V = cfg.vocab;
    for (int64_t t = 0; t < seq; ++t) p->full_losses.push_back(token_loss(&z[t * V], V, row.targets[t]));
  }
  return p;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

class QualityWorkload final : public Workload {
 public:
  // host_layers > 0: weight offload (the decoder's first host_layers layers in the host pool).
  QualityWorkload(const QualityProblem& p, bool paged, Device& dev, bool offload = false, int64_t host_layers = 0)
      : p_(p) {
    if (dev.backend() != Backend::cpu) throw Skip("the decoder runs on the CPU");
    const int64_t B = p.windows.batch, T = p.windows.context, blocks = (T + p.block - 1) / p.block;
    if (offload) {
      auto c = offload_cache(dev, p.shape, p.block, p.hot_tokens, B, T);
      offload_ = c.get();
      cache_ = std::move(c);
    } else if (paged) {
      cache_ = std::make_unique<PagedCache>(dev, p.shape, p.block, B * blocks);
    } else {
      cache_ = std::make_unique<ContiguousCache>(dev, p.shape);
    }
    decoder_ = std::make_unique<Decoder>(dev, p.data->model.cfg, p.data->model.params, *cache_, p.weights, host_layers);
    decoder_->set_int8_activations(p.int8_activations);
  }
  void run() override {
    if (offload_) offload_->reset_traffic();
    decoder_->reset_weight_traffic();
    losses_ = teacher_forced_losses(*decoder_, *cache_, p_.windows);
  }
  // The per-token losses against the full-sequence fp32 forward's (not a float64 oracle: a float64
  // forward of the 135M model is out of reach here); perplexities are counters.
  ErrorStats error() override { return error_stats(losses_, p_.full_losses); }
  Work work() const override {
    Work w;
    w.items = static_cast<double>(p_.windows.batch * p_.windows.context);
    w.item_unit = "tokens";
    return w;
  }
  void add_counters(std::map<std::string, double>& c) override {
    const double full = mean_of(p_.full_losses), got = mean_of(losses_);
    c["perplexity"] = std::exp(got);
    c["perplexity_full_fp32"] = std::exp(full);
    c["perplexity_rel_delta"] = std::exp(got - full) - 1;
    // Paired over the windows: the standard error of the mean per-window loss difference.
    const int64_t B = p_.windows.batch, T = p_.windows.context;
    std::vector<double> d(B);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) d[b] += (losses_[b * T + t] - p_.full_losses[b * T + t]) / static_cast<double>(T);
    }
    if (B >= 2) {
      const double m = mean_of(d);
      double ss = 0;
      for (double x : d) ss += (x - m) * (x - m);
      c["perplexity_rel_delta_se"] = std::exp(got - full) * std::sqrt(ss / static_cast<double>(B - 1) / static_cast<double>(B));
    }
    c["kv_bytes_per_token"] = static_cast<double>(p_.shape.token_bytes());
    c["weight_bytes_read"] = decoder_->weight_bytes_read();
    // The model's memory at 2K and 8K tokens of one sequence: weights as stored plus the KV cache, exact.
    for (const auto& [key, tokens] : {std::pair{"memory_at_2k_tokens", 2048}, std::pair{"memory_at_8k_tokens", 8192}})
      c[key] = decoder_->weight_bytes_stored() + static_cast<double>(tokens * p_.shape.token_bytes() + p_.shape.residual_bytes());
    if (p_.shape.kivi()) c["kv_residual_bytes"] = static_cast<double>(p_.shape.residual_bytes());
    KvShape bf16 = p_.shape;
    bf16.type = KvType::bf16;
    c["kv_bytes_per_token_bf16"] = static_cast<double>(bf16.token_bytes());
    if (offload_) {  // one run: every decode step stages each layer's cold blocks
      const double moved = static_cast<double>(offload_->traffic().to_device);
      c["kv_to_device_bytes"] = moved;
      c["kv_to_host_bytes"] = static_cast<double>(offload_->traffic().to_host);
      add_modelled_link_time(c, moved);
    }
    if (decoder_->weight_host_bytes() > 0) {  // one run: every decode step stages each offloaded layer
      const double moved = static_cast<double>(decoder_->weight_bytes_to_device());
      c["weight_host_bytes"] = static_cast<double>(decoder_->weight_host_bytes());
      c["weight_staging_bytes"] = static_cast<double>(decoder_->weight_staging_bytes());
      c["weight_to_device_bytes"] = moved;
      add_modelled_link_time(c, moved);
    }
  }
  std::string detail() override {
    return p_.data->model.name + "; corpus " + p_.data->corpus.source + " sha256 " + p_.data->corpus.sha256 +
           "; validation windows from token " + std::to_string(p_.data->val_start);
  }

 private:
  const QualityProblem& p_;
  std::unique_ptr<KvCache> cache_;
  PagedCache* offload_ = nullptr;  // cache_, when it offloads
  std::unique_ptr<Decoder> decoder_;
  std::vector<double> losses_;
};

// kv-fp8: "FP8/INT8 KV halves KV memory with negligible loss": per 8-bit type (vLLM's int8, scaled and
// unscaled fp8, llama.cpp's q8_0), the perplexity change against the fp32 cache's (band from the suite)
// and the bytes per token against bf16's.
ClaimResult check_kv_fp8(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  auto find = [&](const std::string& dt) -> const Record* {
    for (const auto& r : recs)
      if (r.technique == "kvcache_model" && r.impl == "paged" && r.status == "ok" && r.kase.params.value("kv_dtype", "") == dt &&
          r.kase.params.value("weights", std::string("fp32")) == "fp32")
        return &r;
    return nullptr;
  };
  const Record* base = find("fp32");
  if (!base) return {"", "out_of_scope", "needs the fp32 kvcache_model case"};
  std::string measured;
  std::vector<std::string> verdicts;
  char buf[256];
  for (const char* dt : {"int8", "fp8-e4m3", "fp8-e4m3-static", "fp8-e5m2", "q8_0"}) {
    const Record* r = find(dt);
    if (!r) continue;
    const double v = std::exp(std::log(r->counter("perplexity")) - std::log(base->counter("perplexity"))) - 1;
    const double u = 2 * r->counter("perplexity_rel_delta_se", NAN);
    const double bytes = r->counter("kv_bytes_per_token") / r->counter("kv_bytes_per_token_bf16");
    const std::string verdict = decide(v, u, band);
    std::snprintf(buf, sizeof buf, "%s: perplexity %+.3f%% +- %.3f%% vs the fp32 cache, %.4f x bf16's bytes per token (%s); ",
                  dt, 100 * v, 100 * u, bytes, verdict.c_str());
    measured += buf;
    verdicts.push_back(verdict);
  }
  if (verdicts.empty())
    return {"", "out_of_scope", "needs a kvcache_model case of an 8-bit KV type (int8, fp8-e4m3, fp8-e4m3-static, fp8-e5m2, q8_0)"};
  return {measured, combine_verdicts(verdicts),
          "band " + band.str() +
              " on the perplexity change; int8 and fp8-e4m3: per-token-per-head amax scales computed on write; "
              "fp8-e4m3-static: one scale per (layer, K or V, kv head) calibrated on training windows, none stored; "
              "fp8-e5m2: vLLM's unscaled fp8; q8_0: llama.cpp's int8 KV, an fp16 scale per 32 values; the "
              "uncertainty is the fp32-reference paired standard error of the 8-bit case"};
}

// offload-latency: "offloading KV or weights to the CPU costs 2-5x latency", as the offloaded decode's
// time (KV: paged-offload, weights: weight-offload) over the same case's paged decode. It needs two
// memories and a link between them (CUDA); on the CPU backend the staging copy is a memcpy within one
// memory, so the host-copy ratio and the modelled PCIe ratios ((paged time + staged bytes at 25 / 50
// GB/s) / paged time) are reported, not decided.
ClaimResult check_offload_latency(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  const double noise = spec.data.value("noise", 0.05);
  std::string measured;
  std::vector<std::string> verdicts;
  for (const auto& r : recs) {
    if (r.technique != "kvcache_model" || (r.impl != "paged-offload" && r.impl != "weight-offload") || r.status != "ok")
      continue;
    const Record* p = same_case(recs, r, "paged");
    if (!p || p->status != "ok") continue;
    const double t = stats::median(p->times_s);
    const auto [ratio, u] = time_ratio(r, *p, noise);
    measured += std::string(backend_name(r.backend)) + " " + r.kase.id + "/" + r.impl + fmt(": offload/paged x%.2f +- %.2f", ratio, u) +
                fmt(" (modelled with PCIe 4 copies x%.2f, PCIe 5 x%.2f); ", (t + r.counter("offload_modelled_pcie4_s")) / t,
                    (t + r.counter("offload_modelled_pcie5_s")) / t);
    if (r.backend == Backend::cuda) verdicts.push_back(decide(ratio, u, band));
  }
  if (verdicts.empty())
    return {measured, "out_of_scope",
            "needs a GPU: on the CPU backend the device and the host are one memory, so the staging copy crosses no link "
            "(the modelled ratios assume the copies are not overlapped with compute)"};
  return {measured, combine_verdicts(verdicts), "CUDA cases; band " + band.str()};
}

// ---- kvcache_serving: the allocators under a request stream ----

struct ServingProblem final : Problem {
  TraceSpec trace;
  int64_t budget_tokens = 0, block = 16;
  // A budget in bytes: the model's KV shape, storage type and (the KIVI types) R; layers = 0 for a budget in tokens.
  KvShape shape;
};

// The case's trace, block, budget in tokens and (a budget in bytes) the model's KV shape; Error naming the
// case for a budget given both ways or neither, or one that does not hold max_len and a block.
void read_serving_case(const Case& c, ServingProblem& p) {
  p.trace = trace_spec(c.text("trace"));
  p.trace.requests = c.integer("requests", 200);
  p.trace.max_len = c.integer("max_len", 2048);
  p.trace.seed = static_cast<uint64_t>(c.integer("seed", 1));
  p.block = c.integer("block", 16);
  const int64_t residual = c.integer("residual", kKiviGroup);
  const int64_t tokens = c.integer("budget_tokens", 0), mib = c.integer("budget_mib", 0);
  MT_CHECK((tokens > 0) != (mib > 0), "case " + c.id + ": give the KV budget as budget_tokens or as budget_mib (one of them)");
  if (mib > 0) {
    p.shape = KvShape{c.integer("layers", 32), c.integer("kv_heads", 32), c.integer("head_dim", 128),
                      parse_kv_type(c.text("kv_dtype", "fp16"))};
    p.shape.residual = residual;  // validated with the shape: a multiple of 32, and only for the KIVI types
    p.budget_tokens = budget_tokens_of(p.shape, mib << 20, p.block, p.trace.max_len);
  } else {
    MT_CHECK(residual == kKiviGroup, "case " + c.id + ": residual needs a budget in bytes of a KIVI type (budget_mib, kv_dtype)");
    p.budget_tokens = tokens / p.block * p.block;
    MT_CHECK(p.budget_tokens >= p.trace.max_len + p.block,
             "case " + c.id + ": budget_tokens must hold at least max_len + one block");
  }
}

std::unique_ptr<Problem> prepare_serving(const Case& c) {
  auto p = std::make_unique<ServingProblem>();
  read_serving_case(c, *p);
  return p;
}

class ServingWorkload final : public Workload {
 public:
  ServingWorkload(const ServingProblem& p, bool paged, Device& dev) : p_(p), paged_(paged), dev_(dev) {
    if (dev.backend() != Backend::cpu) throw Skip("the serving simulation runs on the CPU");
  }
  void run() override {
    const KvShape shape{1, 1, 2, KvType::f32};  // 16 bytes per token: the figures are ratios of tokens
    std::unique_ptr<KvCache> cache;
    if (paged_) cache = std::make_unique<PagedCache>(dev_, shape, p_.block, p_.budget_tokens / p_.block);
    else cache = std::make_unique<ContiguousCache>(dev_, shape, p_.budget_tokens);
    s_ = simulate(*cache, paged_, p_.trace, p_.budget_tokens, residual_model(p_.shape));
  }
  // No numeric output against an oracle: a run that did not finish every request counts as non-finite.
  ErrorStats error() override {
    ErrorStats e;
    e.n = 1;
    if (s_.finished != p_.trace.requests) e.nan_count = 1;
    return e;
  }
  Work work() const override {
    Work w;
    w.items = static_cast<double>(s_.decode_tokens);
    w.item_unit = "simulated_tokens";
    return w;
  }
  void add_counters(std::map<std::string, double>& c) override {
    c["kv_utilization"] = s_.utilization;
    c["kv_budget_utilization"] = s_.budget_utilization;
    c["kv_internal_frag"] = s_.internal_frag;
    c["kv_external_frag"] = s_.external_frag;
    c["mean_concurrency"] = s_.concurrency;
    c["max_concurrency"] = static_cast<double>(s_.max_concurrency);
    c["preemptions"] = static_cast<double>(s_.preemptions);
    c["decode_steps"] = static_cast<double>(s_.steps);
    c["decode_tokens_per_step"] = static_cast<double>(s_.decode_tokens) / static_cast<double>(std::max<int64_t>(s_.steps, 1));
    c["kv_budget_tokens"] = static_cast<double>(p_.budget_tokens);
    if (p_.shape.layers > 0) c["kv_bytes_per_token"] = static_cast<double>(p_.shape.token_bytes());
    if (p_.shape.kivi()) c["kv_residual_tokens"] = static_cast<double>(residual_model(p_.shape).tokens);
  }

 private:
  const ServingProblem& p_;
  bool paged_;
  Device& dev_;
  ServingStats s_;
};

// paged: "PagedAttention raises memory utilization by over 90%": the paged cache's utilization per trace
// against the band (vLLM: under 4% waste), beside the contiguous cache's (the paper: 20.4-38.2%).
ClaimResult check_paged(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  std::string measured;
  std::vector<std::string> verdicts;
  char buf[384];
  for (const auto& r : recs) {
    if (r.technique != "kvcache_serving" || r.impl != "paged" || r.status != "ok") continue;
    const Record* c = nullptr;
    for (const auto& x : recs)
      if (x.technique == r.technique && x.impl == "contiguous" && x.status == "ok" && x.kase.id == r.kase.id) c = &x;
    const double u = r.counter("kv_utilization", NAN);
    // A per-request residual (the KIVI types) is reserved by the storage type, not wasted by the allocator:
    // listed, not judged.
    const bool residual = r.counter("kv_residual_tokens", 0) > 0;
    const std::string verdict = residual ? "not judged: the type's per-request residual is reserved by design" : decide(u, 0, band);
    // A budget in bytes: the storage type and the budget name the case.
    const std::string typed = r.kase.params.contains("budget_mib")
                                  ? " " + r.kase.params.value("kv_dtype", std::string("fp16")) + " in " +
                                        std::to_string(r.kase.params.value("budget_mib", int64_t{0})) + " MiB"
                                  : "";
    std::snprintf(buf, sizeof buf, "%s%s block %lld: paged %.1f%% (%.2f decode tokens/step), contiguous %.1f%% (%.2f) (%s); ",
                  r.kase.params.value("trace", std::string("?")).c_str(), typed.c_str(),
                  static_cast<long long>(r.kase.params.value("block", int64_t{16})), 100 * u,
                  r.counter("decode_tokens_per_step"), c ? 100 * c->counter("kv_utilization", NAN) : NAN,
                  c ? c->counter("decode_tokens_per_step") : NAN, verdict.c_str());
    measured += buf;
    if (!residual) verdicts.push_back(verdict);
  }
  if (verdicts.empty()) return {measured, "out_of_scope", "needs paged kvcache_serving cases of a type without a residual"};
  return {measured, combine_verdicts(verdicts),
          "utilization = bytes of the running requests' tokens / bytes reserved for them, averaged over decode steps "
          "(exact counts: no uncertainty); the contiguous cache reserves max_len tokens per request; band " + band.str()};
}

// kv-70: "at 32K+ tokens the KV cache is over 70% of memory", answered by the memory model: per model
// configuration of the claim's data, KV bytes = tokens x batch x 2 x layers x kv_heads x head_dim x 2
// (fp16) against weights of params x 2 bytes, share = KV / (KV + weights). The per-token formula is
// first checked against the run: every kvcache record's tracked KV bytes (the contiguous cache's peak of
// tag kv) must equal batch x (context x the formula's bytes + the KIVI types' per-request fp16 residual),
// else the check is an error.
ClaimResult check_kv70(const ClaimSpec& spec, const std::vector<Record>& recs) {
  const Band band = claim_band(spec);
  int checked = 0;
  for (const auto& r : recs) {
    if (r.technique != "kvcache" || r.impl != "contiguous" || r.status != "ok") continue;
    const Json& p = r.kase.params;
    const KvShape s{1, p.value("kv_heads", int64_t{0}), p.value("head_dim", int64_t{0}),
                    parse_kv_type(p.value("kv_dtype", std::string("fp32")))};
    const double formula =
        static_cast<double>(p.value("batch", int64_t{0}) * (p.value("context", int64_t{0}) * s.token_bytes() + s.residual_bytes()));
    if (r.counter("peak_bytes_kv", -1) != formula)
      return {"", "error", "the KV formula (" + std::to_string(formula) + " bytes) differs from the tracked bytes of " + r.name};
    ++checked;
  }
  if (!checked) return {"", "out_of_scope", "needs a contiguous kvcache case to check the per-token formula against"};
  const int64_t tokens = spec.data.value("tokens", int64_t{32768});
  std::string measured;
  std::vector<std::string> verdicts;
  char buf[320];
  for (const Json& m : spec.data.at("models")) {
    const double per_token = fp16_kv_bytes_per_token(m);
    const double weights = 2.0 * m.at("params").get<double>();
    auto share = [&](double t, double b) { return t * b * per_token / (t * b * per_token + weights); };
    const double at70 = 0.7 / 0.3 * weights / per_token;  // tokens (batch 1) where the share reaches 70%
    const std::string verdict = decide(share(static_cast<double>(tokens), 1), 0, band);
    std::snprintf(buf, sizeof buf, "%s: %.0f%% at %lldK tokens (batch 8: %.0f%%; 128K: %.0f%%), 70%% at %.0fK tokens (%s); ",
                  m.at("name").get<std::string>().c_str(), 100 * share(static_cast<double>(tokens), 1),
                  static_cast<long long>(tokens / 1024), 100 * share(static_cast<double>(tokens), 8),
                  100 * share(131072, 1), at70 / 1024, verdict.c_str());
    measured += buf;
    verdicts.push_back(verdict);
  }
  return {measured, combine_verdicts(verdicts),
          "memory model: fp16 weights and fp16 KV only (no activations, no framework overhead), batch 1 unless noted; "
          "the per-token formula checked against the tracked KV bytes of " + std::to_string(checked) +
              " contiguous cases of this run; band " + band.str()};
}

// Both layouts of one technique: contiguous (the reference) and paged, each the workload W(p, paged, dev),
// on the CPU and, with `cuda`, on CUDA too.
template <class P, class W>
void add_layouts(Technique& t, const char* contiguous, const char* paged, bool cuda = false) {
  for (Backend be : {Backend::cpu, Backend::cuda}) {
    if (be == Backend::cuda && !cuda) break;
    t.impls.push_back(typed_impl<P>(t.name, "contiguous", Role::reference, be, contiguous,
                                    [](const P& p, Device& d) { return std::make_unique<W>(p, false, d); }));
    t.impls.push_back(typed_impl<P>(t.name, "paged", Role::optimized, be, paged,
                                    [](const P& p, Device& d) { return std::make_unique<W>(p, true, d); }));
  }
}

// paged-offload, where a request is longer than the hot window (`length`: the case's tokens per request).
template <class P, class W>
void add_offload(Technique& t, const char* length, const char* description, bool cuda = false) {
  for (Backend be : {Backend::cpu, Backend::cuda}) {
    if (be == Backend::cuda && !cuda) break;
    Impl i = typed_impl<P>(t.name, "paged-offload", Role::optimized, be, description,
                           [](const P& p, Device& d) { return std::make_unique<W>(p, true, d, true); });
    const std::string key = length;
    i.not_applicable = [key](const Case& c) {
      const KvType kv = parse_kv_type(c.text("kv_dtype"));  // (validated before)
      if (is_kivi(kv))
        return std::string(kv_type_name(kv)) + " does not offload (a completing group rewrites records that may be cold)";
      const int64_t block = c.integer("block", 16), hot = (c.integer("hot_tokens", 256) + block - 1) / block * block;
      return c.integer(key) <= hot ? std::string("the sequence fits the hot window (whole blocks): nothing to offload")
                                   : std::string();
    };
    t.impls.push_back(std::move(i));
  }
}

}  // namespace

void register_technique(Registry& r) {
  {
    Technique t;
    t.name = "kvcache";
    t.description = "decode attention over a contiguous or a paged KV cache, per storage type";
    t.schema.params = {
        int_param("batch", "requests decoded together"),
        int_param("context", "cached tokens per request"),
        int_param("heads", "query heads"),
        int_param("kv_heads", "key/value heads (divide heads)"),
        int_param("head_dim", "head dimension", nullptr, 1, 256),
        text_param("kv_dtype",
                   "storage of K and V (fp8-e4m3-static: unit scales; q8_0, q4_0: llama.cpp's; int4-kivi, int2-kivi: "
                   "KIVI's per-channel keys and per-token values in 4 or 2 bits with an fp16 residual)",
                   nullptr, {"fp32", "bf16", "fp16", "int8", "fp8-e4m3", "fp8-e4m3-static", "fp8-e5m2", "int4", "q8_0", "q4_0",
                             "int4-kivi", "int2-kivi"}),
        int_param("block", "tokens per block of the paged cache", 16),
        int_param("seed", "K, V and Q", 1, 0),
        int_param("hot_tokens", "paged-offload: newest tokens per request kept on the device", 256, 1),
        int_param("copy_chunks",
                  "paged-offload on CUDA: the staging copies in this many chunks on a second stream, each chunk's "
                  "splits launched once it is in",
                  8, 1),
    };
    t.schema.metrics = {
        {"kv_bytes_per_token", "bytes", Better::lower, Gate::exact, 0, 0, "K and V of one token at every layer"},
        {"kv_bytes_read", "bytes", Better::none, Gate::report, 0, 0, "cache bytes one decode step reads"},
        {"kv_reserved_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "what the cache holds for the requests (device)"},
        {"kv_utilization", "1", Better::higher, Gate::report, 0, 0, "bytes of the tokens / bytes reserved (device and host)"},
        {"kv_host_bytes", "bytes", Better::none, Gate::exact, 0, 0, "paged-offload: the cold blocks in the host pool"},
        {"kv_staging_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
         "paged-offload: the device staging area (one layer of the host pool)"},
        {"kv_to_device_bytes_per_step", "bytes", Better::lower, Gate::exact, 0, 0,
         "paged-offload: bytes staged to the device per decode step (every cold token of the layer)"},
    };
    for (auto& m : modelled_link_metrics("the bytes staged per step")) t.schema.metrics.push_back(std::move(m));
    // The reference kernel accumulates in fp32: the q.k dot over head_dim terms and the weighted sum of
    // values over context terms, each within gamma_k = k u (u = 2^-24) of exact, plus a few ulps of exp.
    t.error_rule.reference_bound = [](const Case& c, const Problem&) {
      return 2.0 * static_cast<double>(c.integer("head_dim") + c.integer("context") + 8) * std::ldexp(1.0, -24);
    };
    t.validate = [](const Case& c) {
      KvShape{1, c.integer("kv_heads"), c.integer("head_dim"), parse_kv_type(c.text("kv_dtype"))}.validate();
    };
    t.prepare = prepare_decode;
    add_layouts<DecodeProblem, DecodeWorkload>(t, "fp32 online-softmax kernel over per-request reserved ranges",
                                               "the same kernel over block tables of a shared block pool (CUDA: the "
                                               "table uploaded once, as the cache does not change between steps)",
                                               true);
    add_offload<DecodeProblem, DecodeWorkload>(t, "context",
                                               "paged; each request's newest hot_tokens on the device, older blocks in "
                                               "the host pool, staged back to the device every step (on the CPU "
                                               "backend a host copy before the kernel; on CUDA pinned-host-to-device "
                                               "copies on a second stream in copy_chunks chunks, overlapped with the "
                                               "kernel over the splits whose blocks are in)",
                                               true);
    t.claims["kv-70"] = check_kv70;
    r.add(std::move(t));
  }
  {
    Technique t;
    t.name = "kvcache_serving";
    t.description = "a seeded request stream under a KV memory budget: utilization, fragmentation, batch size";
    t.schema.params = {
        text_param("trace", "length distributions: sharegpt (prompts 161, outputs 338 tokens on average) or alpaca (19 / 58)",
                   nullptr, {"sharegpt", "alpaca"}),
        int_param("requests", "requests in the stream", 200),
        int_param("budget_tokens", "KV memory budget in tokens (or budget_mib)", 0, 0),
        int_param("budget_mib", "KV memory budget in MiB of the model's K and V (layers, kv_heads, head_dim) stored as "
                  "kv_dtype: the tokens it holds follow the storage type", 0, 0),
        text_param("kv_dtype", "with budget_mib: storage of K and V (bytes per token, scales included)", "fp16",
                   {"fp32", "bf16", "fp16", "int8", "fp8-e4m3", "fp8-e4m3-static", "fp8-e5m2", "int4", "int4-smooth",
                    "q8_0", "q4_0", "int4-kivi", "int2-kivi"}),
        int_param("layers", "with budget_mib: the model's layers (default Llama-2-7B's)", 32),
        int_param("kv_heads", "with budget_mib: its KV heads", 32),
        int_param("head_dim", "with budget_mib: its head dimension", 128),
        int_param("max_len", "the model's longest sequence (what the contiguous cache reserves)", 2048, 2),
        int_param("residual", "int4-kivi, int2-kivi: KIVI's R, the newest tokens a request keeps in fp16, quantized R at "
                  "a time (a multiple of 32; the simulation counts its bytes, as kvcache_model's cache holds them)", 32, 32),
        int_param("block", "tokens per block of the paged cache", 16),
        int_param("seed", "the stream", 1, 0),
    };
    t.schema.metrics = {
        {"kv_utilization", "1", Better::higher, Gate::ratio, 1.01, 0, "tokens' bytes / reserved bytes, mean over steps"},
        {"kv_budget_utilization", "1", Better::higher, Gate::report, 0, 0, "tokens' bytes / budget"},
        {"kv_internal_frag", "1", Better::lower, Gate::report, 0, 0, "reserved but unused, share of the budget"},
        {"kv_external_frag", "1", Better::lower, Gate::report, 0, 0, "free while requests wait, share of the budget"},
        {"mean_concurrency", "1", Better::higher, Gate::report, 0, 0, "running requests per step"},
        {"max_concurrency", "1", Better::higher, Gate::report, 0, 0, "the largest batch that fit"},
        {"preemptions", "1", Better::lower, Gate::report, 0, 0, "requests evicted and recomputed"},
        {"decode_steps", "1", Better::lower, Gate::report, 0, 0, "steps to serve the stream"},
        {"decode_tokens_per_step", "1", Better::higher, Gate::report, 0, 0, "decode throughput per step"},
        {"kv_budget_tokens", "tokens", Better::higher, Gate::exact, 0, 0, "tokens the KV budget holds"},
        {"kv_bytes_per_token", "bytes", Better::lower, Gate::exact, 0, 0,
         "with budget_mib: K and V of one token at every layer of the model, as stored"},
        {"kv_residual_tokens", "tokens", Better::lower, Gate::exact, 0, 0,
         "int4-kivi, int2-kivi: the budget's tokens each running request holds for its fp16 residual"},
    };
    t.error_rule.judge = [](const Case&, const Problem&, const Impl&, const ErrorStats& e, const ErrorStats&) {
      return Verdict{e.finite(), e.finite() ? "every request finished" : "requests left unfinished"};
    };
    t.validate = [](const Case& c) {
      ServingProblem p;
      read_serving_case(c, p);
    };
    t.prepare = prepare_serving;
    add_layouts<ServingProblem, ServingWorkload>(t, "reserve max_len tokens per request",
                                                 "blocks on demand, preemption by recompute");
    t.claims["paged"] = check_paged;
    r.add(std::move(t));
  }
  {
    Technique t;
    t.name = "kvcache_model";
    t.description = "SmolLM2-135M teacher forced through the KV cache per storage type: perplexity and bytes";
    t.schema.params = {
        text_param("model", "the model", "smollm2", {"smollm2"}),
        text_param("kv_dtype",
                   "storage of K and V (fp8-e4m3-static: scales, int4-smooth: key smoothing factors, calibrated on "
                   "training windows; fp8-e5m2: no scale; q8_0, q4_0: llama.cpp's, an fp16 scale per 32 values; "
                   "int4-kivi, int2-kivi: KIVI's keys per channel over groups of 32 tokens, values per token, in 4 or 2 "
                   "bits, the newest residual tokens in fp16)",
                   nullptr, {"fp32", "bf16", "fp16", "int8", "fp8-e4m3", "fp8-e4m3-static", "fp8-e5m2", "int4", "int4-smooth",
                             "q8_0", "q4_0", "int4-kivi", "int2-kivi"}),
        text_param("weights", "format of every projection (RTN; lm_head then int8), or fp32", "fp32"),
        text_param("activations",
                   "inputs of the batch-1 matvecs: fp32 (the packed kernels) or int8 (packed-a8: rounded per block "
                   "of 32 and multiplied in integer byte multiply-adds, llama.cpp's W4A8 / W8A8; needs a weight format)",
                   "fp32", {"fp32", "int8"}),
        int_param("batch", "validation windows decoded together", 4),
        int_param("seq", "tokens per window", 128),
        int_param("residual", "int4-kivi, int2-kivi: KIVI's R, the newest tokens a sequence keeps in fp16, quantized R at "
                  "a time (a multiple of 32)", 32, 32),
        int_param("block", "tokens per block of the paged cache", 16),
        int_param("hot_tokens", "paged-offload: newest tokens per window kept on the device", 256, 1),
        int_param("host_layers", "weight-offload: layers whose projections live in the host pool (0: not run)", 0, 0),
        int_param("kv_calib_windows", "fp8-e4m3-static / int4-smooth: training windows (of seq tokens) that set the scales", 8, 1),
        int_param("seed", "window sampling", 1, 0),
        text_param("corpus_dir", "fortunes directory; default: $MEMTRADE_FORTUNES_DIR or the Debian path", ""),
        text_param("corpus_sha256", "the corpus checksum the case expects (a mismatch is an error)", ""),
    };
    t.schema.metrics = {
        {"perplexity", "1", Better::lower, Gate::ratio, 1.01, 0, "exp(mean loss per token) through the cache"},
        {"perplexity_full_fp32", "1", Better::none, Gate::report, 0, 0, "the full-sequence fp32 forward's"},
        {"perplexity_rel_delta", "1", Better::lower, Gate::report, 0, 0, "change against the full forward"},
        {"perplexity_rel_delta_se", "1", Better::none, Gate::report, 0, 0, "its standard error over the windows"},
        {"kv_bytes_per_token", "bytes", Better::lower, Gate::exact, 0, 0, "K and V of one token at every layer"},
        {"kv_bytes_per_token_bf16", "bytes", Better::none, Gate::report, 0, 0, "the same stored in bf16"},
        {"weight_bytes_read", "bytes", Better::lower, Gate::exact, 0, 0, "projections and lm_head as stored"},
        {"memory_at_*", "bytes", Better::lower, Gate::exact, 0, 0,
         "every weight as stored plus the KV cache of one sequence of that many tokens"},
        {"kv_residual_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
         "int4-kivi, int2-kivi: a sequence's fp16 residual (R tokens at every layer)"},
        {"kv_to_device_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
         "paged-offload: cold KV staged to the device over the run (every layer, every step)"},
        {"kv_to_host_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "paged-offload: blocks moved to the host over the run"},
        {"weight_host_bytes", "bytes", Better::none, Gate::exact, 0, 0,
         "weight-offload: the offloaded layers' projections in the host pool"},
        {"weight_staging_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
         "weight-offload: the device staging area (one offloaded layer, 64-byte aligned projections)"},
        {"weight_to_device_bytes", "bytes", Better::lower, Gate::exact, 0, 0,
         "weight-offload: projections staged to the device over the run (every offloaded layer, every step)"},
    };
    for (auto& m : modelled_link_metrics("the bytes staged over the run")) t.schema.metrics.push_back(std::move(m));
    // The error is the per-token losses against the full forward's in fp32. With fp32 storage and fp32
    // weights only the summation order differs, and 1e-3 is a guard, not a tolerance: a wrong position, RoPE angle or a
    // missing token changes losses by O(1). Other storage types are judged by their perplexity (a
    // counter, gated against the baseline), so only finiteness is checked.
    t.error_rule.judge = [](const Case& c, const Problem&, const Impl& impl, const ErrorStats& e, const ErrorStats& ref) {
      if (!e.finite()) return Verdict{false, "non-finite loss"};
      const bool fp32 = c.text("kv_dtype") == "fp32" && c.text("weights", "fp32") == "fp32";
      // Paged equals contiguous bit for bit when its blocks are whole chunks of the kernel (8 tokens);
      // other block sizes change where the online softmax rescales, so FlashAttention's rule applies.
      const bool exact = c.integer("block", 16) % 8 == 0;
      const double bound = impl.role == Role::reference ? (fp32 ? 1e-3 : INFINITY)
                           : exact                      ? ref.rel_l2
                                                        : 2 * ref.rel_l2 + 1e-6;
      char buf[160];
      std::snprintf(buf, sizeof buf, "loss rel_l2 %.3e vs bound %.3e%s", e.rel_l2, bound,
                    impl.role == Role::reference ? "" : exact ? " (paged must equal contiguous)" : "");
      return Verdict{e.rel_l2 <= bound, buf};
    };
    t.validate = [](const Case& c) {
      parse_kv_type(c.text("kv_dtype"));
      if (c.text("weights", "fp32") != "fp32") quant::parse_spec(c.text("weights"));
      MT_CHECK(c.text("activations", "fp32") == "fp32" || c.text("weights", "fp32") != "fp32",
               "case " + c.id + ": activations int8 needs a weight format (weights is fp32)");
    };
    t.prepare = prepare_quality;
    add_layouts<QualityProblem, QualityWorkload>(t, "decoder over per-request reserved ranges",
                                                 "decoder over block tables");
    add_offload<QualityProblem, QualityWorkload>(t, "seq", "decoder over block tables, each window's newest hot_tokens on "
                                                            "the device and older blocks in the host pool, staged per layer");
    {
      Impl i = typed_impl<QualityProblem>(
          t.name, "weight-offload", Role::optimized, Backend::cpu,
          "decoder over block tables on the device; the first host_layers layers' projections in the host pool, "
          "staged to the device before the layer runs, every step (on the CPU backend a host copy)",
          [](const QualityProblem& p, Device& d) { return std::make_unique<QualityWorkload>(p, true, d, false, p.host_layers); });
      i.not_applicable = [](const Case& c) {
        return c.integer("host_layers", 0) == 0 ? std::string("host_layers is 0: no layer to offload") : std::string();
      };
      t.impls.push_back(std::move(i));
    }
    t.claims["kv-fp8"] = check_kv_fp8;
    t.claims["offload-latency"] = check_offload_latency;
    r.add(std::move(t));
  }
}

}  // namespace memtrade::kvcache
