#include "mocker/engine.h"

#include <algorithm>
#include <cassert>

#include "common/prefix_cache.h"
#include "indexer/block_hash.h"

namespace kvroute::mocker {

Engine::Engine(EngineConfig cfg, std::function<void(const KvEvent&)> on_event)
    : cfg_(cfg), on_event_(std::move(on_event)) {
  assert(cfg_.block_size > 0 && cfg_.kv_blocks > 0 && cfg_.max_seqs > 0 && cfg_.max_batched_tokens > 0);
}

Engine::Engine(const Engine& o)
    : cfg_(o.cfg_),
      on_event_([](const KvEvent&) {}),
      blocks_(o.blocks_),
      lru_(o.lru_),
      private_blocks_(o.private_blocks_),
      stored_blocks_(o.stored_blocks_),
      requests_(o.requests_),
      waiting_(o.waiting_),
      running_(o.running_),
      step_end_(o.step_end_),
      event_id_(o.event_id_),
      prefix_queries_(o.prefix_queries_),
      prefix_hits_(o.prefix_hits_),
      held_(o.held_),
      held_block_refs_(o.held_block_refs_) {
  // The copied blocks' LRU positions point into o's list: re-point them.
  for (auto it = lru_.begin(); it != lru_.end(); ++it) blocks_.at(*it).lru = it;
}

Engine Engine::fork() const { return Engine(*this); }

double Engine::prefill_ms(double new_tokens, double cached) const {
  return cfg_.profile.prefill_ms(static_cast<uint64_t>(new_tokens), static_cast<uint64_t>(cached));
}

uint64_t Engine::blocks_needed(uint64_t prompt_tokens, uint32_t max_tokens) const {
  const uint64_t bs = cfg_.block_size;
  return (prompt_tokens + max_tokens + bs - 1) / bs;
}

void Engine::emit(KvEvent ev) {
  ev.owner = cfg_.owner;
  ev.tier = cfg_.tier;
  ev.event_id = ++event_id_;
  if (on_event_) on_event_(ev);
}

void Engine::announce(KvEvent ev) {
  ev.owner = cfg_.owner;
  ev.event_id = ++event_id_;
  if (on_event_) on_event_(ev);
}

bool Engine::add_request(uint64_t id, std::span<const TokenId> prompt, uint32_t max_tokens, double now_ms,
                         const HashNamespace& ns, bool read_cache, PdOptions pd, int64_t priority) {
  if (prompt.empty() || prompt.size() > UINT32_MAX) return false;
  std::vector<LocalBlockHash> locals;
  hash_blocks(prompt, cfg_.block_size, ns, locals);
  std::vector<std::shared_ptr<BlockInfo>> infos;
  if (cfg_.keep_tokens) {
    infos.reserve(locals.size());
    for (size_t i = 0; i < locals.size(); ++i) {
      auto info = std::make_shared<BlockInfo>();
      info->tokens.assign(prompt.begin() + i * cfg_.block_size, prompt.begin() + (i + 1) * cfg_.block_size);
      info->lora_name = ns.lora_name;
      if (i == 0) info->cache_salt = ns.cache_salt;
      infos.push_back(std::move(info));
    }
  }
  return add_request_impl(id, static_cast<uint32_t>(prompt.size()), locals, max_tokens, now_ms, std::move(infos),
                          read_cache, pd, priority);
}

std::vector<SequenceHash> Engine::prompt_blocks(std::span<const TokenId> prompt, const HashNamespace& ns) const {
  std::vector<LocalBlockHash> locals;
  hash_blocks(prompt, cfg_.block_size, ns, locals);
  return sequence_hashes(locals);
}

uint32_t Engine::cached_prefix(std::span<const SequenceHash> blocks) const {
  uint32_t k = 0;
  for (; k < blocks.size(); ++k) {
    auto it = blocks_.find(blocks[k]);
    if (it == blocks_.end() || !it->second.computed) break;
  }
  return k;
}

const std::vector<SequenceHash>* Engine::held(uint64_t id) const {
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : &it->second;
}

bool Engine::release_held(uint64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  held_block_refs_ -= it->second.size();
  release_shared(it->second);
  held_.erase(it);
  return true;
}

const Engine::BlockInfo* Engine::block_info(SequenceHash block) const {
  auto it = blocks_.find(block);
  return it == blocks_.end() ? nullptr : it->second.info.get();
}

bool Engine::add_request_hashed(uint64_t id, uint32_t prompt_tokens, std::span<const LocalBlockHash> blocks,
                                uint32_t max_tokens, double now_ms, bool kv_transferred) {
  PdOptions pd;
  pd.kv_transferred = kv_transferred;
  return add_request_impl(id, prompt_tokens, blocks, max_tokens, now_ms, {}, true, pd);
}

bool Engine::add_request_impl(uint64_t id, uint32_t prompt_tokens, std::span<const LocalBlockHash> blocks,
                              uint32_t max_tokens, double now_ms, std::vector<std::shared_ptr<BlockInfo>> infos,
                              bool read_cache, PdOptions pd, int64_t priority) {
  if (prompt_tokens == 0 || max_tokens == 0 || requests_.count(id) || held_.count(id)) return false;
  if (static_cast<uint64_t>(blocks.size()) * cfg_.block_size > prompt_tokens) return false;
  if (blocks_needed(prompt_tokens, max_tokens) > cfg_.kv_blocks) return false;
  Request r;
  r.id = id;
  r.prompt_tokens = prompt_tokens;
  r.max_tokens = max_tokens;
  r.locals.assign(blocks.begin(), blocks.end());
  r.infos = std::move(infos);
  r.read_cache = read_cache;
  r.pd = pd;
  r.priority = priority;
  r.pd.imported_blocks = std::min<uint32_t>(pd.imported_blocks, static_cast<uint32_t>(blocks.size()));
  r.blocks = sequence_hashes(blocks);
  return enqueue(std::move(r), now_ms);
}

bool Engine::enqueue(Request r, double now_ms) {
  const uint64_t id = r.id;
  r.arrival_ms = now_ms;
  const int64_t priority = r.priority;
  requests_.emplace(id, std::move(r));
  if (cfg_.policy == SchedulingPolicy::Priority) {
    // After every waiting request of the same or a lower priority value:
    // (priority, arrival) order, as vLLM's PriorityRequestQueue pops it.
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](uint64_t w) { return requests_.at(w).priority > priority; });
    waiting_.insert(it, id);
  } else {
    waiting_.push_back(id);
  }
  if (!step_end_) start_step(now_ms);
  return true;
}

