#include "mocker/engine.h"

#include <algorithm>

#include "indexer/block_hash.h"

namespace kvroute::mocker {

Engine::Engine(EngineConfig cfg, std::function<void(const KvEvent&)> on_event)
    : cfg_(cfg), on_event_(std::move(on_event)) {}

double Engine::prefill_ms(double t) const { return cfg_.prefill_a * t * t + cfg_.prefill_b * t + cfg_.prefill_c; }

double Engine::decode_ms() const {
  const double used = static_cast<double>(blocks_.size() - lru_.size() + anon_blocks_);
  return cfg_.decode_base_ms + cfg_.decode_kv_ms * (cfg_.kv_blocks ? used / static_cast<double>(cfg_.kv_blocks) : 0);
}

uint64_t Engine::blocks_needed(size_t prompt_tokens, uint32_t max_tokens) const {
  const uint64_t bs = cfg_.block_size;
  return (prompt_tokens + max_tokens + bs - 1) / bs;
}

void Engine::emit(KvEvent ev) {
  ev.owner = cfg_.owner;
  ev.tier = cfg_.tier;
  ev.event_id = ++event_id_;
  if (on_event_) on_event_(ev);
}

bool Engine::add_request(uint64_t id, std::vector<TokenId> prompt, uint32_t max_tokens, double now_ms) {
  if (prompt.empty() || max_tokens == 0 || blocks_needed(prompt.size(), max_tokens) > cfg_.kv_blocks) return false;
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  waiting_.push_back(std::move(r));
  if (!step_end_) start_step(now_ms);
  return true;
}

bool Engine::try_admit(Request& r) {
  const uint32_t bs = cfg_.block_size;
  const auto locals = hash_blocks(r.prompt, bs);
  std::vector<SequenceHash> seq;
  seq.reserve(locals.size());
  SequenceHash parent{0};
  for (auto h : locals) seq.push_back(parent = sequence_hash(parent, h));
  // The cached prefix counts as a hit; blocks cached beyond a missing one are
  // reused too (no new space) but still sit after a recomputed block.
  size_t k = 0;
  while (k < seq.size() && blocks_.count(seq[k].value)) ++k;
  uint64_t missing = 0, present_unreferenced = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    auto it = blocks_.find(seq[i].value);
    if (it == blocks_.end()) ++missing;
    else present_unreferenced += it->second.refs == 0;
  }
  const uint64_t extra = blocks_needed(r.prompt.size(), r.max_tokens) - seq.size();
  const uint64_t need = missing + extra;
  const uint64_t used = blocks_.size() + anon_blocks_;
  const uint64_t free = cfg_.kv_blocks > used ? cfg_.kv_blocks - used : 0;
  if (need > free + lru_.size() - present_unreferenced) return false;

  for (size_t i = 0; i < seq.size(); ++i) {
    auto it = blocks_.find(seq[i].value);
    if (it != blocks_.end() && it->second.refs++ == 0) lru_.erase(it->second.lru);
  }
  // Evict least recently used unreferenced blocks until the new ones fit.
  KvRemoved removed;
  while (cfg_.kv_blocks - std::min<uint64_t>(cfg_.kv_blocks, blocks_.size() + anon_blocks_) < need) {
    const SequenceHash victim = lru_.front();
    lru_.pop_front();
    blocks_.erase(victim.value);
    removed.block_hashes.push_back(victim);
  }
  if (!removed.block_hashes.empty()) {
    KvEvent ev;
    ev.data = std::move(removed);
    emit(std::move(ev));
  }
  for (size_t i = 0; i < seq.size(); ++i) {
    if (blocks_.count(seq[i].value)) continue;
    Block b;
    b.local = locals[i];
    b.has_parent = i > 0;
    if (i > 0) b.parent = seq[i - 1];
    b.depth = static_cast<uint32_t>(i);
    b.refs = 1;
    blocks_.emplace(seq[i].value, b);
  }
  anon_blocks_ += extra;
  r.blocks = std::move(seq);
  r.extra_blocks = extra;
  r.cached_tokens = static_cast<uint32_t>(k * bs);
  return true;
}

void Engine::release(Request& r) {
  for (SequenceHash h : r.blocks) {
    auto it = blocks_.find(h.value);
    if (it == blocks_.end()) continue;
    Block& b = it->second;
    if (--b.refs > 0) continue;
    if (b.computed) {
      lru_.push_back(h);
      b.lru = std::prev(lru_.end());
    } else {
      blocks_.erase(it);  // never computed: nothing cached, nothing to announce
    }
  }
  anon_blocks_ -= std::min(anon_blocks_, r.extra_blocks);
  r.blocks.clear();
  r.extra_blocks = 0;
}

