#include "events/wire.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <unordered_map>
#include <unordered_set>

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
  if (field(c, o, "instance_id", v, false)) {
    if (!get_uint(v, ev.instance)) return c.fail(DecodeError::WrongType, "instance_id");
  } else if (c.err != DecodeError::None) {
    return false;
  }
  if (field(c, o, "storage_tier", v, false)) {
    if (!v.is_string()) return c.fail(DecodeError::WrongType, "storage_tier");
    if (!parse_storage_tier(v.get_string().value_unsafe(), ev.tier)) return c.fail(DecodeError::UnknownTier, "storage_tier");
  }
  // The medium as the engine names it (matched against kv_pools' media);
  // a name longer than any pool's is ignored.
  if (field(c, o, "medium", v, false)) {
    if (!v.is_string()) return c.fail(DecodeError::WrongType, "medium");
    ev.medium = bounded_medium(v.get_string().value_unsafe());
  } else if (c.err != DecodeError::None) {
    return false;
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
  if (field(c, o, "instance_id", v, false) && !get_uint(v, hb.instance_id))
    return c.fail(DecodeError::WrongType, "instance_id"), c.err;
  if (c.err != DecodeError::None) return c.err;
  if (field(c, o, "kv_events", v, false)) {
    if (!v.is_bool()) return c.fail(DecodeError::WrongType, "kv_events"), c.err;
    hb.kv_events = v.get_bool().value_unsafe();
  }
  if (field(c, o, "role", v, false)) {
    if (!v.is_string() || !parse_worker_role(v.get_string().value_unsafe(), hb.role))
      return c.fail(DecodeError::WrongType, "role"), c.err;
  }
  if (c.err != DecodeError::None) return c.err;
  if (field(c, o, "bootstrap_port", v, false)) {
    if (!get_uint(v, hb.bootstrap_port) || hb.bootstrap_port == 0 || hb.bootstrap_port > 65535)
      return c.fail(DecodeError::WrongType, "bootstrap_port"), c.err;
  }
  if (c.err != DecodeError::None) return c.err;
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
  if (field(c, o, "instance_id", v, false) && !get_uint(v, d.instance))
    return c.fail(DecodeError::WrongType, "instance_id"), c.err;
  if (!field(c, o, "events", v, true)) return c.err;
  if (!v.is_array()) return c.fail(DecodeError::WrongType, "events"), c.err;
  dom::array events = v.get_array().value_unsafe();
  if (events.size() > limits.max_events_per_message) return c.fail(DecodeError::TooLarge, "events"), c.err;
  for (dom::element e : events) {
    KvEvent ev;
    if (!decode_router_event(c, e, ev, false)) return c.err;
    ev.owner = d.owner;
    ev.event_id.reset();
    ev.instance = d.instance;
    d.events.push_back(std::move(ev));
  }
  out = std::move(d);
  return DecodeError::None;
}

namespace {

void append_event_body(std::string& s, const KvEvent& ev) {
  fmt::format_to(std::back_inserter(s), R"({{"worker_id":{},)", ev.owner.worker.value);
  if (ev.instance) fmt::format_to(std::back_inserter(s), R"("instance_id":{},)", ev.instance);
  fmt::format_to(std::back_inserter(s), R"("storage_tier":"{}",)", to_string(ev.tier));
  if (!ev.medium.empty()) fmt::format_to(std::back_inserter(s), R"("medium":"{}",)", json_escape(ev.medium));
  s += R"("event":{)";
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
  std::string s = fmt::format(
      R"({{"worker_id":{},"url":"{}","model":"{}","dp_size":{},"kv_events":{},"load":{{"request_active_slots":{},"request_total_slots":{},"num_requests_waiting":{},"kv_active_blocks":{},"kv_total_blocks":{}}})",
      hb.worker_id.value, json_escape(hb.url), json_escape(hb.model), hb.dp_size, hb.kv_events,
      hb.load.request_active_slots, hb.load.request_total_slots, hb.load.num_requests_waiting,
      hb.load.kv_active_blocks, hb.load.kv_total_blocks);
  // 0 = not announced: the field is left out (the decoder refuses "block_size":0).
  if (hb.block_size) fmt::format_to(std::back_inserter(s), R"(,"block_size":{})", hb.block_size);
  if (hb.instance_id) fmt::format_to(std::back_inserter(s), R"(,"instance_id":{})", hb.instance_id);
  // Defaults are left out: heartbeats of aggregated workers stay as they were.
  if (hb.role != WorkerRole::Both) fmt::format_to(std::back_inserter(s), R"(,"role":"{}")", to_string(hb.role));
  if (hb.bootstrap_port != 8998) fmt::format_to(std::back_inserter(s), R"(,"bootstrap_port":{})", hb.bootstrap_port);
  s += '}';
  return s;
}

std::string encode_resync_dump(const ResyncDump& dump) {
  std::string s = fmt::format(R"({{"worker_id":{},"dp_rank":{},"last_event_id":{},)", dump.owner.worker.value,
                              dump.owner.dp_rank, dump.last_event_id);
  if (dump.instance) fmt::format_to(std::back_inserter(s), R"("instance_id":{},)", dump.instance);
  s += R"("events":[)";
  for (size_t i = 0; i < dump.events.size(); ++i) {
    if (i) s += ',';
    append_event_body(s, dump.events[i]);
  }
  s += "]}";
  return s;
}

}  // namespace kvroute