uint32_t Engine::cached_prefix_blocks(const Request& r) const {
  // A block counts once it is computed or being computed in this step (as
  // vLLM, whose attention reads KV written earlier in the same forward pass);
  // a block another request will compute in a later chunk does not.
  uint32_t k = 0;
  for (; k < r.blocks.size(); ++k) {
    auto it = blocks_.find(r.blocks[k]);
    if (it == blocks_.end() || !it->second.available) break;
  }
  return k;
}

uint32_t Engine::cached_tokens(const Request& r) const {
  if (!r.read_cache) return 0;
  return static_cast<uint32_t>(cached_prefix_tokens(cached_prefix_blocks(r), r.prompt_tokens, cfg_.block_size));
}

bool Engine::try_admit(Request& r) {
  // Blocks already present are shared, including those another running
  // request has reserved but not computed yet (this one counts them as
  // cached only once they are available; until then it computes them too).
  uint64_t missing = 0, reusable_unreferenced = 0;
  for (SequenceHash h : r.blocks) {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) ++missing;
    else reusable_unreferenced += it->second.refs == 0;
  }
  const uint64_t private_blocks = blocks_needed(r.prompt_tokens, r.max_tokens) - r.blocks.size();
  const uint64_t need = missing + private_blocks;
  const uint64_t free = cfg_.kv_blocks - std::min(cfg_.kv_blocks, used_blocks());
  const uint64_t evictable = lru_.size() - reusable_unreferenced;
  if (need > free + evictable) return false;

  const uint32_t local_hit = cached_tokens(r);  // the local prefix cache, before any import
  prefix_queries_ += r.prompt_tokens;
  prefix_hits_ += local_hit;
  for (SequenceHash h : r.blocks) {
    auto it = blocks_.find(h);
    if (it != blocks_.end() && it->second.refs++ == 0) lru_.erase(it->second.lru);
  }
  KvRemoved removed;
  while (cfg_.kv_blocks - std::min(cfg_.kv_blocks, used_blocks()) < need) {
    assert(!lru_.empty());
    const SequenceHash victim = lru_.front();
    lru_.pop_front();
    blocks_.erase(victim);  // only computed blocks are ever unreferenced
    --stored_blocks_;
    removed.block_hashes.push_back(victim);
  }
  if (!removed.block_hashes.empty()) {
    if (on_evicting_) on_evicting_(removed);
    KvEvent ev;
    ev.data = std::move(removed);
    emit(std::move(ev));
  }
  for (size_t i = 0; i < r.blocks.size(); ++i) {
    auto [it, inserted] = blocks_.try_emplace(r.blocks[i]);
    if (!inserted) continue;
    Block& b = it->second;
    b.local = r.locals[i];
    b.has_parent = i > 0;
    if (i > 0) b.parent = r.blocks[i - 1];
    b.depth = static_cast<uint32_t>(i);
    b.refs = 1;
    if (i < r.infos.size()) b.info = r.infos[i];
  }
  private_blocks_ += private_blocks;
  r.private_blocks = private_blocks;
  import_blocks(r);
  // Tokens the prefill skips: cached locally or pulled (vLLM counts both in
  // num_cached_tokens).
  r.cached_tokens = r.pd.imported_blocks ? cached_tokens(r) : local_hit;
  r.computed = r.cached_tokens;
  if (r.pd.kv_transferred) {
    // The transferred KV: every prompt token but the last is in the cache now
    // (the hit counters above keep the local hits only); the last is computed
    // in the next step, which yields the first token.
    r.computed = std::max(r.computed, r.prompt_tokens - 1);
    announce_computed(r);
  }
  return true;
}

