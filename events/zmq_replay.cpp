// ZmqEventSource::Impl (zmq_source_impl.h): sequence tracking, in-order apply,
// first-sight and gap replays, engine restarts, the byte budget of held frames.
#include "events/zmq_source_impl.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/log.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute {

// Adds (`on`) or removes partial reasons; the owner is partial while any is set.
void ZmqEventSource::Impl::set_marks(Publisher& p, uint32_t bits, bool on) {
  const uint32_t marks = on ? (p.marks | bits) : (p.marks & ~bits);
  const bool was = p.marks != 0, is = marks != 0;
  p.marks = marks;
  if (was == is) return;
  std::lock_guard lk(mu);
  if (is) partial.insert(p.owner);
  else partial.erase(p.owner);
  stats().partial_owners.store(partial.size(), std::memory_order_relaxed);
}

// Frames held per worker share zmq.max_held_bytes; over it a frame is
// dropped (counted) and the owner is behind until a replay brings it again.
bool ZmqEventSource::Impl::hold(Publisher& p, uint64_t seq, std::string&& payload) {
  if (p.held.count(seq)) return true;
  if (*p.held_bytes + payload.size() > cfg.max_held_bytes) {
    stats().held_dropped_total.fetch_add(1, std::memory_order_relaxed);
    stats().held_dropped_bytes_total.fetch_add(payload.size(), std::memory_order_relaxed);
    p.budget_dropped = true;
    set_marks(p, kBehind, true);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: frame {} ({} bytes) dropped: the worker's frames held reach "
                   "zmq.max_held_bytes; it is replayed later",
                   p.owner.worker.value, p.owner.dp_rank, seq, payload.size());
    return false;
  }
  *p.held_bytes += payload.size();
  stats().held_bytes.fetch_add(payload.size(), std::memory_order_relaxed);
  p.held.emplace(seq, std::move(payload));
  return true;
}

void ZmqEventSource::Impl::unhold(Publisher& p, std::map<uint64_t, std::string>::iterator it) {
  *p.held_bytes -= it->second.size();
  stats().held_bytes.fetch_sub(it->second.size(), std::memory_order_relaxed);
  p.held.erase(it);
}

void ZmqEventSource::Impl::unhold_all(Publisher& p) {
  while (!p.held.empty()) unhold(p, p.held.begin());
}

void ZmqEventSource::Impl::give_up_gap(Publisher& p, const char* why) {
  stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
  set_partial(p, true);
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("zmq: worker {} rank {}: KV events {}..{} lost ({}); its index is partial", p.owner.worker.value,
                 p.owner.dp_rank, p.next.value_or(0), p.held.empty() ? 0 : p.held.begin()->first - 1, why);
  p.next = p.held.empty() ? p.next : std::optional<uint64_t>(p.held.begin()->first);
  p.failures = 0;
  p.gap_counted = false;
}

void ZmqEventSource::Impl::warn_block_size(const Publisher& p, const VllmEventBatch& batch, uint64_t skipped) {
  static RateLimiter rl;
  if (!rl.allow()) return;
  for (const VllmEvent& e : batch.events) {
    const auto* s = std::get_if<VllmBlockStored>(&e);
    if (!s || s->block_size == block_size) continue;
    if (vllm_announces_copies(*s)) {
      spdlog::warn("zmq: worker {} rank {}: {} KV events skipped: copies in medium {} of block_size {}, not "
                   "indexer.block_size {}; the engine's {} copies are not indexed (give its offloading connector "
                   "the engine's block size)",
                   p.owner.worker.value, p.owner.dp_rank, skipped, s->medium, s->block_size, block_size, s->medium);
    } else {
      spdlog::warn("zmq: worker {} rank {}: {} KV events skipped: block_size {}, not indexer.block_size {}; this "
                   "worker's cache is not indexed (set indexer.block_size to the engine's vLLM --block-size / "
                   "SGLang --page-size)",
                   p.owner.worker.value, p.owner.dp_rank, skipped, s->block_size, block_size);
    }
    return;
  }
}