// ---- Chunked resync ---------------------------------------------------------
namespace kvroute {

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void base64_append(std::string& out, std::string_view in) {
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18], out += kB64[(v >> 12) & 63], out += kB64[(v >> 6) & 63], out += kB64[v & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (rest == 2) v |= uint8_t(in[i + 1]) << 8;
    out += kB64[v >> 18], out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
}

bool base64_decode(std::string_view in, std::string& out) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kB64[i])] = static_cast<int8_t>(i);
    return t;
  }();
  if (in.size() % 4 != 0) return false;
  out.clear();
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = in[i + k];
      if (ch == '=' && i + 4 == in.size() && k >= 2) { v[k] = 0; ++pad; continue; }
      if (pad) return false;  // data after padding
      v[k] = table[static_cast<uint8_t>(ch)];
      if (v[k] < 0) return false;
    }
    const uint32_t x = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>(x >> 16);
    if (pad < 2) out += static_cast<char>((x >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(x & 0xff);
  }
  return true;
}

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_le(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

// The compact records of `bytes` (see wire.h) appended to `out` as stored events.
bool decode_compact(Ctx& c, std::string_view bytes, const ResyncDump& head, std::vector<KvEvent>& out) {
  size_t pos = 0;
  size_t blocks_total = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 6) return c.fail(DecodeError::WrongType, "blocks (truncated record)");
    const uint8_t tier = static_cast<uint8_t>(bytes[pos]);
    const uint8_t flags = static_cast<uint8_t>(bytes[pos + 1]);
    const uint64_t count = get_le(bytes.data() + pos + 2, 4);
    pos += 6;
    if (tier >= kNumBaseTiers) return c.fail(DecodeError::UnknownTier, "blocks (tier)");
    if (flags > 3) return c.fail(DecodeError::WrongType, "blocks (flags)");
    if (count == 0 || count > c.limits->max_blocks_per_event) return c.fail(DecodeError::TooLarge, "blocks (count)");
    KvEvent ev;
    if (flags & 2) {  // the medium: u8 length (1..kMaxMediumBytes), then its bytes
      const size_t len = bytes.size() > pos ? static_cast<uint8_t>(bytes[pos]) : 0;
      if (len == 0 || len > kMaxMediumBytes || bytes.size() - pos < 1 + len)
        return c.fail(DecodeError::WrongType, "blocks (medium)");
      ev.medium.assign(bytes.data() + pos + 1, len);
      pos += 1 + len;
    }
    const size_t need = (flags & 1 ? 8 : 0) + count * 16;
    if (bytes.size() - pos < need) return c.fail(DecodeError::WrongType, "blocks (truncated record)");
    blocks_total += count;
    if (blocks_total > c.limits->max_blocks_per_event * 64) return c.fail(DecodeError::TooLarge, "blocks");
    ev.owner = head.owner;
    ev.instance = head.instance;
    ev.tier = static_cast<StorageTier>(tier);
    KvStored st;
    if (flags & 1) st.parent = SequenceHash{get_le(bytes.data() + pos, 8)}, pos += 8;
    st.blocks.resize(count);
    for (auto& b : st.blocks) {
      b.block_hash = SequenceHash{get_le(bytes.data() + pos, 8)};
      b.tokens_hash = LocalBlockHash{get_le(bytes.data() + pos + 8, 8)};
      pos += 16;
    }
    ev.data = std::move(st);
    out.push_back(std::move(ev));
  }
  return true;
}

// A chunk's header (everything but the blocks), `"blocks":"` included.
std::string chunk_head(const ResyncDump& d, uint64_t snapshot, size_t chunk, size_t chunks) {
  return fmt::format(
      R"({{"worker_id":{},"dp_rank":{},"instance_id":{},"last_event_id":{},"snapshot":{},"chunk":{},"chunks":{},"blocks":")",
      d.owner.worker.value, d.owner.dp_rank, d.instance, d.last_event_id, snapshot, chunk, chunks);
}

