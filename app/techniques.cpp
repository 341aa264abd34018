// Every technique memtrade is built with: the one place that lists them. Each technique folder
// impls/<name>/ defines memtrade::<name>::register_technique(Registry&); a new technique adds its name
// to this list.
#include "app/techniques.hpp"

#define MEMTRADE_TECHNIQUES(X) X(gemm) X(attention) X(precision) X(quant) X(quant_model) X(calibrate) X(kvcache) X(checkpoint) X(accum) X(offload) X(lora)

#define MEMTRADE_DECLARE(name) \
  namespace memtrade::name {   \
  void register_technique(Registry& r); \
  }
MEMTRADE_TECHNIQUES(MEMTRADE_DECLARE)

namespace memtrade {

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
#define MEMTRADE_REGISTER(name) name::register_technique(reg);
    MEMTRADE_TECHNIQUES(MEMTRADE_REGISTER)
    return reg;
  }();
  return r;
}

}  // namespace memtrade