void ZmqEventSource::Impl::apply(Publisher& p, uint64_t seq, const std::string& payload) {
  p.last_applied_seq = seq;
  p.last_applied_hash = XXH3_64bits(payload.data(), payload.size());
  std::string detail;
  const auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  const DecodeError e = decode_vllm_batch(bytes, limits, batch, &detail);
  if (e != DecodeError::None) {
    stats().rejected_total[static_cast<size_t>(e)].fetch_add(1, std::memory_order_relaxed);
    set_partial(p, true);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: KV event batch rejected ({}: {}); its index is partial",
                   p.owner.worker.value, p.owner.dp_rank, to_string(e), detail);
    return;
  }
  batch.data_parallel_rank.reset();  // the endpoint says which rank this is
  events.clear();
  skipped.fill(0);
  to_kv_events(batch, p.owner, block_size, events, &skipped, &p.groups, salts);
  for (size_t i = 1; i < skipped.size(); ++i)
    if (skipped[i]) stats().skipped_total[i].fetch_add(skipped[i], std::memory_order_relaxed);
  if (const uint64_t n = skipped[static_cast<size_t>(VllmSkip::BlockSizeMismatch)]) warn_block_size(p, batch, n);
  if (events.empty()) return;
  uint64_t blocks = 0;
  for (const auto& ev : events)
    if (auto* s = std::get_if<KvStored>(&ev.data)) blocks += s->blocks.size();
  const size_t n = events.size();
  if (!sink(std::move(events))) {
    stats().sink_refused_total.fetch_add(1, std::memory_order_relaxed);
    set_partial(p, true);
  } else {
    stats().batches_applied_total.fetch_add(1, std::memory_order_relaxed);
    stats().events_total.fetch_add(n, std::memory_order_relaxed);
    stats().blocks_stored_total.fetch_add(blocks, std::memory_order_relaxed);
  }
  events = {};
}

void ZmqEventSource::Impl::request_replay(Publisher& p, uint64_t from, Clock::time_point now) {
  if (p.inflight || now < p.next_replay_at) return;
  uint8_t be[8];
  for (int i = 0; i < 8; ++i) be[i] = static_cast<uint8_t>(from >> (56 - 8 * i));
  bool sent = false;
  try {
    sent = p.dealer_up &&
           p.dealer->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait).has_value() &&
           p.dealer->send(zmq::buffer(be, 8), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    sent = false;
  }
  p.next_replay_at = now + std::chrono::milliseconds(std::max(cfg.replay_min_interval_ms, p.backoff_ms));
  if (!sent) {
    // Not connected (no handshake yet). An engine that is down has nothing to
    // say either: retry at the rate limit. Only with frames waiting (its
    // PUB answers, its replay socket does not) is this a failed attempt.
    if (!p.held.empty()) replay_failed(p, now);
    return;
  }
  stats().replay_requests_total.fetch_add(1, std::memory_order_relaxed);
  p.inflight = true;
  p.got_reply = false;
  p.verify_seen = false;
  p.replay_deadline = now + std::chrono::milliseconds(cfg.replay_timeout_ms);
}

void ZmqEventSource::Impl::replay_failed(Publisher& p, Clock::time_point now) {
  // A request that went out may still be answered late, or half: a fresh
  // socket drops both (and any request still queued on the old one).
  if (p.inflight) reopen_dealer(p);
  p.inflight = false;
  ++p.failures;
  p.backoff_ms = std::min(cfg.replay_max_backoff_ms, std::max(cfg.replay_min_interval_ms, p.backoff_ms * 2));
  p.next_replay_at = now + std::chrono::milliseconds(p.backoff_ms);
  if (p.syncing && p.failures >= cfg.replay_attempts) {
    // The engine does not answer replays: go live with what arrives, and
    // say that what came before is unknown.
    p.syncing = false;
    stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
    set_partial(p, true);
    p.failures = 0;
  }
}

