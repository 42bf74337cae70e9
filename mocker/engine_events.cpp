// MockerServer::Impl: the engine clock (one tick timer for all ranks, the rank
// a request goes to) and the engine's KV events (NATS JSON or vLLM ZMQ batches).
#include "mocker/server_impl.h"

namespace kvroute::mocker {

// vLLM mode: the event joins this step's batch, sent when the io thread
// finishes the current handler (vLLM publishes one batch per step).
void MockerServer::Impl::queue_vllm_event(const KvEvent& ev) {
  const uint32_t rank = ev.owner.dp_rank;
  const Engine& engine = *engines[rank];
  VllmEventBatch& batch = vllm_batch[rank];
  if (auto* st = std::get_if<KvStored>(&ev.data); st && ev.tier == StorageTier::HostPinned) {
    // As vLLM's OffloadingConnector announces its CPU copies (take_events()):
    // the GPU's block hashes only, no parent, no tokens, no group.
    VllmBlockStored s;
    s.block_size = opts.engine.block_size;
    s.medium = medium_of(ev.tier);
    for (const StoredBlock& b : st->blocks) s.block_hashes.push_back(b.block_hash);
    batch.events.push_back(std::move(s));
  } else if (st) {
    VllmBlockStored s;
    s.parent_block_hash = st->parent;
    s.block_size = opts.engine.block_size;
    s.medium = medium_of(ev.tier);
    s.group_idx = 0;
    s.kv_cache_spec_kind = "full_attention";
    s.token_ids.reserve(st->blocks.size() * opts.engine.block_size);
    for (size_t i = 0; i < st->blocks.size(); ++i) {
      const Engine::BlockInfo* info = engine.block_info(st->blocks[i].block_hash);
      if (!info) return;  // cannot happen with keep_tokens: every announced block is cached
      s.block_hashes.push_back(st->blocks[i].block_hash);
      s.token_ids.insert(s.token_ids.end(), info->tokens.begin(), info->tokens.end());
      if (i == 0) {
        s.lora_name = info->lora_name;
        if (!st->parent) s.cache_salt = info->cache_salt;
      }
    }
    // vLLM before its extra_keys field: no salt on the wire (lora_name is a
    // field of its own), while the engine's own cache stays keyed by it.
    s.omit_extra_keys = opts.no_extra_keys;
    batch.events.push_back(std::move(s));
  } else if (auto* rm = std::get_if<KvRemoved>(&ev.data)) {
    batch.events.push_back(VllmBlockRemoved{rm->block_hashes, medium_of(ev.tier), 0});
  } else {
    batch.events.push_back(VllmAllBlocksCleared{});
  }
  ++events_published;
  if (vllm_flush_posted[rank]) return;
  vllm_flush_posted[rank] = true;
  asio::post(ioc, [this, rank] {
    vllm_flush_posted[rank] = false;
    VllmEventBatch& b = vllm_batch[rank];
    b.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    publishers[rank]->publish(std::move(b));
    b = VllmEventBatch{};
  });
}

void MockerServer::Impl::publish_event(const KvEvent& ev) {
  if (vllm) {
    queue_vllm_event(ev);
    return;
  }
  if (drop_remaining > 0) {
    --drop_remaining;
    ++events_dropped;
    return;
  }
  if (!bus) return;
  KvEvent stamped = ev;
  stamped.instance = instance_id;  // restarts are told by instance, not by event ids
  if (bus->publish(opts.subject_prefix + ".kv_events", encode_kv_event(stamped))) {
    ++events_published;
  } else {
    ++events_publish_failed;
    spdlog::warn("kvroute-mocker: KV event {} not published (NATS connection closed)", engine.last_event_id());
  }
}

// Runs the engine up to now, hands outputs to sessions, re-arms the timer.
void MockerServer::Impl::on_tick() {
  const double now = now_ms();
  for (auto& e : engines)
    for (const auto& out : e->advance_to(now)) {
      auto it = pending.find(out.request);
      if (it == pending.end()) continue;
      it->second->outputs.push_back(out);
      it->second->wake.cancel();
    }
  schedule();
}

// The earliest step end of any rank.
std::optional<double> MockerServer::Impl::next_event_time() const {
  std::optional<double> next;
  for (const auto& e : engines)
    if (auto t = e->next_event_time(); t && (!next || *t < *next)) next = t;
  return next;
}

// The rank a request goes to: the X-data-parallel-rank header (vLLM's
// _get_data_parallel_rank(): an integer, else ignored), else the rank with
// the lowest waiting * 4 + running, the lowest rank on ties (vLLM's
// DPLBAsyncMPClient.get_core_engine_for_request(),
// vllm/v1/engine/core_client.py). -1: the header names no rank of ours.
int MockerServer::Impl::pick_rank(const http::request<http::string_body>& req) {
  auto h = req.find("X-data-parallel-rank");
  if (h != req.end()) {
    const std::string_view v(h->value().data(), h->value().size());
    int64_t r = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), r);
    if (ec == std::errc() && p == v.data() + v.size()) {
      if (r < 0 || r >= static_cast<int64_t>(engines.size())) return -1;
      ++steered_total;
      return static_cast<int>(r);
    }
  }
  int best = 0;
  uint64_t best_score = UINT64_MAX;
  for (size_t r = 0; r < engines.size(); ++r) {
    const auto l = engines[r]->load();
    const uint64_t score = uint64_t{l.num_requests_waiting} * 4 + l.request_active_slots;
    if (score < best_score) best_score = score, best = static_cast<int>(r);
  }
  return best;
}

void MockerServer::Impl::schedule() {
  const auto next = next_event_time();
  if (!next) {
    scheduled.reset();
    tick.cancel();
    return;
  }
  if (scheduled && *scheduled == *next) return;
  scheduled = next;
  const double wait_real_ms = std::max(0.0, (*next - now_ms()) / opts.speedup);
  tick.expires_after(std::chrono::microseconds(static_cast<int64_t>(wait_real_ms * 1000)));
  tick.async_wait([this](beast::error_code ec) {
    if (ec) return;  // re-armed or stopped
    scheduled.reset();
    on_tick();
  });
}

}  // namespace kvroute::mocker
