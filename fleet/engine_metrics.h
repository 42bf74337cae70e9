// Load of an inference engine read from its Prometheus /metrics text: vLLM
// (`vllm:` names) and SGLang (`sglang:` names), as the engines export them:
//
//   vLLM   vllm:num_requests_running, vllm:num_requests_waiting (gauges),
//          vllm:kv_cache_usage_perc (0..1; vLLM < 0.10: vllm:gpu_cache_usage_perc),
//          vllm:cache_config_info{block_size="16",num_gpu_blocks="..."} 1 (info gauge)
//          One series per engine (label engine="0".."N-1" with data parallelism).
//   SGLang sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage (0..1),
//          sglang:max_total_num_tokens (KV capacity in tokens); one series per
//          scheduler rank with DP attention.
//
// Series of one name are summed (requests, capacity) or capacity-weighted
// (usage). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "scheduler/scheduler.h"

namespace kvroute {

enum class EngineKind : uint8_t { Unknown, Vllm, Sglang };

struct EngineMetrics {
  EngineKind kind = EngineKind::Unknown;
  double running = 0;                      // requests being processed
  double waiting = 0;                      // requests queued
  std::optional<double> kv_usage;          // 0..1
  std::optional<uint64_t> kv_total_blocks; // vLLM num_gpu_blocks (sum over engines)
  std::optional<uint64_t> kv_total_tokens; // SGLang max_total_num_tokens (sum over ranks)
  std::optional<uint32_t> block_size;      // vLLM cache_config_info block_size
};

// Parses the exposition text. Unknown lines are skipped, and so are values
// not believed: a capacity (num_gpu_blocks, max_total_num_tokens) above 2^32,
// a block_size outside 1..2^20. Returns nullopt when no known engine metric
// was found (the worker is then judged unparseable: a failed scrape). Never
// throws.
std::optional<EngineMetrics> parse_engine_metrics(std::string_view text);

// The load the scheduler sees. `block_size` converts SGLang's token capacity
// to blocks; `max_seqs` and `kv_blocks` stand in where the engine does not
// report its capacity (kv_blocks 0 and nothing reported: a usage-only load on
// a nominal 10,000-block scale).
WorkerLoad to_worker_load(const EngineMetrics& m, uint32_t block_size, uint32_t max_seqs, uint64_t kv_blocks);

}  // namespace kvroute
