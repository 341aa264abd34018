#include "impls/lora/finetune_model.hpp"

#include "impls/quant/formats.hpp"

namespace memtrade::lora {

const char* method_name(Method m) {
  switch (m) {
    case Method::full: return "full";
    case Method::lora: return "lora";
    case Method::qlora: return "qlora";
  }
  return "?";
}

double nf4_dq_bytes(int64_t rows, int64_t cols) {
  return static_cast<double>(quant::layout(quant::parse_spec("nf4-dq"), rows, cols).total_bytes());
}

FinetuneMemory finetune_memory(const FinetuneSetup& s) {
  const model::Config& c = s.cfg;
  model::validate(c);
  MT_CHECK(s.batch > 0 && s.seq > 0, "finetune memory: batch and seq must be positive");
  MT_CHECK(s.weight_bytes == 2 || s.weight_bytes == 4, "finetune memory: weight_bytes must be 2 or 4");
  const model::ParamLayout L = model::param_layout(c);
  const bool adapters = s.method != Method::full;
  FinetuneMemory m;
  m.params = L.total;
  const double S = static_cast<double>(s.weight_bytes);
  const model::AdapterLayout AL = adapters ? model::adapter_layout(c, s.lora) : model::AdapterLayout{};
  m.trainable = adapters ? AL.total : L.total;
  if (s.method == Method::qlora) {
    double projections = 0, quantized = 0;
    for (int64_t l = 0; l < c.layers; ++l)
      for (int p = 0; p < model::kProjCount; ++p) {
        const auto [rows, cols] = model::proj_shape(c, static_cast<model::Proj>(p));
        projections += static_cast<double>(rows * cols);
        quantized += nf4_dq_bytes(rows, cols);
      }
    m.base_weights = quantized + (static_cast<double>(L.total) - projections) * S;
  } else {
    m.base_weights = static_cast<double>(L.total) * S;
  }
  m.adapter_weights = static_cast<double>(AL.total) * S;
  m.weights = m.base_weights + m.adapter_weights;
  const double T = static_cast<double>(m.trainable);
  m.grads = T * S;
  m.master = s.master ? T * 4 : 0;
  m.optimizer = T * 8;

  const double R = static_cast<double>(s.batch * s.seq), D = static_cast<double>(c.dim),
               KV = static_cast<double>(c.kv_dim()), F = static_cast<double>(c.ffn), H = static_cast<double>(c.heads),
               V = static_cast<double>(c.vocab);
  double sites = 0;
  if (adapters)
    for (int p = 0; p < model::kProjCount; ++p) sites += model::adapted(s.lora.targets, static_cast<model::Proj>(p));
  const double layer = S * R * (6 * D + 2 * KV + 2 * F) + 8 * R + 4 * H * R + sites * S * R * static_cast<double>(s.lora.rank);
  const double layers = static_cast<double>(c.layers);
  const double kept = s.checkpoint ? (layers - 1) * S * R * D + layer : layers * layer;
  m.activations = kept + 2 * S * R * D + 4 * R + S * R * V;
  return m;
}

}  // namespace memtrade::lora