void Engine::import_blocks(Request& r) {
  KvStored st;
  for (uint32_t i = 0; i < r.pd.imported_blocks; ++i) {
    Block& b = blocks_.at(r.blocks[i]);
    if (b.computed) {  // cached here already: not transferred, not announced again
      if (!st.blocks.empty()) {
        KvEvent ev;
        ev.data = std::move(st);
        emit(std::move(ev));
        st = KvStored{};
      }
      continue;
    }
    if (st.blocks.empty() && i > 0) st.parent = r.blocks[i - 1];
    b.computed = b.available = true;
    ++stored_blocks_;
    st.blocks.push_back({r.blocks[i], b.local});
  }
  if (!st.blocks.empty()) {
    KvEvent ev;
    ev.data = std::move(st);
    emit(std::move(ev));
  }
  r.announced = r.pd.imported_blocks;
}

void Engine::release(Request& r) {
  private_blocks_ -= r.private_blocks;
  r.private_blocks = 0;
  if (r.pd.hold && r.prefilled) {  // finished on a prefill worker: the prompt blocks wait for the pull
    held_block_refs_ += r.blocks.size();
    held_.emplace(r.id, std::move(r.blocks));
    return;
  }
  release_shared(r.blocks);
}

void Engine::release_shared(std::span<const SequenceHash> blocks) {
  // Tail first, so the tail of a prompt is evicted before its head.
  for (auto h = blocks.rbegin(); h != blocks.rend(); ++h) {
    auto it = blocks_.find(*h);
    assert(it != blocks_.end() && it->second.refs > 0);
    Block& b = it->second;
    if (--b.refs > 0) continue;
    if (b.computed) {
      lru_.push_back(*h);
      b.lru = std::prev(lru_.end());
    } else {
      blocks_.erase(it);  // cancelled during its prefill: never computed, never announced
    }
  }
}

bool Engine::cancel(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request& r = it->second;
  if (r.running) {
    r.pd.hold = false;  // an aborted request frees its blocks at once (vLLM returns no transfer params)
    release(r);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  requests_.erase(it);
  return true;
}

void Engine::schedule_chunk(Request& r, uint32_t n, StepShape& shape) {
  shape.add_chunk(n, r.computed);
  r.scheduled = n;
  // Blocks this chunk completes are available to requests scheduled after it.
  const size_t done = std::min<size_t>(r.blocks.size(), (r.computed + n) / cfg_.block_size);
  for (size_t i = 0; i < done; ++i) blocks_.at(r.blocks[i]).available = true;
}

// vLLM V1's Scheduler.schedule() (vllm/v1/core/sched/scheduler.py, commit
// 00024d3): one token budget per step; the RUNNING requests first, in order,
// each taking min(its remaining tokens, the budget left), then the WAITING
// ones, FIFO, each chunked the same way. Because a prefill that does not
// finish in a step has taken all the budget left, every request behind it in
// the running order was admitted later: decodes are never starved by it and
// in effect go first. No preemption here: a request's blocks are all reserved
// when it is admitted (try_admit), so a running request always has room.
void Engine::start_step(double now_ms) {
  StepShape shape;
  uint64_t budget = cfg_.max_batched_tokens;
  for (uint64_t id : running_) {
    Request& r = requests_.at(id);
    r.scheduled = 0;
    if (budget == 0) continue;
    if (r.prefilled) {
      shape.add_decode(uint64_t{r.prompt_tokens} + r.generated);
      r.scheduled = 1;
      budget -= 1;
    } else {
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(r.prompt_tokens - r.computed, budget));
      schedule_chunk(r, n, shape);
      budget -= n;
    }
  }
  while (!waiting_.empty() && running_.size() < cfg_.max_seqs && budget > 0) {
    Request& r = requests_.at(waiting_.front());
    // A caller may add a request at a time later than the end of a step it
    // has not advanced past yet (kvroute-mocker's timer fires late on a busy
    // host): that step and any before the arrival run without it, as a step
    // a real engine has begun does not take in a request that arrives during it.
    if (r.arrival_ms > now_ms) break;
    if (!try_admit(r)) break;  // the head waits for space
    r.running = true;
    r.scheduled_ms = now_ms;
    running_.push_back(r.id);
    waiting_.pop_front();
    // At least the last token is computed: a fully cached block-aligned
    // prompt recomputes its last block.
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(r.prompt_tokens - r.computed, budget));
    schedule_chunk(r, n, shape);
    budget -= n;
  }
  if (shape.empty()) {
    step_end_.reset();
    // Idle until the head of the queue arrives: its step starts then.
    if (!waiting_.empty() && running_.empty()) {
      const double arrival = requests_.at(waiting_.front()).arrival_ms;
      if (arrival > now_ms) start_step(arrival);
    }
    return;
  }
  shape.kv_occupancy = static_cast<double>(load().kv_active_blocks) / static_cast<double>(cfg_.kv_blocks);
  step_end_ = now_ms + cfg_.profile.step_ms(shape);
}

