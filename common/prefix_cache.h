// The engines' prefix-cache hit rule, in one place: the router's claims
// (x-kvroute-cached-tokens, the cost, the predicted TTFT, explain, the status
// page) and kvroute-mocker's engine both count cached prompt tokens with it.
//
// An engine always computes at least the prompt's last token (its logits give
// the first output token), and it reuses whole blocks only:
//   vLLM  vllm/v1/core/kv_cache_manager.py get_computed_blocks():
//         max_cache_hit_length = request.num_tokens - 1, then
//         find_longest_cache_hit() keeps max_length // block_size blocks.
//   SGLang python/sglang/srt/managers/schedule_batch.py
//         _compute_max_prefix_len(): max_prefix_len = input_len - 1 (lower
//         still for logprob requests); the radix cache matches whole pages.
// So a fully cached block-aligned prompt of L tokens hits L - block_size.
// (A vLLM request asking for prompt_logprobs reads no cache at all:
// RouteResult::skips_prefix_cache.)
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvroute {

// Prompt tokens served from the cache when `matched_blocks` of the prompt's
// leading complete blocks are cached (a tier-weighted count may be
// fractional): whole blocks, at most prompt_tokens - 1. block_size > 0.
inline double cached_prefix_tokens(double matched_blocks, uint32_t prompt_tokens, uint32_t block_size) {
  const uint32_t usable_blocks = prompt_tokens == 0 ? 0 : (prompt_tokens - 1) / block_size;
  return std::min(matched_blocks, static_cast<double>(usable_blocks)) * block_size;
}

}  // namespace kvroute
