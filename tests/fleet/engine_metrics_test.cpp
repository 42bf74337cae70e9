#include "fleet/engine_metrics.h"

#include <doctest/doctest.h>

#include "fleet/http_url.h"

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

TEST_CASE("http URLs: host, port, target; IPv6 in brackets; garbage refused") {
  HttpUrl u;
  REQUIRE(parse_http_url("http://10.0.0.7:8000/metrics", u));
  CHECK(u.host == "10.0.0.7");
  CHECK(u.port == 8000);
  CHECK(u.target == "/metrics");
  REQUIRE(parse_http_url("http://[::1]:9000", u));
  CHECK(u.host == "::1");
  CHECK(u.port == 9000);
  CHECK(u.target == "/");
  REQUIRE(parse_http_url("http://vllm-0.vllm.svc/metrics?x=1", u));
  CHECK(u.port == 80);
  CHECK(u.target == "/metrics?x=1");
  CHECK_FALSE(parse_http_url("http://::1:9000/", u));
  CHECK_FALSE(parse_http_url("http://host:0/", u));
  CHECK_FALSE(parse_http_url("http://host:99999/", u));
  CHECK_FALSE(parse_http_url("ftp://host/", u));
  CHECK_FALSE(parse_http_url("http://[::1/", u));
  CHECK_FALSE(parse_http_url("http://:80/", u));
}
