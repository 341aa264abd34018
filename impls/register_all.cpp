// Every technique memtrade is built with. A new technique adds one line here.
#include "harness/registry.hpp"
#include "impls/attention/attention.hpp"
#include "impls/gemm/gemm.hpp"
#include "impls/precision/precision.hpp"

namespace memtrade {

namespace quant {
void register_technique(Registry& r);  // impls/quant/register.cpp
void register_model_level(Registry& r);  // impls/quant/model_level.cpp
}

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    gemm::register_technique(reg);
    attn::register_technique(reg);
    precision::register_technique(reg);
    quant::register_technique(reg);
    quant::register_model_level(reg);
    return reg;
  }();
  return r;
}

}  // namespace memtrade
