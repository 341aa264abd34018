// QLoRA's frozen base (Dettmers et al. 2023): every projection stored in NF4 with double quantization
// (impls/quant/formats.hpp's exact blob layout, blocks of 64 along the input dimension, the absmax values
// quantized again to 8 bits in blocks of 256), decoded whole before each GEMM that reads it.
#pragma once

#include <memory>
#include <string>

#include "model/train.hpp"

namespace memtrade::lora {

// A base format for TrainOptions::base_format from a quant spec name ("nf4-dq", "nf4", "int8", ...);
// Error naming the spec when it is not one.
std::shared_ptr<const model::BaseFormat> quantized_base(const std::string& spec = "nf4-dq");

}  // namespace memtrade::lora