// Applies held frames in order; asks for a replay at a gap, or gives it up.
void ZmqEventSource::Impl::process(Publisher& p, Clock::time_point now) {
  if (p.syncing) {
    if (!p.inflight) request_replay(p, 0, now);
    if (p.syncing && p.held.size() <= cfg.max_pending_frames) return;
    if (p.syncing) {  // held too much while waiting: give the start up
      p.syncing = false;
      p.inflight = false;
      stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
      set_partial(p, true);
    }
  }
  while (!p.held.empty()) {
    auto it = p.held.begin();
    if (!p.next) {
      // Joined without a replay: what came before the first frame is unknown.
      if (it->first > 0) set_partial(p, true);
      p.next = it->first;
    }
    if (it->first < *p.next) {
      stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
      unhold(p, it);
      continue;
    }
    if (it->first == *p.next) {
      apply(p, it->first, it->second);
      unhold(p, it);
      p.next = *p.next + 1;
      p.failures = 0;
      p.gap_counted = false;
      continue;
    }
    // A gap before the held frames.
    if (!p.gap_counted) {
      stats().gaps_total.fetch_add(1, std::memory_order_relaxed);
      p.gap_counted = true;
    }
    if (can_replay(p) && p.held.size() <= cfg.max_pending_frames) {
      const bool verify = p.last_applied_seq && *p.last_applied_seq + 1 == *p.next;
      request_replay(p, verify ? *p.next - 1 : *p.next, now);
      return;  // wait for the replay (or its timeout)
    }
    give_up_gap(p, p.dealer ? "replay failed or too many frames held" : "no replay endpoint");
  }
}

// A new engine incarnation: its blocks start empty and its seq at 0.
void ZmqEventSource::Impl::restart(Publisher& p) {
  std::vector<KvEvent> clear(1);  // the tier, id and medium of a clear mean nothing
  clear[0].owner = p.owner;
  clear[0].data = KvCleared{};
  sink(std::move(clear));
  if (salts) salts->cleared(p.owner);
  p.groups = {};
  p.next = 0;
  p.last_applied_seq.reset();
  p.last_live.reset();  // the new incarnation's seqs are below the old ones
  p.restart_seen = false;
  p.verifying = false;
  p.verify_pending = false;
  p.inflight = false;
  p.failures = 0;
  p.backoff_ms = 0;
  p.next_replay_at = {};
  p.gap_counted = false;
  set_partial(p, false);
}

void ZmqEventSource::Impl::on_live(Publisher& p, uint64_t seq, std::string&& payload, Clock::time_point now) {
  stats().frames_total.fetch_add(1, std::memory_order_relaxed);
  stats().bytes_total.fetch_add(payload.size(), std::memory_order_relaxed);
  if (p.last_live && seq <= *p.last_live) {
    // Live frames of one publisher arrive in order: a smaller seq is a new
    // engine incarnation. Its blocks are gone; its history starts at 0.
    stats().restarts_total.fetch_add(1, std::memory_order_relaxed);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: seq went back from {} to {}: engine restarted, its blocks dropped",
                   p.owner.worker.value, p.owner.dp_rank, *p.last_live, seq);
    unhold_all(p);
    restart(p);
  }
  p.last_live = seq;
  if (p.next && seq < *p.next) {  // already applied through a replay
    stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  hold(p, seq, std::move(payload));
  process(p, now);
}

