// MockerServer::Impl: offload mode (mocker/README.md, "Offload mode"). The
// device's blocks are written through to the shared pool as they are stored
// (LMCache's store on prefill) and offloaded to the host tier as the device
// evicts them (vLLM's CPU offloading); each tier announces its stores and
// evictions in the worker's own event sequence with its medium. A request
// loads the blocks after its device prefix from the host tier, then the
// pool, taking their bytes over each tier's bandwidth, instead of prefilling them.
#include "mocker/server_impl.h"

namespace kvroute::mocker {

namespace {

double kv_bytes_of(const MockerOptions& o) {
  return o.pd.kv_bytes_per_token > 0 ? o.pd.kv_bytes_per_token : o.engine.profile.kv_bytes_per_token;
}

}  // namespace

bool MockerServer::Impl::open_offload(std::string* err) {
  if (!opts.offload.pool_dir.empty()) {
    pool.emplace(opts.offload.pool_dir);
    if (!pool->open(err)) return false;
  }
  host = HostTier(opts.offload.host_blocks);
  if (opts.offload.host_blocks > 0) engine.set_eviction_hook([this](const KvRemoved& rm) { offload_evicted(rm); });
  return true;
}

void MockerServer::Impl::on_engine_event(const KvEvent& ev) {
  publish_event(ev);
  offload_after(ev);
}

void MockerServer::Impl::offload_after(const KvEvent& ev) {
  // Only the device's own events: a tier's announcement (it carries its medium) is not followed again.
  if (!opts.offload.enabled() || !ev.medium.empty()) return;
  const std::string& medium = opts.offload.pool_medium;
  if (const auto* st = std::get_if<KvStored>(&ev.data)) {
    KvStored run;  // blocks this mocker put in the pool first, in chain runs
    auto flush = [&] {
      if (run.blocks.empty()) return;
      KvEvent out;
      out.tier = StorageTier::External;
      out.medium = medium;
      out.data = std::move(run);
      run = KvStored{};
      engine.announce(std::move(out));
    };
    std::optional<SequenceHash> parent = st->parent;
    KvRemoved moved;  // back on the device from the host tier, which lets them go
    for (const StoredBlock& b : st->blocks) {
      const BlockMeta meta{b.tokens_hash, parent};
      if (opts.offload.host_blocks > 0) {
        device_meta[b.block_hash.value] = meta;
        if (host.take(b.block_hash)) moved.block_hashes.push_back(b.block_hash);
      }
      if (pool && pool->put(b.block_hash, meta)) {
        ++offload_stats.pool_stored_blocks;
        if (run.blocks.empty()) run.parent = parent;
        run.blocks.push_back(b);
      } else {
        flush();
      }
      parent = b.block_hash;
    }
    flush();
    if (!moved.block_hashes.empty()) {
      // After the device's store: the router's index never sees them leave.
      KvEvent out;
      out.tier = StorageTier::HostPinned;
      out.medium = "CPU";
      out.data = std::move(moved);
      engine.announce(std::move(out));
    }
    if (pool && opts.offload.pool_blocks > 0) {
      KvRemoved gone;
      for (SequenceHash id : pool->over_capacity(opts.offload.pool_blocks))
        if (pool->remove(id)) gone.block_hashes.push_back(id);
      if (!gone.block_hashes.empty()) {
        offload_stats.pool_evicted_blocks += gone.block_hashes.size();
        KvEvent out;
        out.tier = StorageTier::External;
        out.medium = medium;
        out.data = std::move(gone);
        engine.announce(std::move(out));
      }
    }
  }
}

void MockerServer::Impl::offload_evicted(const KvRemoved& rm) {
  // About to leave the device (children before parents), still held there:
  // offloaded to the host parents first, so that each store's parent is
  // held, and announced before the device's removal, so that the router's
  // index keeps each block cached (on the host) instead of losing it.
  KvRemoved dropped;
  for (auto it = rm.block_hashes.rbegin(); it != rm.block_hashes.rend(); ++it) {
    auto meta = device_meta.find(it->value);
    if (meta == device_meta.end()) continue;
    const BlockMeta m = meta->second;
    device_meta.erase(meta);
    for (SequenceHash v : host.put(*it, m)) dropped.block_hashes.push_back(v);
    ++offload_stats.host_offloaded_blocks;
    KvEvent out;
    out.tier = StorageTier::HostPinned;
    out.medium = "CPU";
    out.data = KvStored{m.parent, {StoredBlock{*it, m.local}}};
    engine.announce(std::move(out));
  }
  if (!dropped.block_hashes.empty()) {
    offload_stats.host_evicted_blocks += dropped.block_hashes.size();
    KvEvent out;
    out.tier = StorageTier::HostPinned;
    out.medium = "CPU";
    out.data = std::move(dropped);
    engine.announce(std::move(out));
  }
}

awaitable<void> MockerServer::Impl::offload_load(Prepared& prep) {
  if (!opts.offload.enabled()) co_return;
  Engine& e = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash> blocks = e.prompt_blocks(prep.tokens, prep.ns);
  if (!prep.read_cache) {  // prompt_logprobs: the engine reads no cache, nothing is loaded
    offload_stats.computed_blocks += blocks.size();
    co_return;
  }
  // The prompt's leading blocks that need no prefill: on the device, in the
  // host tier or in the pool (a device block may follow a loaded one).
  const std::span<const SequenceHash> all(blocks);
  uint32_t k = 0;
  uint64_t on_device = 0, from_host = 0, from_pool = 0;
  for (; k < blocks.size(); ++k) {
    if (e.cached_prefix(all.subspan(k, 1)) == 1) ++on_device;
    else if (host.contains(blocks[k])) ++from_host;
    else if (pool && pool->contains(blocks[k])) ++from_pool;
    else break;
  }
  offload_stats.cached_blocks += on_device;
  offload_stats.computed_blocks += blocks.size() - k;
  if (from_host + from_pool == 0) co_return;
  const double kv = kv_bytes_of(opts);
  const uint32_t bs = opts.engine.block_size;
  const double ms =
      load_ms(from_host, bs, kv, opts.offload.host_gbps) + load_ms(from_pool, bs, kv, opts.offload.pool_gbps);
  ++offload_stats.loads;
  offload_stats.load_ms += ms;
  offload_stats.host_loaded_blocks += from_host;
  offload_stats.pool_loaded_blocks += from_pool;
  if (ms > 0) {
    asio::steady_timer t(ioc);
    t.expires_after(std::chrono::microseconds(static_cast<int64_t>(ms / opts.speedup * 1000)));
    beast::error_code ec;
    co_await t.async_wait(nothrow(ec));
  }
  prep.imported_blocks = k;  // the engine takes them as computed (its store announces them on the device)
}

// The resync dump: the device's blocks, then the host tier's, then the
// pool's as this mocker sees it (the router stores pool blocks once
// whichever member lists them).
std::vector<KvEvent> MockerServer::Impl::offload_dump() const {
  std::vector<KvEvent> out = engine.dump();
  for (const auto& [id, m] : host.list()) {
    KvEvent ev;
    ev.tier = StorageTier::HostPinned;
    ev.medium = "CPU";
    ev.data = KvStored{m.parent, {StoredBlock{id, m.local}}};
    out.push_back(std::move(ev));
  }
  if (pool)
    for (const auto& [id, m] : pool->list()) {
      KvEvent ev;
      ev.tier = StorageTier::External;
      ev.medium = opts.offload.pool_medium;
      ev.data = KvStored{m.parent, {StoredBlock{id, m.local}}};
      out.push_back(std::move(ev));
    }
  return out;
}

std::string MockerServer::Impl::offload_stats_json() const {
  const OffloadStats& s = offload_stats;
  return fmt::format(
      R"({{"pool_dir":"{}","pool_medium":"{}","pool_loaded_blocks":{},"host_loaded_blocks":{},"computed_blocks":{},)"
      R"("cached_blocks":{},"pool_stored_blocks":{},"pool_evicted_blocks":{},"host_offloaded_blocks":{},)"
      R"("host_evicted_blocks":{},"host_blocks":{},"loads":{},"load_ms":{:.3f}}})",
      json_escape(opts.offload.pool_dir), json_escape(opts.offload.pool_medium), s.pool_loaded_blocks,
      s.host_loaded_blocks, s.computed_blocks, s.cached_blocks, s.pool_stored_blocks, s.pool_evicted_blocks,
      s.host_offloaded_blocks, s.host_evicted_blocks, host.size(), s.loads, s.load_ms);
}

}  // namespace kvroute::mocker
