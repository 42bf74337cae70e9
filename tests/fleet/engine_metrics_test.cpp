#include "fleet/engine_metrics.h"

#include <doctest/doctest.h>


using namespace kvroute;

// Shapes as vLLM (v1, data parallel 2) and SGLang export them.
static constexpr std::string_view kVllm = R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1234.0
)";

static constexpr std::string_view kSglang = R"(# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 7.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 4.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.75
sglang:max_total_num_tokens{model_name="qwen",tp_rank="0"} 64000.0
)";

TEST_CASE("vLLM metrics: requests summed over engines, usage averaged, blocks from cache_config_info") {
  auto m = parse_engine_metrics(kVllm);
  REQUIRE(m);
  CHECK(m->kind == EngineKind::Vllm);
  CHECK(m->running == 5);
  CHECK(m->waiting == 1);
  CHECK(m->kv_usage.value() == doctest::Approx(0.375));
  CHECK(m->kv_total_blocks.value() == 2000);
  CHECK(m->block_size.value() == 16);
  auto l = to_worker_load(*m, 16, 256, 0);
  CHECK(l.request_active_slots == 5);
  CHECK(l.request_total_slots == 256);
  CHECK(l.num_requests_waiting == 1);
  CHECK(l.kv_total_blocks == 2000);
  CHECK(l.kv_active_blocks == 750);
}

TEST_CASE("older vLLM: gpu_cache_usage_perc; no cache_config_info: the configured capacity") {
  auto m = parse_engine_metrics("vllm:gpu_cache_usage_perc 0.1\nvllm:num_requests_running 2\n");
  REQUIRE(m);
  CHECK(m->kv_usage.value() == doctest::Approx(0.1));
  auto l = to_worker_load(*m, 16, 64, 5000);
  CHECK(l.kv_total_blocks == 5000);
  CHECK(l.kv_active_blocks == 500);
  CHECK(l.request_total_slots == 64);
}

TEST_CASE("SGLang metrics: token capacity converted to blocks") {
  auto m = parse_engine_metrics(kSglang);
  REQUIRE(m);
  CHECK(m->kind == EngineKind::Sglang);
  auto l = to_worker_load(*m, 16, 256, 0);
  CHECK(l.request_active_slots == 7);
  CHECK(l.num_requests_waiting == 4);
  CHECK(l.kv_total_blocks == 4000);
  CHECK(l.kv_active_blocks == 3000);
}

TEST_CASE("no engine metric, malformed lines and hostile values are not a load") {
  CHECK_FALSE(parse_engine_metrics(""));
  CHECK_FALSE(parse_engine_metrics("# only comments\nprocess_cpu_seconds_total 3\n"));
  CHECK_FALSE(parse_engine_metrics("vllm:num_requests_running{engine=\"0\" 3\n"));  // unclosed labels
  auto m = parse_engine_metrics(
      "vllm:num_requests_running NaN\nvllm:num_requests_waiting -5\nvllm:kv_cache_usage_perc 7\n"
      "vllm:cache_config_info{num_gpu_blocks=\"x}\",block_size=\"16\"} 1\n");
  REQUIRE(m);
  CHECK(m->running == 0);
  CHECK(m->waiting == 0);
  CHECK(m->kv_usage.value() == 1.0);  // clamped
  CHECK_FALSE(m->kv_total_blocks);    // not a number
}

TEST_CASE("capacities above 2^32 and block sizes outside 1..2^20 are not believed (found by fuzzing)") {
  // A token capacity of 1e300 was converted to uint64_t (undefined behaviour).
  auto m = parse_engine_metrics("sglang:max_total_num_tokens 1e300\nsglang:num_running_reqs 1\n");
  REQUIRE(m);
  CHECK_FALSE(m->kv_total_tokens);
  CHECK(to_worker_load(*m, 16, 8, 500).kv_total_blocks == 500);
  // block_size 0 was reported as the engine's block size; 2^32 + 16 was read as 16;
  // two num_gpu_blocks of 2^64 - 1 wrapped around.
  m = parse_engine_metrics(
      "vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"18446744073709551615\"} 1\n"
      "vllm:cache_config_info{block_size=\"4294967312\",engine=\"1\",num_gpu_blocks=\"18446744073709551615\"} 1\n");
  REQUIRE(m);
  CHECK_FALSE(m->block_size);
  CHECK_FALSE(m->kv_total_blocks);
  m = parse_engine_metrics("vllm:cache_config_info{block_size=\"1048576\",num_gpu_blocks=\"4294967296\"} 1\n");
  REQUIRE(m);
  CHECK(m->block_size == 1048576u);
  CHECK(m->kv_total_blocks == uint64_t{1} << 32);
}