void ZmqEventSource::Impl::on_replay_frame(Publisher& p, std::array<zmq::message_t, kMaxParts>& f, size_t parts,
                                          Clock::time_point now) {
  size_t i = 0;
  if (parts > 0 && f[0].size() == 0) ++i;  // the DEALER's empty delimiter
  const size_t n = parts > kMaxParts ? 0 : parts - i;
  if (n != 2 && n != 3) {  // [seq, payload] or [topic, seq, payload]
    stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const zmq::message_t& seqf = f[i + n - 2];
  if (seqf.size() != 8) {
    stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t seq = read_be64(seqf);
  if (seq == kEndSeq) {
    if (p.inflight) end_replay(p, now);
    return;
  }
  stats().replay_frames_total.fetch_add(1, std::memory_order_relaxed);
  if (p.inflight && !p.got_reply) p.first_reply = seq;
  p.got_reply = p.got_reply || p.inflight;
  const zmq::message_t& payload = f[i + n - 1];
  if (p.last_applied_seq && seq == *p.last_applied_seq) {
    p.verify_seen = true;
    if (XXH3_64bits(payload.data(), payload.size()) != p.last_applied_hash)
      p.restart_seen = true;  // the engine's batch at our last seq is another one
  }
  if (p.next && seq < *p.next) {
    stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  hold(p, seq, payload.to_string());
}

void ZmqEventSource::Impl::end_replay(Publisher& p, Clock::time_point now) {
  p.inflight = false;
  p.failures = 0;
  p.backoff_ms = 0;
  if (p.verifying) {
    // The engine no longer has the newest batch we applied (it had it when
    // it sent it, and it is the last to be forgotten): a new incarnation.
    p.verifying = false;
    if (!p.verify_seen) p.restart_seen = true;
  }
  // This replay started at the last applied batch and found it unchanged:
  // everything the engine published after it came in this answer.
  const bool continuity = p.verify_seen && !p.restart_seen;
  const bool budget_dropped = p.budget_dropped;
  p.budget_dropped = false;
  if (p.restart_seen) {
    // Seq overtook ours during a disconnect: a new incarnation. Its frames
    // held so far are valid; its history from 0 is replayed next, as at
    // first sight: the live frames it published while we were disconnected
    // may all have been applied already (then nothing held shows a gap, and
    // an engine that publishes nothing more would stay missing).
    stats().restarts_total.fetch_add(1, std::memory_order_relaxed);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: the engine's batch {} differs from the one applied: engine restarted, "
                   "its blocks dropped",
                   p.owner.worker.value, p.owner.dp_rank, p.last_applied_seq.value_or(0));
    restart(p);
    p.syncing = p.dealer.has_value();
  } else if (p.syncing) {
    p.syncing = false;
    if (!p.got_reply) {
      // Nothing buffered: the engine has published nothing yet (or only
      // what arrives live from now on). Start at the first held frame;
      // one after 0 is a gap that the next replay fills.
      p.next = 0;
    } else {
      if (p.first_reply > 0) {
        // The engine's buffer no longer starts at 0: older blocks unknown.
        stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
        set_partial(p, true);
      }
      p.next = p.first_reply;
    }
  } else if (budget_dropped) {
    // Part of the answer did not fit the byte budget: apply what did, then
    // ask again from there (process); no progress at all counts as a failure.
    const auto before = p.next;
    process(p, now);
    if (p.next == before && !p.held.empty()) ++p.failures;
    return;
  } else if (p.next && !p.held.empty() && p.held.begin()->first > *p.next) {
    give_up_gap(p, "the engine's replay buffer no longer has them");
  }
  process(p, now);
  if ((p.marks & kBehind) && continuity && p.held.empty() && !p.budget_dropped && !p.inflight &&
      !p.verify_pending && !p.resubscribe_at) {
    // Reconnected (or dropped frames over the budget), and a replay since
    // brought everything after our last batch: nothing is missing.
    set_marks(p, kBehind, false);
    p.resubscribe_backoff_ms = 0;
  }
}

void ZmqEventSource::Impl::tick(Clock::time_point now) {
  for (auto& [id, w] : workers)
    for (auto& p : w.pubs) {
      if (p->resubscribe_at && now >= *p->resubscribe_at) resubscribe(*p);
      if (p->inflight && now >= p->replay_deadline) {
        stats().replay_timeouts_total.fetch_add(1, std::memory_order_relaxed);
        replay_failed(*p, now);
      }
      if (!p->inflight && (p->syncing || !p->held.empty())) process(*p, now);
      if (p->verify_pending && !p->inflight && !p->syncing) {
        if (!p->dealer || !p->last_applied_seq) {
          // Nothing to compare (restarts then show as seq going back); a
          // loss shows as a gap at the next frame (replayed, or partial).
          p->verify_pending = false;
          set_marks(*p, kBehind, false);
        } else {
          request_replay(*p, *p->last_applied_seq, now);
          if (p->inflight) {
            p->verify_pending = false;
            p->verifying = true;
            p->verify_seen = false;
          }
        }
      }
    }
}

void ZmqEventSource::Impl::drain_dealer(Publisher& p, Clock::time_point now) {
  std::array<zmq::message_t, kMaxParts> f;
  size_t n = 0;
  bool torn = false;
  for (size_t k = 0; k < 4 * kMaxFramesPerWake && p.dealer; ++k) {
    if (!recv_message(*p.dealer, f, n, torn)) return;
    if (torn) {
      stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
      if (p.inflight) replay_failed(p, now);
      else reopen_dealer(p);
      return;
    }
    on_replay_frame(p, f, n, now);
  }
}

}  // namespace kvroute
