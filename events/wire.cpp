#include "events/wire.h"

#include <fmt/format.h>
#include <simdjson.h>

#include "common/json_escape.h"
#include "indexer/block_hash.h"

namespace kvroute {

namespace dom = simdjson::dom;

std::string_view to_string(DecodeError e) {
  switch (e) {
    case DecodeError::None: return "none";
    case DecodeError::Json: return "json";
    case DecodeError::MissingField: return "missing_field";
    case DecodeError::WrongType: return "wrong_type";
    case DecodeError::UnknownTier: return "unknown_tier";
    case DecodeError::TooLarge: return "too_large";
    case DecodeError::BadEvent: return "bad_event";
  }
  return "none";
}

namespace {

// Decoding context: the first error wins and names the field.
struct Ctx {
  DecodeError err = DecodeError::None;
  std::string* detail;
  const DecodeLimits* limits;
  bool fail(DecodeError e, std::string_view field) {
    if (err == DecodeError::None) {
      err = e;
      if (detail) *detail = std::string(field);
    }
    return false;
  }
};

// A u64 that engines may send as unsigned or as signed int64 (Python hashes
// are signed); negative values are taken as their two's complement bits.
bool get_u64_bits(dom::element v, uint64_t& out) {
  if (v.is_uint64()) { out = v.get_uint64().value_unsafe(); return true; }
  if (v.is_int64()) { out = static_cast<uint64_t>(v.get_int64().value_unsafe()); return true; }
  return false;
}

// A non-negative integer that fits `Max`.
template <class T>
bool get_uint(dom::element v, T& out) {
  if (!v.is_uint64()) return false;
  uint64_t x = v.get_uint64().value_unsafe();
  if (x > std::numeric_limits<T>::max()) return false;
  out = static_cast<T>(x);
  return true;
}

bool field(Ctx& c, dom::object o, std::string_view key, dom::element& out, bool required) {
  auto r = o.at_key(key);
  if (r.error()) return required ? c.fail(DecodeError::MissingField, key) : false;
  out = r.value_unsafe();
  if (out.is_null()) return required ? c.fail(DecodeError::MissingField, key) : false;
  return true;
}

bool decode_stored(Ctx& c, dom::object stored, KvEvent& ev) {
  KvStored s;
  dom::element v;
  if (field(c, stored, "parent_hash", v, false)) {
    uint64_t p;
    if (!get_u64_bits(v, p)) return c.fail(DecodeError::WrongType, "parent_hash");
    s.parent = SequenceHash{p};
  } else if (c.err != DecodeError::None) {
    return false;
  }
  uint64_t seed = kDefaultBlockHashSeed;
  if (field(c, stored, "lora_name", v, false)) {
    if (!v.is_string()) return c.fail(DecodeError::WrongType, "lora_name");
    seed = block_hash_seed(v.get_string().value_unsafe());
  }
  if (!field(c, stored, "blocks", v, true)) return false;
  if (!v.is_array()) return c.fail(DecodeError::WrongType, "blocks");
  dom::array blocks = v.get_array().value_unsafe();
  if (blocks.size() > c.limits->max_blocks_per_event) return c.fail(DecodeError::TooLarge, "blocks");
  s.blocks.reserve(blocks.size());
  std::vector<TokenId> tokens;
  for (dom::element b : blocks) {
    if (!b.is_object()) return c.fail(DecodeError::WrongType, "blocks[]");
    dom::object bo = b.get_object().value_unsafe();
    StoredBlock sb;
    if (!field(c, bo, "block_hash", v, true)) return false;
    if (!get_u64_bits(v, sb.block_hash.value)) return c.fail(DecodeError::WrongType, "block_hash");
    if (field(c, bo, "tokens_hash", v, false)) {
      if (!get_u64_bits(v, sb.tokens_hash.value)) return c.fail(DecodeError::WrongType, "tokens_hash");
    } else if (field(c, bo, "token_ids", v, false)) {
      if (!v.is_array()) return c.fail(DecodeError::WrongType, "token_ids");
      dom::array ids = v.get_array().value_unsafe();
      if (ids.size() == 0 || ids.size() > 65536) return c.fail(DecodeError::TooLarge, "token_ids");
      tokens.clear();
      for (dom::element t : ids) {
        TokenId id;
        if (!get_uint(t, id)) return c.fail(DecodeError::WrongType, "token_ids[]");
        tokens.push_back(id);
      }
      sb.tokens_hash = hash_block(tokens, seed);
    } else {
      return c.fail(DecodeError::MissingField, "tokens_hash");
    }
    s.blocks.push_back(sb);
  }
  ev.data = std::move(s);
  return true;
}

bool decode_removed(Ctx& c, dom::object removed, KvEvent& ev) {
  dom::element v;
  if (!field(c, removed, "block_hashes", v, true)) return false;
  if (!v.is_array()) return c.fail(DecodeError::WrongType, "block_hashes");
  dom::array arr = v.get_array().value_unsafe();
  if (arr.size() > c.limits->max_blocks_per_event) return c.fail(DecodeError::TooLarge, "block_hashes");
  KvRemoved r;
  r.block_hashes.reserve(arr.size());
  for (dom::element h : arr) {
    uint64_t x;
    if (!get_u64_bits(h, x)) return c.fail(DecodeError::WrongType, "block_hashes[]");
    r.block_hashes.push_back(SequenceHash{x});
  }
  ev.data = std::move(r);
  return true;
}

// One RouterEvent: {"worker_id", "storage_tier"?, "event": {"event_id"?, "dp_rank"?, "data"}}.
// `require_worker` is false inside a resync dump, whose owner is given once.
bool decode_router_event(Ctx& c, dom::element root, KvEvent& ev, bool require_worker) {
  if (!root.is_object()) return c.fail(DecodeError::WrongType, "event object");
  dom::object o = root.get_object().value_unsafe();
  dom::element v;
  if (field(c, o, "worker_id", v, require_worker)) {
    if (!get_uint(v, ev.owner.worker.value)) return c.fail(DecodeError::WrongType, "worker_id");
  } else if (c.err != DecodeError::None) {
    return false;
  }
  if (field(c, o, "storage_tier", v, false)) {
    if (!v.is_string()) return c.fail(DecodeError::WrongType, "storage_tier");
    if (!parse_storage_tier(v.get_string().value_unsafe(), ev.tier)) return c.fail(DecodeError::UnknownTier, "storage_tier");
  }
  if (!field(c, o, "event", v, true)) return false;
  if (!v.is_object()) return c.fail(DecodeError::WrongType, "event");
  dom::object e = v.get_object().value_unsafe();
  if (field(c, e, "event_id", v, false)) {
    uint64_t id;
    if (!get_uint(v, id)) return c.fail(DecodeError::WrongType, "event_id");
    ev.event_id = id;
  } else if (c.err != DecodeError::None) {
    return false;
  }
  if (field(c, e, "dp_rank", v, false)) {
    if (!get_uint(v, ev.owner.dp_rank)) return c.fail(DecodeError::WrongType, "dp_rank");
  }
  if (!field(c, e, "data", v, true)) return false;
  if (v.is_string()) {
    if (v.get_string().value_unsafe() != "cleared") return c.fail(DecodeError::BadEvent, "data");
    ev.data = KvCleared{};
    return true;
  }
  if (!v.is_object()) return c.fail(DecodeError::WrongType, "data");
  dom::object d = v.get_object().value_unsafe();
  if (auto s = d.at_key("stored"); !s.error()) {
    if (!s.value_unsafe().is_object()) return c.fail(DecodeError::WrongType, "stored");
    return decode_stored(c, s.value_unsafe().get_object().value_unsafe(), ev);
  }
  if (auto r = d.at_key("removed"); !r.error()) {
    if (!r.value_unsafe().is_object()) return c.fail(DecodeError::WrongType, "removed");
    return decode_removed(c, r.value_unsafe().get_object().value_unsafe(), ev);
  }
  if (!d.at_key("cleared").error()) {
    ev.data = KvCleared{};
    return true;
  }
  return c.fail(DecodeError::BadEvent, "data");
}

// One parser per thread: parsers own large buffers, and decoding runs on
// NATS dispatcher threads and request threads concurrently.
dom::parser& thread_parser() {
  thread_local dom::parser p;
  return p;
}

bool parse(Ctx& c, std::string_view json, dom::element& root) {
  if (json.size() > c.limits->max_message_bytes) return c.fail(DecodeError::TooLarge, "message");
  auto r = thread_parser().parse(json.data(), json.size(), /*realloc_if_needed=*/true);
  if (r.error()) return c.fail(DecodeError::Json, simdjson::error_message(r.error()));
  root = r.value_unsafe();
  return true;
}

}  // namespace

DecodeError decode_kv_events(std::string_view json, const DecodeLimits& limits, std::vector<KvEvent>& out,
                             std::string* detail) {
  Ctx c{DecodeError::None, detail, &limits};
  dom::element root;
  if (!parse(c, json, root)) return c.err;
  std::vector<KvEvent> decoded;
  dom::element batch;
  if (root.is_object() && !root.at_key("events").error()) {
    batch = root.at_key("events").value_unsafe();
    if (!batch.is_array()) return c.fail(DecodeError::WrongType, "events"), c.err;
    dom::array arr = batch.get_array().value_unsafe();
    if (arr.size() > limits.max_events_per_message) return c.fail(DecodeError::TooLarge, "events"), c.err;
    decoded.reserve(arr.size());
    for (dom::element e : arr) {
      KvEvent ev;
      if (!decode_router_event(c, e, ev, true)) return c.err;
      decoded.push_back(std::move(ev));
    }
  } else {
    KvEvent ev;
    if (!decode_router_event(c, root, ev, true)) return c.err;
    decoded.push_back(std::move(ev));
  }
  for (auto& ev : decoded) out.push_back(std::move(ev));
  return DecodeError::None;
}

DecodeError decode_heartbeat(std::string_view json, WorkerHeartbeat& out, std::string* detail) {
  DecodeLimits limits;
  limits.max_message_bytes = 1 << 16;
  Ctx c{DecodeError::None, detail, &limits};
  dom::element root, v;
  if (!parse(c, json, root)) return c.err;
  if (!root.is_object()) return c.fail(DecodeError::WrongType, "heartbeat"), c.err;
  dom::object o = root.get_object().value_unsafe();
  WorkerHeartbeat hb;
  auto str = [&](std::string_view key, std::string& dst, bool required) {
    if (!field(c, o, key, v, required)) return !required && c.err == DecodeError::None;
    if (!v.is_string()) return c.fail(DecodeError::WrongType, key);
    dst = std::string(v.get_string().value_unsafe());
    return true;
  };
  if (!field(c, o, "worker_id", v, true)) return c.err;
  if (!get_uint(v, hb.worker_id.value)) return c.fail(DecodeError::WrongType, "worker_id"), c.err;
  if (!str("url", hb.url, true) || !str("model", hb.model, false)) return c.err;
  if (field(c, o, "block_size", v, false)) {
    if (!get_uint(v, hb.block_size) || hb.block_size == 0 || hb.block_size > 1 << 20)
      return c.fail(DecodeError::WrongType, "block_size"), c.err;
  }
  if (field(c, o, "dp_size", v, false)) {
    if (!get_uint(v, hb.dp_size) || hb.dp_size == 0 || hb.dp_size > 4096)
      return c.fail(DecodeError::WrongType, "dp_size"), c.err;
  }
  if (c.err != DecodeError::None) return c.err;
  if (field(c, o, "kv_events", v, false)) {
    if (!v.is_bool()) return c.fail(DecodeError::WrongType, "kv_events"), c.err;
    hb.kv_events = v.get_bool().value_unsafe();
  }
  if (field(c, o, "load", v, false)) {
    if (!v.is_object()) return c.fail(DecodeError::WrongType, "load"), c.err;
    dom::object l = v.get_object().value_unsafe();
    auto num = [&](std::string_view key, auto& dst) {
      if (!field(c, l, key, v, false)) return c.err == DecodeError::None;
      if (!get_uint(v, dst)) return c.fail(DecodeError::WrongType, key);
      return true;
    };
    if (!num("request_active_slots", hb.load.request_active_slots) ||
        !num("request_total_slots", hb.load.request_total_slots) ||
        !num("num_requests_waiting", hb.load.num_requests_waiting) ||
        !num("kv_active_blocks", hb.load.kv_active_blocks) ||
        !num("kv_total_blocks", hb.load.kv_total_blocks))
      return c.err;
  }
  if (c.err != DecodeError::None) return c.err;
  out = std::move(hb);
  return DecodeError::None;
}

DecodeError decode_resync_dump(std::string_view json, const DecodeLimits& limits, ResyncDump& out,
                               std::string* detail) {
  Ctx c{DecodeError::None, detail, &limits};
  dom::element root, v;
  if (!parse(c, json, root)) return c.err;
  if (!root.is_object()) return c.fail(DecodeError::WrongType, "dump"), c.err;
  dom::object o = root.get_object().value_unsafe();
  ResyncDump d;
  if (!field(c, o, "worker_id", v, true)) return c.err;
  if (!get_uint(v, d.owner.worker.value)) return c.fail(DecodeError::WrongType, "worker_id"), c.err;
  if (field(c, o, "dp_rank", v, false) && !get_uint(v, d.owner.dp_rank))
    return c.fail(DecodeError::WrongType, "dp_rank"), c.err;
  if (!field(c, o, "last_event_id", v, true)) return c.err;
  if (!get_uint(v, d.last_event_id)) return c.fail(DecodeError::WrongType, "last_event_id"), c.err;
  if (!field(c, o, "events", v, true)) return c.err;
  if (!v.is_array()) return c.fail(DecodeError::WrongType, "events"), c.err;
  dom::array events = v.get_array().value_unsafe();
  if (events.size() > limits.max_events_per_message) return c.fail(DecodeError::TooLarge, "events"), c.err;
  for (dom::element e : events) {
    KvEvent ev;
    if (!decode_router_event(c, e, ev, false)) return c.err;
    ev.owner = d.owner;
    ev.event_id.reset();
    d.events.push_back(std::move(ev));
  }
  out = std::move(d);
  return DecodeError::None;
}

namespace {

void append_event_body(std::string& s, const KvEvent& ev) {
  fmt::format_to(std::back_inserter(s), R"({{"worker_id":{},"storage_tier":"{}","event":{{)",
                 ev.owner.worker.value, to_string(ev.tier));
  if (ev.event_id) fmt::format_to(std::back_inserter(s), R"("event_id":{},)", *ev.event_id);
  fmt::format_to(std::back_inserter(s), R"("dp_rank":{},"data":)", ev.owner.dp_rank);
  if (const auto* st = std::get_if<KvStored>(&ev.data)) {
    s += R"({"stored":{"parent_hash":)";
    if (st->parent) fmt::format_to(std::back_inserter(s), "{}", st->parent->value);
    else s += "null";
    s += R"(,"blocks":[)";
    for (size_t i = 0; i < st->blocks.size(); ++i) {
      fmt::format_to(std::back_inserter(s), R"({}{{"block_hash":{},"tokens_hash":{}}})", i ? "," : "",
                     st->blocks[i].block_hash.value, st->blocks[i].tokens_hash.value);
    }
    s += "]}}";
  } else if (const auto* rm = std::get_if<KvRemoved>(&ev.data)) {
    s += R"({"removed":{"block_hashes":[)";
    for (size_t i = 0; i < rm->block_hashes.size(); ++i)
      fmt::format_to(std::back_inserter(s), "{}{}", i ? "," : "", rm->block_hashes[i].value);
    s += "]}}";
  } else {
    s += R"("cleared")";
  }
  s += "}}";
}

}  // namespace

std::string encode_kv_event(const KvEvent& event) {
  std::string s;
  append_event_body(s, event);
  return s;
}

std::string encode_heartbeat(const WorkerHeartbeat& hb) {
  return fmt::format(
      R"({{"worker_id":{},"url":"{}","model":"{}","block_size":{},"dp_size":{},"kv_events":{},"load":{{"request_active_slots":{},"request_total_slots":{},"num_requests_waiting":{},"kv_active_blocks":{},"kv_total_blocks":{}}}}})",
      hb.worker_id.value, json_escape(hb.url), json_escape(hb.model), hb.block_size, hb.dp_size, hb.kv_events,
      hb.load.request_active_slots, hb.load.request_total_slots, hb.load.num_requests_waiting,
      hb.load.kv_active_blocks, hb.load.kv_total_blocks);
}

std::string encode_resync_dump(const ResyncDump& dump) {
  std::string s = fmt::format(R"({{"worker_id":{},"dp_rank":{},"last_event_id":{},"events":[)",
                              dump.owner.worker.value, dump.owner.dp_rank, dump.last_event_id);
  for (size_t i = 0; i < dump.events.size(); ++i) {
    if (i) s += ',';
    append_event_body(s, dump.events[i]);
  }
  s += "]}";
  return s;
}

}  // namespace kvroute
