// ZeRO's model-state memory per data-parallel rank (Rajbhandari et al., ZeRO, section 5 and Fig. 1) and
// ZeRO-Offload's split between the device and the host (Ren et al., ZeRO-Offload, 3.4), for mixed
// precision training with Adam: 16-bit weights and gradients (2 + 2 bytes per parameter) and K = 12 bytes
// of optimizer state (fp32 master weights and both moments).
//   stage 0 (plain data parallelism)  (2 + 2 + K) P
//   stage 1 (optimizer states)        (2 + 2) P + K P / N
//   stage 2 (+ gradients)             2 P + (2 + K) P / N
//   stage 3 (+ weights)               (2 + 2 + K) P / N
//   ZeRO-Offload (stage 2 on the host): device 2 P; host (2 + K) P in all (the 16-bit gradients and the
//   optimizer state of every rank's partition); with DeepSpeed's delayed parameter update (DPU) the host
//   also keeps the pending step's 16-bit gradients while the next step's arrive: host (2 + 2 + K) P
// Activations, buffers and fragmentation are not model state: what a device needs in all is more.
#pragma once

#include <cstdint>

namespace memtrade::offload {

struct ZeroConfig {
  double params = 0;     // P
  int stage = 0;         // 0-3
  int64_t devices = 1;   // N, data-parallel ranks
  bool offload = false;  // ZeRO-Offload (stage 2 with the optimizer on the host)
  double k = 12;         // optimizer bytes per parameter
  bool delayed_update = false;  // offload with the delayed parameter update (a second host gradient buffer)
};

struct ZeroMemory {
  double device_bytes = 0;  // per rank
  double host_bytes = 0;    // in all
};

// Throws Error for a stage outside 0-3, N < 1, offload with a stage other than 2, a delayed update without
// offload, or P < 0.
ZeroMemory zero_model_state(const ZeroConfig& c);

}  // namespace memtrade::offload