// Splits the dump's stored events into binary chunk bodies of at most `budget` bytes.
std::vector<std::string> pack_records(const ResyncDump& dump, size_t budget) {
  std::vector<std::string> bodies(1);
  for (const auto& ev : dump.events) {
    const auto* st = std::get_if<KvStored>(&ev.data);
    if (!st || st->blocks.empty()) continue;
    std::optional<SequenceHash> parent = st->parent;
    size_t i = 0;
    while (i < st->blocks.size()) {
      std::string& body = bodies.back();
      const std::string_view medium = bounded_medium(ev.medium);
      const size_t head = 6 + (medium.empty() ? 0 : 1 + medium.size()) + (parent ? 8 : 0);
      const size_t room = body.size() + head + 16 <= budget ? (budget - body.size() - head) / 16 : 0;
      if (room == 0) {
        bodies.emplace_back();
        continue;
      }
      const size_t n = std::min(room, st->blocks.size() - i);
      body += static_cast<char>(ev.tier);
      body += static_cast<char>((parent ? 1 : 0) | (medium.empty() ? 0 : 2));
      put_u32(body, static_cast<uint32_t>(n));
      if (!medium.empty()) {
        body += static_cast<char>(medium.size());
        body += medium;
      }
      if (parent) put_u64(body, parent->value);
      for (size_t k = i; k < i + n; ++k) {
        put_u64(body, st->blocks[k].block_hash.value);
        put_u64(body, st->blocks[k].tokens_hash.value);
      }
      i += n;
      parent = st->blocks[i - 1].block_hash;
    }
  }
  return bodies;
}

}  // namespace

std::string encode_resync_request(const ResyncRequest& r) {
  return fmt::format(R"({{"dp_rank":{},"snapshot":{},"chunk":{},"max_bytes":{}}})", r.dp_rank, r.snapshot, r.chunk,
                     r.max_bytes);
}

DecodeError decode_resync_request(std::string_view json, ResyncRequest& out) {
  if (json.empty()) {
    out = ResyncRequest{};
    return DecodeError::None;
  }
  DecodeLimits limits;
  limits.max_message_bytes = 4096;
  Ctx c{DecodeError::None, nullptr, &limits};
  dom::element root, v;
  if (!parse(c, json, root)) return c.err;
  if (!root.is_object()) return DecodeError::WrongType;
  dom::object o = root.get_object().value_unsafe();
  ResyncRequest r;
  if (field(c, o, "dp_rank", v, false) && !get_uint(v, r.dp_rank)) return DecodeError::WrongType;
  if (field(c, o, "snapshot", v, false) && !get_uint(v, r.snapshot)) return DecodeError::WrongType;
  if (field(c, o, "chunk", v, false) && !get_uint(v, r.chunk)) return DecodeError::WrongType;
  if (field(c, o, "max_bytes", v, false) && !get_uint(v, r.max_bytes)) return DecodeError::WrongType;
  out = r;
  return DecodeError::None;
}

std::vector<std::string> encode_resync_chunks(const ResyncDump& dump, uint64_t snapshot, size_t max_bytes) {
  max_bytes = std::max<size_t>(max_bytes, 1024);
  // Header at most ~230 bytes (7 numbers of <= 20 digits); base64 is 4/3.
  const size_t budget = (max_bytes - 256) / 4 * 3;
  const auto bodies = pack_records(dump, budget);
  std::vector<std::string> out;
  out.reserve(bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) {
    std::string s = chunk_head(dump, snapshot, i, bodies.size());
    base64_append(s, bodies[i]);
    s += "\"}";
    out.push_back(std::move(s));
  }
  return out;
}

std::string encode_resync_gone() { return R"({"error":"snapshot_gone"})"; }

DecodeError decode_resync_chunk(std::string_view json, const DecodeLimits& limits, ResyncChunk& out,
                                std::string* detail) {
  Ctx c{DecodeError::None, detail, &limits};
  dom::element root, v;
  if (!parse(c, json, root)) return c.err;
  if (!root.is_object()) return c.fail(DecodeError::WrongType, "chunk"), c.err;
  dom::object o = root.get_object().value_unsafe();
  ResyncChunk r;
  if (field(c, o, "error", v, false)) {
    if (!v.is_string() || v.get_string().value_unsafe() != "snapshot_gone")
      return c.fail(DecodeError::BadEvent, "error"), c.err;
    r.snapshot_gone = true;
    out = std::move(r);
    return DecodeError::None;
  }
  if (o.at_key("chunks").error()) {  // a legacy whole dump
    DecodeError e = decode_resync_dump(json, limits, r.dump, detail);
    if (e == DecodeError::None) out = std::move(r);
    return e;
  }
  auto num = [&](std::string_view key, auto& dst) {
    if (!field(c, o, key, v, true)) return false;
    if (!get_uint(v, dst)) return c.fail(DecodeError::WrongType, key);
    return true;
  };
  if (!num("worker_id", r.dump.owner.worker.value) || !num("dp_rank", r.dump.owner.dp_rank) ||
      !num("instance_id", r.dump.instance) || !num("last_event_id", r.dump.last_event_id) ||
      !num("snapshot", r.snapshot) || !num("chunk", r.chunk) || !num("chunks", r.chunks))
    return c.err;
  if (r.chunks == 0 || r.chunk >= r.chunks) return c.fail(DecodeError::WrongType, "chunk"), c.err;
  if (!field(c, o, "blocks", v, true)) return c.err;
  if (!v.is_string()) return c.fail(DecodeError::WrongType, "blocks"), c.err;
  std::string bytes;
  if (!base64_decode(v.get_string().value_unsafe(), bytes)) return c.fail(DecodeError::WrongType, "blocks (base64)"), c.err;
  if (!decode_compact(c, bytes, r.dump, r.dump.events)) return c.err;
  out = std::move(r);
  return DecodeError::None;
}

