#include "impls/lora/qlora.hpp"

#include "impls/quant/formats.hpp"

namespace memtrade::lora {

std::shared_ptr<const model::BaseFormat> quantized_base(const std::string& spec) {
  const quant::Spec s = quant::parse_spec(spec);
  auto f = std::make_shared<model::BaseFormat>();
  f->name = quant::spec_name(s);
  f->bytes = [s](int64_t rows, int64_t cols) { return quant::layout(s, rows, cols).total_bytes(); };
  f->encode = [s](int64_t rows, int64_t cols, const float* w, uint8_t* blob) {
    quant::quantize(quant::layout(s, rows, cols), w, blob);
  };
  f->decode = [s](int64_t rows, int64_t cols, const uint8_t* blob, float* w) {
    quant::dequantize(quant::layout(s, rows, cols), blob, w);
  };
  return f;
}

}  // namespace memtrade::lora
