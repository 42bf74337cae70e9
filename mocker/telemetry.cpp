// MockerServer::Impl: NATS heartbeats, GET /mocker/stats, and vLLM-named
// Prometheus metrics.
#include "mocker/server_impl.h"

namespace kvroute::mocker {

void MockerServer::Impl::publish_heartbeat() {
  if (!bus) return;
  WorkerHeartbeat hb;
  hb.worker_id = WorkerId{opts.worker_id};
  hb.url = advertised_url();
  hb.model = opts.model;
  hb.block_size = opts.engine.block_size;
  hb.instance_id = instance_id;
  hb.load = engine.load();
  bus->publish(opts.subject_prefix + ".workers", encode_heartbeat(hb));
}

void MockerServer::Impl::heartbeat_loop() {
  publish_heartbeat();
  heartbeat.expires_after(std::chrono::milliseconds(opts.heartbeat_ms));
  heartbeat.async_wait([this](beast::error_code ec) {
    if (!ec) heartbeat_loop();
  });
}

std::string MockerServer::Impl::stats_json() const {
  WorkerLoad l;
  uint64_t cached_blocks = 0, last_event_id = 0;
  std::string ranks;
  for (size_t r = 0; r < engines.size(); ++r) {
    const auto e = engines[r]->load();
    l.request_active_slots += e.request_active_slots;
    l.num_requests_waiting += e.num_requests_waiting;
    l.kv_active_blocks += e.kv_active_blocks;
    l.kv_total_blocks += e.kv_total_blocks;
    cached_blocks += engines[r]->cached_blocks();
    last_event_id += engines[r]->last_event_id();
    ranks += fmt::format(R"({}{{"rank":{},"requests":{},"kv_cached_blocks":{}}})", r ? "," : "", r,
                         requests_by_rank[r], engines[r]->cached_blocks());
  }
  std::string out = fmt::format(
      R"({{"worker_id":{},"requests_total":{},"rejected_total":{},"cancels_total":{},"active":{},"waiting":{},)"
      R"("kv_cached_blocks":{},"kv_active_blocks":{},"kv_total_blocks":{},"events_published":{},"events_dropped":{},)"
      R"("events_publish_failed":{},"drop_pending":{},"last_event_id":{},"hang":{},"steered_total":{},"ranks":[{}],"tokenize_total":{}}})",
      opts.worker_id, requests_total, rejected_total, cancels_total, l.request_active_slots, l.num_requests_waiting,
      cached_blocks, l.kv_active_blocks, l.kv_total_blocks, events_published, events_dropped,
      events_publish_failed, drop_remaining, last_event_id, hang, steered_total, ranks, tokenize_total);
  out.insert(out.size() - 1,
             fmt::format(R"(,"credentials":{{"authorization":{},"x_api_key":{},"last_authorization":"{}",)"
                         R"("last_x_api_key":"{}","unauthorized_total":{}}})",
                         with_authorization, with_x_api_key, json_escape(last_authorization),
                         json_escape(last_x_api_key), unauthorized_total));
  out.insert(out.size() - 1, fmt::format(R"(,"scheduling_policy":"{}","last_priority":{})",
                                         opts.engine.policy == SchedulingPolicy::Priority ? "priority" : "fcfs",
                                         last_priority));
  if (opts.pd.protocol != PdProtocol::None) out.insert(out.size() - 1, ",\"pd\":" + pd_stats_json());
  if (opts.offload.enabled()) out.insert(out.size() - 1, ",\"offload\":" + offload_stats_json());
  if (vllm)  // vLLM mode: ZMQ batches numbered (next seq), not sent live (test hook), replays served
    out.insert(out.size() - 1, fmt::format(R"(,"zmq_batches":{},"zmq_dropped_live":{},"zmq_replays":{})",
                                           vllm->published(), vllm->dropped_live(), vllm->replays_served()));
  return out;
}

// Prometheus text with vLLM's metric names, types and labels (vLLM
// v1/metrics/loggers.py: model_name and engine on every series, one series
// per data-parallel rank; the cache config as an info gauge whose labels
// carry block_size and num_gpu_blocks).
std::string MockerServer::Impl::metrics_text() const {
  struct Family {
    const char* name;
    const char* type;
    const char* help;
  };
  static constexpr Family kFamilies[] = {
      {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches."},
      {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."},
      {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."},
      {"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens."},
      {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens."},
  };
  std::string out;
  for (size_t f = 0; f < std::size(kFamilies); ++f) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", kFamilies[f].name, kFamilies[f].help, kFamilies[f].name,
                       kFamilies[f].type);
    for (size_t r = 0; r < engines.size(); ++r) {
      const Engine& e = *engines[r];
      const auto l = e.load();
      const double usage = l.kv_total_blocks ? static_cast<double>(l.kv_active_blocks) / l.kv_total_blocks : 0.0;
      const double values[] = {static_cast<double>(l.request_active_slots),
                               static_cast<double>(l.num_requests_waiting), usage,
                               static_cast<double>(e.prefix_queries_tokens()),
                               static_cast<double>(e.prefix_hits_tokens())};
      out += fmt::format("{}{{engine=\"{}\",model_name=\"{}\"}} {}\n", kFamilies[f].name, r, opts.model, values[f]);
    }
  }
  out += "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
         "# TYPE vllm:cache_config_info gauge\n";
  for (size_t r = 0; r < engines.size(); ++r)
    out += fmt::format(
        "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\","
        "engine=\"{}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\"}} 1.0\n",
        opts.engine.block_size, r, opts.engine.kv_blocks);
  if (opts.pd.protocol != PdProtocol::None) out += pd_metrics_text();
  return out;
}

}  // namespace kvroute::mocker
