#include "mocker/pd.h"

#include <boost/asio/ip/address.hpp>
#include <fmt/format.h>

#include <algorithm>

namespace kvroute::mocker {

const char* pd_error_name(PdError e) {
  switch (e) {
    case PdError::None: return "none";
    case PdError::Malformed: return "malformed";
    case PdError::TooLarge: return "too_large";
    case PdError::Missing: return "missing";
    case PdError::WrongRole: return "wrong_role";
    case PdError::BadHost: return "bad_host";
    case PdError::Unreachable: return "unreachable";
    case PdError::UnknownEngine: return "unknown_engine";
    case PdError::UnknownTransfer: return "unknown_transfer";
    case PdError::Expired: return "expired";
    case PdError::ForgedBlocks: return "forged_blocks";
    case PdError::PromptMismatch: return "prompt_mismatch";
    case PdError::HeldFull: return "held_full";
    case PdError::RoomsFull: return "rooms_full";
    case PdError::DuplicateRoom: return "duplicate_room";
    case PdError::RoomTimeout: return "room_timeout";
  }
  return "none";
}

namespace {

// A string field: absent or null leaves `out` empty; another type or an
// over-long string is an error.
bool read_string(simdjson::dom::object o, const char* key, std::string& out, PdError& err, std::string& detail) {
  auto v = o.at_key(key);
  if (v.error() || v.value_unsafe().is_null()) return true;
  std::string_view s;
  if (v.value_unsafe().get_string().get(s)) {
    err = PdError::Malformed, detail = fmt::format("kv_transfer_params.{} must be a string", key);
    return false;
  }
  if (s.size() > kMaxParamString) {
    err = PdError::TooLarge, detail = fmt::format("kv_transfer_params.{} is longer than {} bytes", key, kMaxParamString);
    return false;
  }
  out.assign(s);
  return true;
}

bool read_bool(simdjson::dom::object o, const char* key, bool& out, PdError& err, std::string& detail) {
  auto v = o.at_key(key);
  if (v.error() || v.value_unsafe().is_null()) return true;
  if (v.value_unsafe().get_bool().get(out)) {
    err = PdError::Malformed, detail = fmt::format("kv_transfer_params.{} must be a boolean", key);
    return false;
  }
  return true;
}

// Block ids: [id, ...] (older connectors) or [[id, ...], ...] per KV-cache
// group (newest); group 0 is kept.
bool read_block_ids(simdjson::dom::element v, std::vector<uint64_t>& out, PdError& err, std::string& detail,
                    bool top = true) {
  simdjson::dom::array a;
  if (v.get_array().get(a)) {
    err = PdError::Malformed, detail = "kv_transfer_params.remote_block_ids must be a list";
    return false;
  }
  if (top && a.size() > 0 && a.at(0).is_array()) return read_block_ids(a.at(0).value_unsafe(), out, err, detail, false);
  for (simdjson::dom::element e : a) {
    uint64_t id = 0;
    if (e.get_uint64().get(id)) {
      err = PdError::Malformed, detail = "kv_transfer_params.remote_block_ids must hold non-negative integers";
      return false;
    }
    if (out.size() >= kMaxRemoteBlocks) {
      err = PdError::TooLarge,
      detail = fmt::format("kv_transfer_params.remote_block_ids has more than {} ids", kMaxRemoteBlocks);
      return false;
    }
    out.push_back(id);
  }
  return true;
}

}  // namespace

std::optional<KvTransferParams> parse_kv_transfer_params(simdjson::dom::object body, PdError& err,
                                                         std::string& detail) {
  err = PdError::None;
  auto v = body.at_key("kv_transfer_params");
  if (v.error() || v.value_unsafe().is_null()) return std::nullopt;
  simdjson::dom::object o;
  if (v.value_unsafe().get_object().get(o)) {
    err = PdError::Malformed, detail = "kv_transfer_params must be an object";
    return std::nullopt;
  }
  if (simdjson::minify(v.value_unsafe()).size() > kMaxParamsBytes) {
    err = PdError::TooLarge, detail = fmt::format("kv_transfer_params is larger than {} bytes", kMaxParamsBytes);
    return std::nullopt;
  }
  KvTransferParams p;
  if (!read_bool(o, "do_remote_decode", p.do_remote_decode, err, detail) ||
      !read_bool(o, "do_remote_prefill", p.do_remote_prefill, err, detail) ||
      !read_string(o, "remote_engine_id", p.remote_engine_id, err, detail) ||
      !read_string(o, "remote_request_id", p.remote_request_id, err, detail) ||
      !read_string(o, "remote_host", p.remote_host, err, detail) ||
      !read_string(o, "transfer_id", p.transfer_id, err, detail) ||
      !read_string(o, "remote_bootstrap_addr", p.remote_bootstrap_addr, err, detail))
    return std::nullopt;
  auto port = o.at_key("remote_port");
  if (!port.error() && !port.value_unsafe().is_null()) {
    uint64_t n = 0;
    if (port.value_unsafe().get_uint64().get(n) || n == 0 || n > 65535) {
      err = PdError::Malformed, detail = "kv_transfer_params.remote_port must be an integer in [1, 65535]";
      return std::nullopt;
    }
    p.remote_port = static_cast<uint16_t>(n);
  }
  auto ids = o.at_key("remote_block_ids");
  if (!ids.error() && !ids.value_unsafe().is_null()) {
    p.remote_block_ids.emplace();
    if (!read_block_ids(ids.value_unsafe(), *p.remote_block_ids, err, detail)) return std::nullopt;
  }
  return p;
}

PdError check_decode_params(const KvTransferParams& p, std::string& detail) {
  // update_state_after_alloc() (pull_scheduler.py): all of these, else
  // "Got invalid KVTransferParams" (stock vLLM then computes locally).
  const char* gap = p.remote_engine_id.empty()    ? "remote_engine_id"
                    : p.remote_request_id.empty() ? "remote_request_id"
                    : p.remote_host.empty()       ? "remote_host"
                    : !p.remote_port              ? "remote_port"
                    : !p.remote_block_ids         ? "remote_block_ids"
                                                  : nullptr;
  if (!gap) return PdError::None;
  detail = fmt::format("kv_transfer_params.do_remote_prefill needs {}", gap);
  return PdError::Missing;
}

PdError check_mooncake_decode_params(const KvTransferParams& p, std::string& detail) {
  // mooncake_connector.py update_state_after_alloc(): all three, else "Got
  // invalid KVTransferParams" (stock vLLM then computes locally).
  const char* gap = p.remote_engine_id.empty()        ? "remote_engine_id"
                    : p.remote_bootstrap_addr.empty() ? "remote_bootstrap_addr"
                    : p.transfer_id.empty()           ? "transfer_id"
                                                      : nullptr;
  if (!gap) return PdError::None;
  detail = fmt::format("kv_transfer_params.do_remote_prefill needs {}", gap);
  return PdError::Missing;
}

bool parse_bootstrap_addr(std::string_view addr, std::string& host, uint16_t& port) {
  constexpr std::string_view scheme = "http://";
  if (addr.substr(0, scheme.size()) != scheme) return false;
  addr.remove_prefix(scheme.size());
  while (!addr.empty() && addr.back() == '/') addr.remove_suffix(1);
  const size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view h = addr.substr(0, colon), p = addr.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  const unsigned n = static_cast<unsigned>(std::stoul(std::string(p)));
  if (n == 0 || n > 65535) return false;
  host.assign(h);
  port = static_cast<uint16_t>(n);
  return true;
}

bool pd_host_allowed(std::string_view host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  boost::asio::ip::make_address(std::string(host), ec);
  return !ec;
}

double pd_transfer_ms(uint64_t blocks, uint32_t block_size, double kv_bytes_per_token, double link_gbps) {
  if (link_gbps <= 0) return 0;
  const double bits = double(blocks) * double(block_size) * kv_bytes_per_token * 8.0;
  return bits / (link_gbps * 1e9) * 1000.0;
}

bool TransferTable::add(Held h, double now_ms) {
  if (full() || held_.count(h.request_id)) return false;
  h.expires_ms = now_ms + lease_ms_;
  held_blocks_ += h.blocks.size();
  std::string id = h.request_id;
  held_.emplace(std::move(id), std::move(h));
  return true;
}

TransferTable::Take TransferTable::take(std::string_view request_id, const std::vector<uint64_t>& ids, double now_ms,
                                        Held& out, std::vector<SequenceHash>& hashes) {
  const std::string key(request_id);
  auto it = held_.find(key);
  if (it == held_.end()) return expired_.count(key) ? Take::Expired : Take::Unknown;
  if (it->second.expires_ms <= now_ms) return Take::Expired;  // expire() runs on its timer; never serve late
  const Held& h = it->second;
  hashes.clear();
  for (uint64_t id : ids) {
    auto pos = std::find(h.block_ids.begin(), h.block_ids.end(), id);
    if (pos == h.block_ids.end()) return Take::Forged;
    hashes.push_back(h.blocks[static_cast<size_t>(pos - h.block_ids.begin())]);
  }
  held_blocks_ -= h.blocks.size();
  out = std::move(it->second);
  held_.erase(it);
  return Take::Ok;
}

const TransferTable::Held* TransferTable::find(std::string_view request_id) const {
  auto it = held_.find(std::string(request_id));
  return it == held_.end() ? nullptr : &it->second;
}

std::optional<TransferTable::Held> TransferTable::drop(std::string_view request_id) {
  auto it = held_.find(std::string(request_id));
  if (it == held_.end()) return std::nullopt;
  held_blocks_ -= it->second.blocks.size();
  Held h = std::move(it->second);
  held_.erase(it);
  return h;
}

std::vector<TransferTable::Held> TransferTable::expire(double now_ms) {
  std::vector<Held> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.expires_ms > now_ms) {
      ++it;
      continue;
    }
    held_blocks_ -= it->second.blocks.size();
    remember_expired(it->first);
    out.push_back(std::move(it->second));
    it = held_.erase(it);
  }
  return out;
}

std::optional<double> TransferTable::next_expiry() const {
  std::optional<double> next;
  for (const auto& [id, h] : held_)
    if (!next || h.expires_ms < *next) next = h.expires_ms;
  return next;
}

void TransferTable::remember_expired(const std::string& id) {
  if (!expired_.insert(id).second) return;
  expired_order_.push_back(id);
  if (expired_order_.size() > 4096) {
    expired_.erase(expired_order_.front());
    expired_order_.pop_front();
  }
}

}  // namespace kvroute::mocker
