// Fuzz target: parse_engine_metrics and to_worker_load (fleet/engine_metrics.h),
// a worker's Prometheus /metrics text as the router's scraper reads it.
// Contract checked on every input:
//   - counts are finite or +inf and never negative, usage within [0, 1],
//     capacities positive and block size within 1..2^20 when present;
//   - lines are independent: a comment line appended changes nothing;
//   - the load derived from it (to_worker_load, with and without a block
//     size) has at most kv_total_blocks active, kv_total_blocks > 0.
#include <cmath>
#include <string>

#include "fleet/engine_metrics.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const EngineMetrics& a, const EngineMetrics& b) {
  return a.kind == b.kind && a.running == b.running && a.waiting == b.waiting && a.kv_usage == b.kv_usage &&
         a.kv_total_blocks == b.kv_total_blocks && a.kv_total_tokens == b.kv_total_tokens &&
         a.block_size == b.block_size;
}

void check_load(const EngineMetrics& m, uint32_t block_size, uint32_t max_seqs, uint64_t kv_blocks) {
  const WorkerLoad l = to_worker_load(m, block_size, max_seqs, kv_blocks);
  FUZZ_CHECK(l.kv_total_blocks > 0);
  FUZZ_CHECK(l.kv_active_blocks <= l.kv_total_blocks);
  FUZZ_CHECK(l.request_total_slots == max_seqs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto m = parse_engine_metrics(text);
  const auto again = parse_engine_metrics(text + "\n# HELP appended comment\n");
  FUZZ_CHECK(m.has_value() == again.has_value());
  if (!m) return 0;
  FUZZ_CHECK(same(*m, *again));
  FUZZ_CHECK(m->kind == EngineKind::Vllm || m->kind == EngineKind::Sglang);
  FUZZ_CHECK(m->running >= 0 && m->waiting >= 0);  // false for NaN
  if (m->kv_usage) FUZZ_CHECK(*m->kv_usage >= 0 && *m->kv_usage <= 1);
  if (m->kv_total_blocks) FUZZ_CHECK(*m->kv_total_blocks > 0);
  if (m->kv_total_tokens) FUZZ_CHECK(*m->kv_total_tokens > 0);
  if (m->block_size) FUZZ_CHECK(*m->block_size >= 1 && *m->block_size <= 1u << 20);
  check_load(*m, m->block_size.value_or(16), 256, 0);
  check_load(*m, 0, 0, 1000);
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      // vLLM 0.10, two data-parallel engines.
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"Qwen/Qwen3-8B\"} 1.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 0.0\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 0.25\n"
      "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"Qwen/Qwen3-8B\"} 0.5\n"
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_gpu_blocks=\"27000\"} 1.0\n"
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"1\",num_gpu_blocks=\"27000\"} 1.0\n"
      "vllm:prompt_tokens_total{engine=\"0\"} 1.2e+06 1700000000000\n",
      // vLLM before 0.10; CRLF line ends; quoted '}' in a label.
      "vllm:num_requests_running{model_name=\"a}b\"} 2\r\nvllm:gpu_cache_usage_perc 0.1\r\n"
      "vllm:num_requests_waiting 4\r\n",
      // SGLang with two DP ranks.
      "# TYPE sglang:num_running_reqs gauge\n"
      "sglang:num_running_reqs{tp_rank=\"0\",dp_rank=\"0\"} 5\n"
      "sglang:num_running_reqs{tp_rank=\"0\",dp_rank=\"1\"} 7\n"
      "sglang:num_queue_reqs{dp_rank=\"0\"} 2\n"
      "sglang:token_usage{dp_rank=\"0\"} 0.75\n"
      "sglang:max_total_num_tokens{dp_rank=\"0\"} 500000\n"
      "sglang:max_total_num_tokens{dp_rank=\"1\"} 500000\n",
      "vllm:num_requests_running NaN\nsglang:token_usage +Inf\nvllm:kv_cache_usage_perc -1e-3\n",
      "process_cpu_seconds_total 12.5\n",
  };
}
