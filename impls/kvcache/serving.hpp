// A serving simulation over the KV cache's allocators (no attention math): a seeded stream of requests
// whose prompt and output lengths are drawn from exponential distributions with a trace's published
// means, admitted first come first served under a KV memory budget, one decode token per running
// request per step.
//
//   contiguous  a request is admitted when max_len tokens can be reserved for it (naive serving stacks
//               reserve the longest sequence the model allows, since the output length is unknown);
//   paged       a request is admitted when its prompt's blocks are free; each step appends a token per
//               request; when a block cannot be had, the most recently admitted request is preempted
//               (its blocks freed, it goes back to the head of the queue and is recomputed later:
//               vLLM's recompute policy).
// Figures, averaged over the steps in which any request runs:
//   utilization          bytes of the running requests' tokens / bytes the cache reserves for them
//   budget_utilization   bytes of the running requests' tokens / the budget
//   internal_frag        (reserved - tokens) / budget: reserved but unused inside allocations
//   external_frag        (budget - reserved) / budget while a request waits: free but unusable
//   concurrency          running requests
// and the preemptions, finished requests and decode tokens per step.
//
// A storage type that keeps each request's newest tokens apart (the KIVI types: up to R tokens in fp16,
// KIVI's full-precision residual, quantized R at a time, as KvShape::residual has the cache hold it) is
// simulated by its ResidualModel: a request holds the residual's bytes in pool tokens from
// admission to release, and a token enters the pool only when its run of R completes (then the whole run
// does); the tokens in the residual count as live at the residual's bytes per token.
#pragma once

#include <cstdint>
#include <string>

#include "impls/kvcache/kv_cache.hpp"

namespace memtrade::kvcache {

struct TraceSpec {
  double prompt_mean = 161, output_mean = 338;  // ShareGPT-like (vLLM, Fig. 11)
  int64_t max_len = 2048;                       // the model's longest sequence
  int64_t requests = 200;
  uint64_t seed = 1;
};
TraceSpec trace_spec(const std::string& name);  // "sharegpt" (161 / 338), "alpaca" (19 / 58)

struct ServingStats {
  double utilization = 0, budget_utilization = 0, internal_frag = 0, external_frag = 0, concurrency = 0;
  int64_t preemptions = 0, finished = 0, steps = 0, decode_tokens = 0, max_concurrency = 0;
};

// How a storage type's per-request residual maps onto the pool's tokens (group = 1, tokens = 0: none).
struct ResidualModel {
  int64_t group = 1;    // tokens enter the pool in whole groups (R)
  int64_t tokens = 0;   // pool tokens a running request holds for its residual (its bytes, rounded up)
  double per_token = 0; // a residual token's bytes in pool tokens (fp16 against the storage type)
};
// The model of s.residual (R) tokens for a KIVI type (Error when s does not validate), none for the others.
ResidualModel residual_model(const KvShape& s);

// The tokens a KV budget of budget_bytes holds when each token takes s.token_bytes() (K and V of every
// layer, scales included), rounded down to whole blocks of `block` tokens: what a budget in bytes means for
// each storage type. Error when that is not at least max_len tokens, one request's residual (of
// s.residual tokens) and one block.
int64_t budget_tokens_of(const KvShape& s, int64_t budget_bytes, int64_t block, int64_t max_len);

// Runs the trace to completion on `cache` (empty, with room for `budget_tokens` tokens: the paged cache's
// pool, or the pool capacity the contiguous cache allocates from).
ServingStats simulate(KvCache& cache, bool paged, const TraceSpec& trace, int64_t budget_tokens,
                      const ResidualModel& residual = {});

}  // namespace memtrade::kvcache