bool Engine::cancel(uint64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->id == id) {
      waiting_.erase(it);
      return true;
    }
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->id == id) {
      release(*it);
      running_.erase(it);
      return true;
    }
  }
  return false;
}

void Engine::start_step(double now_ms) {
  step_admitted_.clear();
  step_decoding_.clear();
  for (const auto& r : running_)
    if (r.prefilled) step_decoding_.push_back(r.id);
  uint64_t t = 0;
  while (!waiting_.empty() && running_.size() < cfg_.max_seqs) {
    Request& r = waiting_.front();
    // The new tokens are only known after the cache lookup in try_admit;
    // estimate with the whole prompt to respect the batch budget.
    if (!step_admitted_.empty() && t + r.prompt.size() > cfg_.max_batched_tokens) break;
    if (!try_admit(r)) break;  // FIFO: the head waits for space
    t += std::max<uint64_t>(1, r.prompt.size() - std::min<uint64_t>(r.prompt.size(), r.cached_tokens));
    step_admitted_.push_back(r.id);
    running_.push_back(std::move(r));
    waiting_.pop_front();
  }
  if (step_admitted_.empty() && step_decoding_.empty()) {
    step_end_.reset();
    return;
  }
  double ms = 0;
  if (t > 0) ms += prefill_ms(static_cast<double>(t));
  if (!step_decoding_.empty()) ms += decode_ms();
  step_end_ = now_ms + ms;
}

std::vector<EngineOutput> Engine::advance_to(double now_ms) {
  std::vector<EngineOutput> out;
  while (step_end_ && *step_end_ <= now_ms) {
    const double end = *step_end_;
    auto find = [&](uint64_t id) -> Request* {
      for (auto& r : running_)
        if (r.id == id) return &r;
      return nullptr;  // cancelled meanwhile
    };
    auto finish_if_done = [&](Request& r) {
      if (r.generated < r.max_tokens) return false;
      out.push_back({r.id, EngineOutput::Kind::Finished, 0, 0});
      release(r);
      return true;
    };
    std::vector<uint64_t> done;
    for (uint64_t id : step_admitted_) {
      Request* r = find(id);
      if (!r) continue;
      // The prompt's new blocks are computed now: announce each run of
      // consecutive new blocks as one chain under its parent.
      KvStored st;
      auto flush = [&] {
        if (st.blocks.empty()) return;
        KvEvent ev;
        ev.data = std::move(st);
        emit(std::move(ev));
        st = KvStored{};
      };
      for (size_t i = 0; i < r->blocks.size(); ++i) {
        Block& b = blocks_[r->blocks[i].value];
        if (b.computed) {
          flush();
          continue;
        }
        if (st.blocks.empty() && i > 0) st.parent = r->blocks[i - 1];
        b.computed = true;
        st.blocks.push_back({r->blocks[i], b.local});
      }
      flush();
      r->prefilled = true;
      r->generated = 1;
      out.push_back({r->id, EngineOutput::Kind::FirstToken, r->cached_tokens,
                     static_cast<uint32_t>(r->prompt.size())});
      if (finish_if_done(*r)) done.push_back(r->id);
    }
    for (uint64_t id : step_decoding_) {
      Request* r = find(id);
      if (!r) continue;
      r->generated += 1;
      out.push_back({r->id, EngineOutput::Kind::Token, 0, 0});
      if (finish_if_done(*r)) done.push_back(r->id);
    }
    std::erase_if(running_, [&](const Request& r) {
      return std::find(done.begin(), done.end(), r.id) != done.end();
    });
    start_step(end);
  }
  return out;
}

EngineLoad Engine::load() const {
  EngineLoad l;
  l.request_active_slots = static_cast<uint32_t>(running_.size());
  l.request_total_slots = cfg_.max_seqs;
  l.num_requests_waiting = static_cast<uint32_t>(waiting_.size());
  l.kv_active_blocks = blocks_.size() - lru_.size() + anon_blocks_;
  l.kv_total_blocks = cfg_.kv_blocks;
  return l;
}

std::vector<KvEvent> Engine::dump() const {
  std::vector<std::pair<uint32_t, uint64_t>> order;
  for (const auto& [h, b] : blocks_)
    if (b.computed) order.emplace_back(b.depth, h);
  std::sort(order.begin(), order.end());
  std::vector<KvEvent> out;
  out.reserve(order.size());
  for (const auto& [depth, h] : order) {
    const Block& b = blocks_.at(h);
    KvStored st;
    if (b.has_parent) st.parent = b.parent;
    st.blocks.push_back({SequenceHash{h}, b.local});
    KvEvent ev;
    ev.owner = cfg_.owner;
    ev.tier = cfg_.tier;
    ev.data = std::move(st);
    out.push_back(std::move(ev));
  }
  return out;
}

}  // namespace kvroute::mocker