void Engine::announce_computed(Request& r) {
  // Each run of consecutive newly computed blocks is one chain under its parent.
  const size_t done = std::min<size_t>(r.blocks.size(), r.computed / cfg_.block_size);
  KvStored st;
  auto flush = [&] {
    if (st.blocks.empty()) return;
    KvEvent ev;
    ev.data = std::move(st);
    emit(std::move(ev));
    st = KvStored{};
  };
  for (size_t i = r.announced; i < done; ++i) {
    Block& b = blocks_.at(r.blocks[i]);
    if (b.computed) {
      flush();
      continue;
    }
    if (st.blocks.empty() && i > 0) st.parent = r.blocks[i - 1];
    b.computed = b.available = true;
    ++stored_blocks_;
    st.blocks.push_back({r.blocks[i], b.local});
  }
  flush();
  r.announced = static_cast<uint32_t>(done);
}

std::vector<EngineOutput> Engine::advance_to(double now_ms) {
  std::vector<EngineOutput> out;
  std::vector<uint64_t> done;
  while (step_end_ && *step_end_ <= now_ms) {
    const double end = *step_end_;
    done.clear();
    for (uint64_t id : running_) {
      Request& r = requests_.at(id);
      if (r.scheduled == 0) continue;
      if (!r.prefilled) {
        r.computed += r.scheduled;
        announce_computed(r);
        if (r.computed < r.prompt_tokens) continue;  // more chunks to come
        r.prefilled = true;
        r.generated = 1;
        out.push_back({id, EngineOutput::Kind::FirstToken, end, r.cached_tokens, r.prompt_tokens,
                       std::max(0.0, r.scheduled_ms - r.arrival_ms)});
      } else {
        r.generated += 1;
        out.push_back({id, EngineOutput::Kind::Token, end, 0, 0});
      }
      if (r.generated >= r.max_tokens) {
        out.push_back({id, EngineOutput::Kind::Finished, end, 0, 0});
        release(r);
        done.push_back(id);
      }
    }
    if (!done.empty()) {
      std::erase_if(running_, [&](uint64_t id) { return std::find(done.begin(), done.end(), id) != done.end(); });
      for (uint64_t id : done) requests_.erase(id);
    }
    start_step(end);
  }
  return out;
}

WorkerLoad Engine::load() const {
  WorkerLoad l;
  l.request_active_slots = static_cast<uint32_t>(running_.size());
  l.request_total_slots = cfg_.max_seqs;
  l.num_requests_waiting = static_cast<uint32_t>(waiting_.size());
  l.kv_active_blocks = blocks_.size() - lru_.size() + private_blocks_;
  l.kv_total_blocks = cfg_.kv_blocks;
  return l;
}

std::vector<KvEvent> Engine::dump() const {
  std::vector<std::pair<uint32_t, SequenceHash>> order;
  order.reserve(stored_blocks_);
  for (const auto& [h, b] : blocks_)
    if (b.computed) order.emplace_back(b.depth, h);
  std::sort(order.begin(), order.end());
  std::vector<KvEvent> out;
  out.reserve(order.size());
  for (const auto& [depth, h] : order) {
    const Block& b = blocks_.at(h);
    KvStored st;
    if (b.has_parent) st.parent = b.parent;
    st.blocks.push_back({h, b.local});
    KvEvent ev;
    ev.owner = cfg_.owner;
    ev.tier = cfg_.tier;
    ev.data = std::move(st);
    out.push_back(std::move(ev));
  }
  return out;
}

}  // namespace kvroute::mocker
