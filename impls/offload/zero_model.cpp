#include "impls/offload/zero_model.hpp"

#include <string>

#include "common/common.hpp"

namespace memtrade::offload {

ZeroMemory zero_model_state(const ZeroConfig& c) {
  MT_CHECK(c.params >= 0 && c.devices >= 1 && c.k >= 0, "zero model: params and k must be >= 0 and devices >= 1");
  MT_CHECK(c.stage >= 0 && c.stage <= 3, "zero model: stage " + std::to_string(c.stage) + " is not one of 0-3");
  MT_CHECK(!c.offload || c.stage == 2, "zero model: ZeRO-Offload partitions like stage 2 (got stage " +
                                           std::to_string(c.stage) + ")");
  MT_CHECK(!c.delayed_update || c.offload, "zero model: the delayed parameter update needs ZeRO-Offload");
  const double P = c.params, N = static_cast<double>(c.devices), K = c.k;
  if (c.offload) return {2 * P, ((c.delayed_update ? 4 : 2) + K) * P};
  switch (c.stage) {
    case 0: return {(2 + 2 + K) * P, 0};
    case 1: return {(2 + 2) * P + K * P / N, 0};
    case 2: return {2 * P + (2 + K) * P / N, 0};
    default: return {(2 + 2 + K) * P / N, 0};
  }
}

}  // namespace memtrade::offload