// ---- Replicas' in-flight load ----------------------------------------------
std::string encode_replica_snapshot(const ReplicaSnapshot& s) {
  std::string out = fmt::format(R"({{"replica":{},"seq":{},"ttl_ms":{},"w":[)", s.replica, s.seq, s.ttl_ms);
  for (size_t i = 0; i < s.workers.size(); ++i) {  // every worker, one parked only as zeros: order kept
    const auto& w = s.workers[i];
    fmt::format_to(std::back_inserter(out), "{}[{},{},{},{}]", i ? "," : "", w.worker.value, w.requests, w.blocks,
                   w.prefill_tokens);
  }
  out += "]";
  bool first = true;
  for (const auto& w : s.workers) {
    if (!w.parked_blocks) continue;
    fmt::format_to(std::back_inserter(out), "{}[{},{}]", first ? R"(,"p":[)" : ",", w.worker.value, w.parked_blocks);
    first = false;
  }
  out += first ? "}" : "]}";
  return out;
}

namespace {
// The optional "p" list of a replica snapshot: [worker_id, parked_blocks]
// pairs, merged into `s.workers` (a worker with nothing in flight is added).
bool decode_replica_parked(simdjson::dom::object o, ReplicaSnapshot& s) {
  simdjson::dom::element p;
  if (o["p"].get(p)) return true;  // absent: nothing parked (or an older replica)
  simdjson::dom::array a;
  if (p.get_array().get(a) || a.size() > 65536) return false;
  std::unordered_map<uint64_t, size_t> at;  // worker -> its index in s.workers
  at.reserve(s.workers.size() + a.size());
  for (size_t i = 0; i < s.workers.size(); ++i) at.emplace(s.workers[i].worker.value, i);
  std::unordered_set<uint64_t> seen;
  for (simdjson::dom::element e : a) {
    simdjson::dom::array pair;
    uint64_t id = 0, parked = 0;
    if (e.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_uint64().get(id) ||
        pair.at(1).get_uint64().get(parked) || parked > (uint64_t{1} << 40) || !seen.insert(id).second)
      return false;
    const auto [it, fresh] = at.emplace(id, s.workers.size());
    if (fresh && s.workers.size() >= 65536) return false;  // the bound holds for both lists together
    if (fresh) s.workers.push_back({WorkerId{id}, 0, 0, 0});
    s.workers[it->second].parked_blocks = parked;
  }
  return true;
}
}  // namespace

bool decode_replica_snapshot(std::string_view json, ReplicaSnapshot& out) {
  if (json.size() > (4u << 20)) return false;
  thread_local simdjson::dom::parser parser;
  auto doc = parser.parse(json.data(), json.size());
  if (doc.error()) return false;
  simdjson::dom::object o;
  if (doc.value_unsafe().get_object().get(o)) return false;
  ReplicaSnapshot s;
  uint64_t ttl = 0;
  simdjson::dom::array w;
  if (o["replica"].get_uint64().get(s.replica) || o["seq"].get_uint64().get(s.seq) ||
      o["ttl_ms"].get_uint64().get(ttl) || o["w"].get_array().get(w))
    return false;
  if (ttl == 0 || ttl > 3600000 || w.size() > 65536) return false;
  s.ttl_ms = static_cast<uint32_t>(ttl);
  for (simdjson::dom::element e : w) {
    simdjson::dom::array a;
    if (e.get_array().get(a) || a.size() != 4) return false;
    uint64_t v[4];
    size_t i = 0;
    for (simdjson::dom::element x : a)
      if (x.get_uint64().get(v[i++])) return false;
    if (v[1] > UINT32_MAX) return false;
    s.workers.push_back({WorkerId{v[0]}, static_cast<uint32_t>(v[1]), v[2], v[3]});
  }
  if (!decode_replica_parked(o, s)) return false;
  out = std::move(s);
  return true;
}

}  // namespace kvroute
