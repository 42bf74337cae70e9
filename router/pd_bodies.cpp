#include "router/pd_bodies.h"

#include <simdjson.h>

#include <algorithm>
#include <initializer_list>
#include <vector>

#include <fmt/format.h>

#include "common/json_escape.h"

namespace kvroute::pd {

namespace dom = simdjson::dom;

std::string_view to_string(ParamsError e) {
  switch (e) {
    case ParamsError::None: return "none";
    case ParamsError::TooLarge: return "too_large";
    case ParamsError::NotJson: return "not_json";
    case ParamsError::Missing: return "missing";
    case ParamsError::NotObject: return "not_object";
    case ParamsError::WrongType: return "wrong_type";
    case ParamsError::NotForDecode: return "not_for_decode";
    case ParamsError::HostMismatch: return "host_mismatch";
  }
  return "none";
}

namespace {

// One top-level member of a JSON object, as spans of the original text (so
// the client's bytes, numbers beyond 64 bits included, reach the engine
// unchanged) plus its key decoded (so "kv\u005ftransfer_params" is still
// recognised and stripped).
struct Member {
  std::string key;
  std::string_view raw_key;  // with its quotes
  std::string_view value;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Index just past the string starting at text[i] == '"'; npos if unterminated.
size_t skip_string(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\') ++i;
    else if (t[i] == '"') return i + 1;
  }
  return std::string_view::npos;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) out += static_cast<char>(cp);
  else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The decoded text of a JSON string literal's inside (escapes resolved; a
// surrogate pair's halves each as their own code unit: only compared with
// ASCII names). False on a bad escape.
bool decode_key(std::string_view inside, std::string& out) {
  out.clear();
  for (size_t i = 0; i < inside.size(); ++i) {
    if (inside[i] != '\\') { out += inside[i]; continue; }
    if (++i >= inside.size()) return false;
    switch (inside[i]) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        if (i + 4 >= inside.size()) return false;
        uint32_t cp = 0;
        for (int k = 1; k <= 4; ++k) {
          const int h = hex(inside[i + k]);
          if (h < 0) return false;
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        append_utf8(out, cp);
        i += 4;
        break;
      }
      default: return false;
    }
  }
  return true;
}

// Index just past the value starting at t[i]; npos if malformed. Nested
// containers are skipped by depth counting (no recursion: any depth).
size_t skip_value(std::string_view t, size_t i) {
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] == '"') return skip_string(t, i);
  if (t[i] == '{' || t[i] == '[') {
    size_t depth = 0;
    for (; i < t.size(); ++i) {
      const char c = t[i];
      if (c == '"') {
        i = skip_string(t, i);
        if (i == std::string_view::npos) return i;
        --i;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return std::string_view::npos;
  }
  const size_t start = i;
  while (i < t.size() && !is_ws(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') ++i;
  return i > start ? i : std::string_view::npos;
}

// The top-level members of the object `t`; false if `t` is not one.
// Structure only: values are validated by simdjson where they matter.
bool scan_object(std::string_view t, std::vector<Member>& out) {
  out.clear();
  size_t i = 0;
  auto ws = [&] { while (i < t.size() && is_ws(t[i])) ++i; };
  ws();
  if (i >= t.size() || t[i] != '{') return false;
  ++i;
  ws();
  if (i < t.size() && t[i] == '}') {
    ++i;
    ws();
    return i == t.size();
  }
  while (i < t.size()) {
    ws();
    if (i >= t.size() || t[i] != '"') return false;
    const size_t ke = skip_string(t, i);
    if (ke == std::string_view::npos) return false;
    Member m;
    m.raw_key = t.substr(i, ke - i);
    if (!decode_key(t.substr(i + 1, ke - i - 2), m.key)) return false;
    i = ke;
    ws();
    if (i >= t.size() || t[i] != ':') return false;
    ++i;
    ws();
    const size_t ve = skip_value(t, i);
    if (ve == std::string_view::npos) return false;
    m.value = t.substr(i, ve - i);
    out.push_back(std::move(m));
    i = ve;
    ws();
    if (i >= t.size()) return false;
    if (t[i] == '}') {
      ++i;
      ws();
      return i == t.size();
    }
    if (t[i] != ',') return false;
    ++i;
  }
  return false;
}

bool in(std::string_view key, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

bool is_transfer_field(std::string_view key) {
  return std::find(kTransferFields.begin(), kTransferFields.end(), key) != kTransferFields.end();
}

// `members` without the transfer fields and without `drop`, then `add`
// (already "key":value text, comma-separated), as one JSON object.
std::string write_object(const std::vector<Member>& members, std::initializer_list<std::string_view> drop,
                         std::string_view add) {
  std::string out = "{";
  for (const auto& m : members) {
    if (is_transfer_field(m.key) || in(m.key, drop)) continue;
    if (out.size() > 1) out += ',';
    out.append(m.raw_key).append(":").append(m.value);
  }
  if (!add.empty()) {
    if (out.size() > 1) out += ',';
    out.append(add);
  }
  out += '}';
  return out;
}

BodyError scan_client(std::string_view body, std::vector<Member>& members) {
  if (scan_object(body, members)) return BodyError::None;
  size_t i = 0;
  while (i < body.size() && is_ws(body[i])) ++i;
  return i < body.size() && body[i] == '{' ? BodyError::NotJson : BodyError::NotObject;
}

bool has(const std::vector<Member>& members, std::string_view key) {
  return std::any_of(members.begin(), members.end(), [&](const Member& m) { return m.key == key; });
}

}  // namespace

BodyError strip_transfer_fields(std::string_view client_body, std::string& out) {
  std::vector<Member> members;
  if (auto e = scan_client(client_body, members); e != BodyError::None) return e;
  out = write_object(members, {}, "");
  return BodyError::None;
}

BodyError nixl_prefill_body(std::string_view client_body, std::string& out) {
  std::vector<Member> members;
  if (auto e = scan_client(client_body, members); e != BodyError::None) return e;
  std::string add = R"("stream":false,"max_tokens":1)";
  if (has(members, "max_completion_tokens")) add += R"(,"max_completion_tokens":1)";
  if (has(members, "max_output_tokens")) add += R"(,"max_output_tokens":1)";
  if (has(members, "n")) add += R"(,"n":1)";
  add += R"(,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
         R"("remote_block_ids":null,"remote_host":null,"remote_port":null})";
  out = write_object(members,
                     {"stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens",
                      "min_tokens", "min_completion_tokens", "n"},
                     add);
  return BodyError::None;
}

BodyError nixl_decode_body(std::string_view client_body, std::string_view params, std::string& out) {
  std::vector<Member> members;
  if (auto e = scan_client(client_body, members); e != BodyError::None) return e;
  std::string add = "\"kv_transfer_params\":";
  add.append(params);
  out = write_object(members, {}, add);
  return BodyError::None;
}

BodyError mooncake_prefill_body(std::string_view client_body, std::string_view transfer_id, std::string& out) {
  if (auto e = nixl_prefill_body(client_body, out); e != BodyError::None) return e;
  // nixl_prefill_body wrote kv_transfer_params last: replaced by Mooncake's.
  const size_t at = out.rfind(",\"kv_transfer_params\":");
  if (at == std::string::npos) return BodyError::NotJson;  // not reached: written above
  out.resize(at);
  out += fmt::format(R"(,"kv_transfer_params":{{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"{}"}}}})",
                     json_escape(transfer_id));
  return BodyError::None;
}

std::string mooncake_decode_params(std::string_view bootstrap_addr, std::string_view engine_id,
                                   std::string_view transfer_id) {
  return fmt::format(R"({{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":"{}",)"
                     R"("remote_engine_id":"{}","transfer_id":"{}"}})",
                     json_escape(bootstrap_addr), json_escape(engine_id), json_escape(transfer_id));
}

namespace {

// A rank's worker_addr as the decode engine reads it ({tp_rank: {pp_rank:
// "tcp://host:port"}}, mooncake_connector.py _connect_to_prefiller_bootstrap
// turns the keys into ints): a non-empty object of non-empty objects of
// strings, every key a rank number.
bool worker_addr_ok(dom::object entry) {
  auto is_rank = [](std::string_view k) {
    return !k.empty() && k.size() <= 9 && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  dom::object tps;
  if (entry.at_key("worker_addr").get_object().get(tps) || tps.size() == 0) return false;
  for (dom::key_value_pair tp : tps) {
    dom::object pps;
    if (!is_rank(tp.key) || tp.value.get_object().get(pps) || pps.size() == 0) return false;
    for (dom::key_value_pair pp : pps)
      if (!is_rank(pp.key) || !pp.value.is_string()) return false;
  }
  return true;
}

}  // namespace

ParamsError read_mooncake_query(std::string_view answer, std::optional<uint32_t> rank, MooncakeEngine& out,
                                std::string* detail, uint64_t turn) {
  auto fail = [&](ParamsError e, std::string what) {
    if (detail) *detail = std::move(what);
    return e;
  };
  if (answer.size() > kMaxQueryAnswerBytes) return fail(ParamsError::TooLarge, "answer");
  dom::parser parser;
  dom::element root;
  if (parser.parse(answer.data(), answer.size(), true).get(root)) return fail(ParamsError::NotJson, "answer");
  if (!root.is_object()) return fail(ParamsError::NotObject, "answer");
  const dom::object ranks = root.get_object().value_unsafe();
  if (ranks.size() > kMaxQueryRanks) return fail(ParamsError::TooLarge, "ranks");
  std::vector<std::pair<uint32_t, std::string_view>> listed;  // (rank, engine id)
  listed.reserve(ranks.size());
  for (dom::key_value_pair kv : ranks) {
    uint32_t r = 0;
    const std::string_view k = kv.key;
    if (k.empty() || k.size() > 9 || !std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(ParamsError::WrongType, "rank key");
    for (char c : k) r = r * 10 + static_cast<uint32_t>(c - '0');
    std::string_view id;
    dom::element e;
    if (!kv.value.is_object() || kv.value.get_object().value_unsafe().at_key("engine_id").get(e) ||
        e.get_string().get(id) || id.empty() || id.size() > kMaxEngineIdBytes)
      return fail(ParamsError::WrongType, fmt::format("engine_id of rank {}", r));
    if (!worker_addr_ok(kv.value.get_object().value_unsafe()))
      return fail(ParamsError::WrongType, fmt::format("worker_addr of rank {}", r));
    listed.emplace_back(r, id);
  }
  // Ascending ranks; one entry each (vLLM's answer is a dict keyed by rank:
  // a rank listed twice, "1" and "01" included, is not its answer).
  std::sort(listed.begin(), listed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < listed.size(); ++i)
    if (listed[i].first == listed[i - 1].first)
      return fail(ParamsError::WrongType, fmt::format("rank {} listed twice", listed[i].first));
  if (listed.empty()) return fail(ParamsError::Missing, rank ? fmt::format("rank {}", *rank) : std::string("any rank"));
  size_t chosen = turn % listed.size();
  if (rank) {
    const auto it = std::find_if(listed.begin(), listed.end(), [&](const auto& l) { return l.first == *rank; });
    if (it == listed.end()) return fail(ParamsError::Missing, fmt::format("rank {}", *rank));
    chosen = static_cast<size_t>(it - listed.begin());
  }
  out.rank = listed[chosen].first;
  out.engine_id.assign(listed[chosen].second);
  out.ranks = listed.size();
  return ParamsError::None;
}

BodyError sglang_body(std::string_view client_body, std::string_view bootstrap_host, uint32_t bootstrap_port,
                      uint64_t bootstrap_room, std::string& out) {
  std::vector<Member> members;
  if (auto e = scan_client(client_body, members); e != BodyError::None) return e;
  const std::string add = fmt::format(R"("bootstrap_host":"{}","bootstrap_port":{},"bootstrap_room":{})",
                                      json_escape(bootstrap_host), bootstrap_port,
                                      bootstrap_room & 0x7fffffffffffffffull);
  out = write_object(members, {}, add);
  return BodyError::None;
}

bool is_loopback_or_unspecified(std::string_view h) {
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h.empty() || h == "localhost" || h == "::1" || h == "::" || h == "0.0.0.0" || h.rfind("127.", 0) == 0;
}

ParamsError read_kv_transfer_params(std::string_view answer, std::string_view prefill_host,
                                    const ParamsLimits& limits, std::string& out, std::string* detail) {
  auto fail = [&](ParamsError e, std::string_view what) {
    if (detail) *detail = std::string(what);
    return e;
  };
  if (answer.size() > limits.max_answer_bytes) return fail(ParamsError::TooLarge, "answer");
  std::vector<Member> top;
  if (!scan_object(answer, top)) return fail(ParamsError::NotJson, "answer");
  // The engine (Python's json) keeps the last of duplicate keys; so does this.
  const Member* params = nullptr;
  for (const auto& m : top)
    if (m.key == "kv_transfer_params") params = &m;
  if (!params || params->value == "null") return fail(ParamsError::Missing, "kv_transfer_params");
  if (params->value.size() > limits.max_params_bytes) return fail(ParamsError::TooLarge, "kv_transfer_params");
  std::vector<Member> fields;
  if (params->value.front() != '{' || !scan_object(params->value, fields))
    return fail(ParamsError::NotObject, "kv_transfer_params");
  // A duplicate key would be checked here in its first occurrence and used
  // by the engine (Python's json) in its last.
  {
    std::vector<std::string_view> keys;
    keys.reserve(fields.size());
    for (const auto& m : fields) keys.push_back(m.key);
    std::sort(keys.begin(), keys.end());  // O(n log n): the field count is the engine's to choose
    const auto dup = std::adjacent_find(keys.begin(), keys.end());
    if (dup != keys.end()) return fail(ParamsError::WrongType, fmt::format("duplicate key '{}'", *dup));
  }

  dom::parser parser;
  dom::element root;
  if (parser.parse(params->value.data(), params->value.size(), true).get(root) || !root.is_object())
    return fail(ParamsError::NotObject, "kv_transfer_params");
  const dom::object o = root.get_object().value_unsafe();
  auto uint_field = [&](std::string_view key, uint64_t max) {
    dom::element v;
    if (o.at_key(key).get(v)) return true;  // absent: the older generation sends fewer keys
    if (v.is_null()) return true;
    uint64_t x = 0;
    if (v.is_uint64()) x = v.get_uint64().value_unsafe();
    else if (v.is_int64() && v.get_int64().value_unsafe() >= 0) x = static_cast<uint64_t>(v.get_int64().value_unsafe());
    else return false;
    return x <= max;
  };
  dom::element v;
  if (o.at_key("do_remote_prefill").get(v) || !v.is_bool()) return fail(ParamsError::NotForDecode, "do_remote_prefill");
  if (!v.get_bool().value_unsafe()) return fail(ParamsError::NotForDecode, "do_remote_prefill");
  if (!o.at_key("do_remote_decode").get(v) && !v.is_bool()) return fail(ParamsError::WrongType, "do_remote_decode");
  for (std::string_view key : {"remote_engine_id", "remote_request_id", "remote_host", "transfer_mode"})
    if (!o.at_key(key).get(v) && !v.is_string() && !v.is_null()) return fail(ParamsError::WrongType, key);
  if (!uint_field("remote_port", 65535)) return fail(ParamsError::WrongType, "remote_port");
  for (std::string_view key : {"tp_size", "dcp_size", "pp_size"})
    if (!uint_field(key, 1u << 20)) return fail(ParamsError::WrongType, key);
  if (!uint_field("remote_num_tokens", ~0ull)) return fail(ParamsError::WrongType, "remote_num_tokens");
  if (!o.at_key("remote_block_ids").get(v) && !v.is_null()) {
    // list[int] (one KV-cache group, older engines) or list[list[int]].
    if (!v.is_array()) return fail(ParamsError::WrongType, "remote_block_ids");
    // Named arrays: a range-for over value_unsafe() of a temporary result
    // would iterate a destroyed object (found by ASan in the fuzz target).
    const dom::array groups = v.get_array().value_unsafe();
    for (dom::element g : groups) {
      if (g.is_array()) {
        const dom::array blocks = g.get_array().value_unsafe();
        for (dom::element b : blocks)
          if (!b.is_uint64() && !(b.is_int64() && b.get_int64().value_unsafe() >= 0))
            return fail(ParamsError::WrongType, "remote_block_ids");
      } else if (!g.is_uint64() && !(g.is_int64() && g.get_int64().value_unsafe() >= 0)) {
        return fail(ParamsError::WrongType, "remote_block_ids");
      }
    }
  }

  // remote_host: pinned to the prefill worker when the engine reports its
  // unreachable default; any other host must be the prefill worker's.
  std::string_view host;
  bool has_host = false;
  if (!o.at_key("remote_host").get(v) && v.is_string()) {
    host = v.get_string().value_unsafe();
    has_host = true;
  }
  const bool pin = has_host && is_loopback_or_unspecified(host) && !is_loopback_or_unspecified(prefill_host);
  if (has_host && !pin && !is_loopback_or_unspecified(host) && host != prefill_host)
    return fail(ParamsError::HostMismatch, "remote_host");
  if (!pin) {
    out.assign(params->value);
    return ParamsError::None;
  }
  std::string pinned = "{";
  for (const auto& m : fields) {
    if (pinned.size() > 1) pinned += ',';
    pinned.append(m.raw_key).append(":");
    if (m.key == "remote_host") pinned.append("\"").append(json_escape(prefill_host)).append("\"");
    else pinned.append(m.value);
  }
  out = pinned + "}";
  return ParamsError::None;
}

}  // namespace kvroute::pd
