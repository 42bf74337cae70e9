#include "config/config.h"
#include "config/config_schema.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "common/json_escape.h"
#include "common/types.h"
#include "common/url_allow_list.h"

namespace kvroute {

namespace {

std::string range_text(const KeyInfo& k) {
  return fmt::format("[{}, {}]", k.min, k.max);
}

template <class T>
std::optional<std::string> parse_into(const KeyInfo& k, std::string_view text, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    out = std::string(text);
    return std::nullopt;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true" || text == "1" || text == "yes" || text == "on") out = true;
    else if (text == "false" || text == "0" || text == "no" || text == "off") out = false;
    else return fmt::format("{}: '{}' is not a boolean (allowed: true or false)", k.path, text);
    return std::nullopt;
  } else {
    double v = 0;
    // from_chars for double is available in GCC 12.
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size())
      return fmt::format("{}: '{}' is not a number (allowed range {})", k.path, text, range_text(k));
    if (!std::isfinite(v))  // nan passes every comparison; inf is no setting either
      return fmt::format("{}: '{}' is not a finite number (allowed range {})", k.path, text, range_text(k));
    if (v < k.min || v > k.max)
      return fmt::format("{}: {} is out of range (allowed range {})", k.path, text, range_text(k));
    if constexpr (std::is_integral_v<T>) {
      if (v != static_cast<double>(static_cast<uint64_t>(v)))
        return fmt::format("{}: {} must be a whole number (allowed range {})", k.path, text, range_text(k));
      out = static_cast<T>(v);
    } else {
      out = v;
    }
    return std::nullopt;
  }
}

// A YAML list of mappings (workers.static, discovery.dns) in the keys' text
// form: entries joined by ';', fields `key=value` joined by ','; a list value
// (lora) joined by ':'.
std::optional<std::string> list_to_text(const std::string& path, const YAML::Node& seq, std::string& out) {
  out.clear();
  size_t i = 0;
  for (const auto& item : seq) {
    if (!item.IsMap()) return fmt::format("{}[{}]: expected a mapping (url: ..., model: ...)", path, i);
    if (!out.empty()) out += ';';
    bool first = true;
    for (const auto& f : item) {
      std::string value;
      if (f.second.IsSequence()) {
        for (const auto& v : f.second) value += (value.empty() ? "" : ":") + v.as<std::string>();
      } else if (f.second.IsScalar()) {
        value = f.second.Scalar();
      } else {
        return fmt::format("{}[{}].{}: expected a scalar value", path, i, f.first.as<std::string>());
      }
      if (value.find_first_of(",;") != std::string::npos)
        return fmt::format("{}[{}].{}: ',' and ';' are not allowed in values", path, i, f.first.as<std::string>());
      out += fmt::format("{}{}={}", first ? "" : ",", f.first.as<std::string>(), value);
      first = false;
    }
    ++i;
  }
  return std::nullopt;
}

bool is_list_key(const std::string& path) {
  return path == "workers.static" || path == "discovery.dns" || path == "flow.bands" || path == "flow.tenants" ||
         path == "indexer.kv_pools";
}

// The error for a key no schema entry names; a replaced key names its
// replacement.
std::string unknown_key(std::string_view path) {
  if (path == "scheduler.inflight_prefix_once")
    return "scheduler.inflight_prefix_once: unknown key (replaced by scheduler.inflight_kv: true was prefix_once, "
           "false whole)";
  return fmt::format("{}: unknown key", path);
}

// `sections` holds every key's prefixes ("scheduler"): a mapping anywhere
// else is an unknown key, so YAML aliases cannot make the walk exponential.
std::optional<std::string> walk_yaml(Config& c, const YAML::Node& node, const std::string& prefix,
                                     const std::set<std::string>& known, const std::set<std::string>& sections) {
  if (!node.IsMap()) return fmt::format("{}: expected a mapping", prefix.empty() ? "<root>" : prefix);
  for (const auto& kv : node) {
    std::string key = kv.first.as<std::string>();
    std::string path = prefix.empty() ? key : prefix + "." + key;
    if (path == "workers" && kv.second.IsSequence()) path = "workers.static";  // `workers:` given as the list
    if (path == "kv_pools") path = "indexer.kv_pools";  // the pools' documented top-level key
    if (is_list_key(path) && kv.second.IsSequence()) {
      std::string text;
      if (auto e = list_to_text(path, kv.second, text)) return e;
      if (auto e = set_key(c, path, text)) return e;
      continue;
    }
    if (kv.second.IsMap()) {
      if (!sections.count(path))
        return known.count(path) ? fmt::format("{}: expected a scalar value", path)
                                 : unknown_key(path);
      if (auto e = walk_yaml(c, kv.second, path, known, sections)) return e;
      continue;
    }
    if (!known.count(path)) return unknown_key(path);
    if (!kv.second.IsScalar()) return fmt::format("{}: expected a scalar value", path);
    if (auto e = set_key(c, path, kv.second.Scalar())) return e;
  }
  return std::nullopt;
}

}  // namespace

std::vector<KeyInfo> config_keys() {
  std::vector<KeyInfo> keys;
  Config c;
  for_each_key(c, [&](const KeyInfo& k, auto&) { keys.push_back(k); });
  return keys;
}

std::optional<std::string> set_key(Config& c, std::string_view path, std::string_view value) {
  std::optional<std::string> err;
  bool found = false;
  for_each_key(c, [&](const KeyInfo& k, auto& field) {
    if (found || k.path != path) return;
    found = true;
    err = parse_into(k, value, field);
  });
  if (!found) return unknown_key(path);
  return err;
}

std::optional<std::string> apply_yaml(Config& c, std::string_view yaml_text) {
  // The schema's key paths and their section prefixes, built once (thread-safe static init).
  static const auto [known, sections] = [] {
    std::set<std::string> keys, prefixes;
    for (const auto& k : config_keys()) {
      keys.insert(std::string(k.path));
      for (size_t dot = k.path.find('.'); dot != std::string_view::npos; dot = k.path.find('.', dot + 1))
        prefixes.insert(std::string(k.path.substr(0, dot)));
    }
    return std::pair{keys, prefixes};
  }();
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return fmt::format("config: invalid YAML at line {}: {}", e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) return std::nullopt;  // empty file: defaults
  Config next = c;
  try {
    if (auto e = walk_yaml(next, root, "", known, sections)) return e;
  } catch (const YAML::Exception& e) {
    return fmt::format("config: {}", e.msg);
  }
  if (auto e = validate(next)) return e;
  c = std::move(next);
  return std::nullopt;
}

std::optional<std::string> load_yaml_file(Config& c, const std::string& path) {
  std::ifstream in(path);
  if (!in) return fmt::format("config: cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return apply_yaml(c, ss.str());
}

std::optional<std::string> apply_env(Config& c, char** envp) {
  if (!envp) return std::nullopt;
  for (const auto& k : config_keys()) {
    std::string name = "KVROUTE_";
    for (char ch : k.path) name += ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    for (char** e = envp; *e; ++e) {
      std::string_view entry(*e);
      if (entry.size() > name.size() && entry.substr(0, name.size()) == name && entry[name.size()] == '=') {
        if (auto err = set_key(c, k.path, entry.substr(name.size() + 1)))
          return fmt::format("{} (from environment variable {})", *err, name);
      }
    }
  }
  return validate(c);
}

namespace {

// Splits "a=1,b=2;c=3" into entries of (key, value) fields.
using Fields = std::vector<std::pair<std::string, std::string>>;
std::optional<std::string> split_entries(std::string_view path, std::string_view text, std::vector<Fields>& out) {
  out.clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view entry = text.substr(start, end - start);
    while (!entry.empty() && std::isspace(static_cast<unsigned char>(entry.front()))) entry.remove_prefix(1);
    while (!entry.empty() && std::isspace(static_cast<unsigned char>(entry.back()))) entry.remove_suffix(1);
    if (!entry.empty()) {
      Fields fields;
      size_t fs = 0;
      while (fs <= entry.size()) {
        size_t fe = entry.find(',', fs);
        if (fe == std::string_view::npos) fe = entry.size();
        std::string_view field = entry.substr(fs, fe - fs);
        const size_t eq = field.find('=');
        if (eq == std::string_view::npos || eq == 0)
          return fmt::format("{}: entry {}: '{}' is not key=value", path, out.size() + 1, field);
        fields.emplace_back(std::string(field.substr(0, eq)), std::string(field.substr(eq + 1)));
        fs = fe + 1;
      }
      out.push_back(std::move(fields));
    }
    start = end + 1;
  }
  return std::nullopt;
}

template <class T>
std::optional<std::string> parse_uint(std::string_view path, size_t entry, std::string_view key, std::string_view v,
                                      uint64_t min, uint64_t max, T& out) {
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < min || x > max)
    return fmt::format("{}: entry {}: {}='{}' is not a whole number in [{}, {}]", path, entry, key, v, min, max);
  out = static_cast<T>(x);
  return std::nullopt;
}

std::vector<std::string> split_colon(std::string_view v) {
  std::vector<std::string> out;
  size_t s = 0;
  while (s <= v.size()) {
    size_t e = v.find(':', s);
    if (e == std::string_view::npos) e = v.size();
    if (e > s) out.emplace_back(v.substr(s, e - s));
    s = e + 1;
  }
  return out;
}

bool valid_http_url(std::string_view u) {
  return (u.rfind("http://", 0) == 0 && u.size() > 7) || (u.rfind("https://", 0) == 0 && u.size() > 8);
}
bool valid_zmq_endpoint(std::string_view e) {
  return e.empty() || e.rfind("tcp://", 0) == 0 || e.rfind("ipc://", 0) == 0;
}

}  // namespace

std::optional<std::string> worker_entry_text(std::string_view body, std::string& out) {
  YAML::Node node;
  try {
    node = YAML::Load(std::string(body));
  } catch (const YAML::Exception& e) {
    return fmt::format("worker: invalid JSON/YAML: {}", e.msg);
  }
  if (node.IsScalar()) {
    out = node.Scalar();
    return std::nullopt;
  }
  if (!node.IsMap()) return std::string("worker: expected an object {\"url\": ..., \"model\": ...}");
  YAML::Node seq(YAML::NodeType::Sequence);
  seq.push_back(node);
  try {
    return list_to_text("worker", seq, out);
  } catch (const YAML::Exception& e) {
    return fmt::format("worker: {}", e.msg);
  }
}

uint64_t worker_id_for_url(std::string_view url) {
  // FNV-1a with this (non-standard) offset basis: stable across versions and
  // platforms (an id may be stored by operators), so never changed.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : url) h = (h ^ ch) * 1099511628211ull;
  return h & 0x7fffffffffffffffull;
}

namespace {

// One field of an entry's text form: its name, where it goes, and for a
// number its range. A list field takes ':'-separated names.
template <class E>
struct EntryField {
  using Member = std::variant<std::string E::*, std::vector<std::string> E::*, uint32_t E::*, uint64_t E::*>;
  std::string_view name;
  Member member;
  uint64_t min = 0, max = 0;
};

// Parses `text` (entries split by ';', fields `key=value` split by ',') into
// `out` with `fields` (in the order the error message lists them), then
// `check(entry, n, previous entries)` validates each whole entry. The first
// error names the key path, the entry and the field.
template <class E, size_t N, class Check>
std::optional<std::string> parse_entries(std::string_view path, std::string_view text,
                                         const std::array<EntryField<E>, N>& fields, Check&& check,
                                         std::vector<E>& out) {
  std::vector<Fields> entries;
  if (auto e = split_entries(path, text, entries)) return e;
  out.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    E entry;
    const size_t n = i + 1;
    for (const auto& kv : entries[i]) {
      // Named, not a structured binding: clang before 16 cannot capture one.
      const auto& k = kv.first;
      const auto& v = kv.second;
      const auto f = std::find_if(fields.begin(), fields.end(), [&](const EntryField<E>& x) { return x.name == k; });
      if (f == fields.end()) {
        std::string allowed;
        for (const auto& x : fields) allowed += (allowed.empty() ? "" : ", ") + std::string(x.name);
        return fmt::format("{}: entry {}: unknown field '{}' (allowed: {})", path, n, k, allowed);
      }
      std::optional<std::string> err;
      std::visit(
          [&](auto member) {
            using T = std::remove_reference_t<decltype(entry.*member)>;
            if constexpr (std::is_same_v<T, std::string>) entry.*member = v;
            else if constexpr (std::is_same_v<T, std::vector<std::string>>) entry.*member = split_colon(v);
            else err = parse_uint(path, n, k, v, f->min, f->max, entry.*member);
          },
          f->member);
      if (err) return err;
    }
    if (auto err = check(entry, n, out)) return err;
    out.push_back(std::move(entry));
  }
  return std::nullopt;
}

using W = WorkerEntry;
const std::array<EntryField<W>, 12> kWorkerFields{{
    {"url", &W::url},
    {"model", &W::model},
    {"metrics", &W::metrics},
    {"kv_events", &W::kv_events},
    {"replay", &W::replay},
    {"dp_size", &W::dp_size, 1, 1024},
    {"max_seqs", &W::max_seqs, 1, 10000000},
    {"kv_blocks", &W::kv_blocks, 0, uint64_t{1} << 40},
    {"lora", &W::lora},
    {"id", &W::id, 1, ~0ull >> 1},
    {"role", &W::role},
    {"bootstrap_port", &W::bootstrap_port, 1, 65535},
}};

using D = DnsEntry;
const std::array<EntryField<D>, 13> kDnsFields{{
    {"host", &D::host},
    {"port", &D::port, 1, 65535},
    {"scheme", &D::scheme},
    {"model", &D::model},
    {"kv_events_port", &D::kv_events_port, 0, 65535},
    {"replay_port", &D::replay_port, 0, 65535},
    {"metrics_path", &D::metrics_path},
    {"dp_size", &D::dp_size, 1, 1024},
    {"max_seqs", &D::max_seqs, 1, 10000000},
    {"kv_blocks", &D::kv_blocks, 0, uint64_t{1} << 40},
    {"lora", &D::lora},
    {"role", &D::role},
    {"bootstrap_port", &D::bootstrap_port, 1, 65535},
}};

// A role field names one of the WorkerRole values.
std::optional<std::string> check_role(std::string_view path, size_t n, const std::string& role) {
  WorkerRole r;
  if (parse_worker_role(role, r)) return std::nullopt;
  return fmt::format("{}: entry {}: role '{}' is not one of both, prefill, decode", path, n, role);
}

using B = BandEntry;
const std::array<EntryField<B>, 4> kBandFields{{
    {"name", &B::name},
    {"max_priority", &B::max_priority},
    {"max_queued", &B::max_queued, 0, 10000000},
    {"reserve_pct", &B::reserve_pct, 0, 99},
}};

using T = TenantEntry;
const std::array<EntryField<T>, 6> kTenantFields{{
    {"name", &T::name},
    {"weight", &T::weight, 1, 1000},
    {"rps", &T::rps, 0, 10000000},
    {"burst", &T::burst, 0, 100000000},
    {"tps", &T::tps, 0, uint64_t{1} << 40},
    {"cache_salt", &T::cache_salt},
}};

using P = PoolEntry;
const std::array<EntryField<P>, 7> kPoolFields{{
    {"name", &P::name},
    {"medium", &P::medium},
    {"workers", &P::workers},
    {"bandwidth_mb_s", &P::bandwidth_mb_s, 1, uint64_t{1} << 30},
    {"kv_bytes_per_token", &P::kv_bytes_per_token, 1, uint64_t{1} << 24},
    {"prefill_tokens_per_s", &P::prefill_tokens_per_s, 1, uint64_t{1} << 30},
    {"max_blocks", &P::max_blocks, 0, uint64_t{1} << 40},
}};

// A name an operator reads in metrics labels and the status page.
bool valid_flow_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

}  // namespace

std::optional<std::string> parse_band_entries(std::string_view text, std::vector<BandEntry>& out) {
  constexpr std::string_view P = "flow.bands";
  auto check = [&](BandEntry& b, size_t n, const std::vector<BandEntry>& prev) -> std::optional<std::string> {
    if (!valid_flow_name(b.name))
      return fmt::format("{}: entry {}: name '{}' must be 1-64 letters, digits, '_' or '-'", P, n, b.name);
    for (const auto& p : prev) {
      if (p.name == b.name) return fmt::format("{}: entry {}: duplicate band '{}'", P, n, b.name);
      if (!p.bounded) return fmt::format("{}: entry {}: band '{}' has no max_priority, so it must be last", P, n - 1, p.name);
    }
    if (!b.max_priority.empty()) {
      const char* first = b.max_priority.data();
      const char* last = first + b.max_priority.size();
      const auto [ptr, ec] = std::from_chars(first, last, b.max_priority_value);
      if (ec != std::errc() || ptr != last)
        return fmt::format("{}: entry {}: max_priority '{}' is not an integer", P, n, b.max_priority);
      b.bounded = true;
      if (!prev.empty() && prev.back().max_priority_value >= b.max_priority_value)
        return fmt::format("{}: entry {}: max_priority must grow from band to band (highest band first)", P, n);
    }
    if (prev.size() >= 16) return fmt::format("{}: at most 16 bands", P);
    if (prev.empty() && b.reserve_pct != 0)
      return fmt::format("{}: entry {}: the first band has no higher band to keep a reserve for (reserve_pct 0)", P, n);
    if (!prev.empty() && b.reserve_pct < prev.back().reserve_pct)
      return fmt::format("{}: entry {}: reserve_pct {} is below the band above's ({}): a lower band may not take "
                         "room a higher one may not",
                         P, n, b.reserve_pct, prev.back().reserve_pct);
    return std::nullopt;
  };
  if (auto e = parse_entries(P, text, kBandFields, check, out)) return e;
  if (out.empty()) return fmt::format("{}: at least one band is required", P);
  return std::nullopt;
}

std::optional<std::string> parse_tenant_entries(std::string_view text, std::vector<TenantEntry>& out) {
  constexpr std::string_view P = "flow.tenants";
  auto check = [&](const TenantEntry& t, size_t n, const std::vector<TenantEntry>& prev) -> std::optional<std::string> {
    if (!valid_flow_name(t.name))
      return fmt::format("{}: entry {}: name '{}' must be 1-64 letters, digits, '_' or '-'", P, n, t.name);
    for (const auto& p : prev)
      if (p.name == t.name) return fmt::format("{}: entry {}: duplicate tenant '{}'", P, n, t.name);
    if (t.cache_salt.size() > 256) return fmt::format("{}: entry {}: cache_salt longer than 256 bytes", P, n);
    if (t.cache_salt.find_first_of("\"\\") != std::string::npos || std::any_of(t.cache_salt.begin(), t.cache_salt.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
      return fmt::format("{}: entry {}: cache_salt must not hold quotes, backslashes or control characters", P, n);
    if (prev.size() >= 1000) return fmt::format("{}: at most 1000 tenants", P);
    return std::nullopt;
  };
  return parse_entries(P, text, kTenantFields, check, out);
}

std::optional<std::string> parse_worker_entries(std::string_view text, std::vector<WorkerEntry>& out) {
  constexpr std::string_view P = "workers.static";
  auto check = [&](WorkerEntry& w, size_t n, const std::vector<WorkerEntry>& prev) -> std::optional<std::string> {
    if (!valid_http_url(w.url)) return fmt::format("{}: entry {}: url '{}' must start with http:// or https://", P, n, w.url);
    if (w.model.empty()) return fmt::format("{}: entry {}: model is required", P, n);
    if (!valid_zmq_endpoint(w.kv_events) || !valid_zmq_endpoint(w.replay))
      return fmt::format("{}: entry {}: kv_events and replay must be tcp:// or ipc:// endpoints", P, n);
    if (w.metrics.empty()) w.metrics = w.url + "/metrics";
    else if (w.metrics != "none" && !valid_http_url(w.metrics))
      return fmt::format("{}: entry {}: metrics '{}' must be an http(s) URL or 'none'", P, n, w.metrics);
    if (auto e = check_role(P, n, w.role)) return e;
    if (w.id == 0) w.id = worker_id_for_url(w.url);
    for (const auto& p : prev)
      if (p.id == w.id || p.url == w.url)
        return fmt::format("{}: entry {}: duplicate worker (url {} / id {})", P, n, w.url, w.id);
    return std::nullopt;
  };
  return parse_entries(P, text, kWorkerFields, check, out);
}

std::optional<std::string> parse_pool_entries(std::string_view text, std::vector<PoolEntry>& out) {
  constexpr std::string_view P = "indexer.kv_pools";
  auto check = [&](PoolEntry& p, size_t n, const std::vector<PoolEntry>& prev) -> std::optional<std::string> {
    if (!valid_flow_name(p.name))
      return fmt::format("{}: entry {}: name '{}' must be 1-64 letters, digits, '_' or '-'", P, n, p.name);
    if (p.medium.empty() || p.medium.size() > kMaxMediumBytes)
      return fmt::format("{}: entry {}: medium must be 1-{} bytes (the name the members' KV events give it)", P, n,
                         kMaxMediumBytes);
    if (p.bandwidth_mb_s == 0) return fmt::format("{}: entry {}: bandwidth_mb_s is required (1-{})", P, n, 1u << 30);
    if (p.kv_bytes_per_token == 0)
      return fmt::format("{}: entry {}: kv_bytes_per_token is required (1-{})", P, n, 1u << 24);
    if (p.workers.empty()) return fmt::format("{}: entry {}: workers (member worker ids) is required", P, n);
    if (p.workers.size() > 4096) return fmt::format("{}: entry {}: at most 4096 workers per pool", P, n);
    p.worker_ids.clear();
    for (const auto& w : p.workers) {
      uint64_t id = 0;
      const auto [ptr, ec] = std::from_chars(w.data(), w.data() + w.size(), id);
      if (ec != std::errc() || ptr != w.data() + w.size() || id == 0 || id > (~0ull >> 1))
        return fmt::format("{}: entry {}: worker id '{}' is not an integer from 1 to {}", P, n, w, ~0ull >> 1);
      if (std::find(p.worker_ids.begin(), p.worker_ids.end(), id) != p.worker_ids.end())
        return fmt::format("{}: entry {}: worker {} listed twice", P, n, id);
      p.worker_ids.push_back(id);
    }
    for (const auto& q : prev) {
      if (q.name == p.name) return fmt::format("{}: entry {}: duplicate pool '{}'", P, n, p.name);
      for (uint64_t id : p.worker_ids)
        if (std::find(q.worker_ids.begin(), q.worker_ids.end(), id) != q.worker_ids.end())
          return fmt::format("{}: entry {}: worker {} already mounts pool '{}' (a worker mounts one pool at most)", P,
                             n, id, q.name);
    }
    if (prev.size() >= kMaxPools) return fmt::format("{}: at most {} pools", P, kMaxPools);
    return std::nullopt;
  };
  return parse_entries(P, text, kPoolFields, check, out);
}

double pool_tier_weight(const PoolEntry& p) {
  if (p.bandwidth_mb_s == 0 || p.prefill_tokens_per_s == 0) return 0;
  const double load_s = static_cast<double>(p.kv_bytes_per_token) / (static_cast<double>(p.bandwidth_mb_s) * 1e6);
  const double recompute_s = 1.0 / static_cast<double>(p.prefill_tokens_per_s);
  return std::clamp(1.0 - load_s / recompute_s, 0.0, 1.0);
}

void apply_pool_weights(Config& cfg) {
  cfg.scheduler.tier_weight_pool.fill(0);
  std::vector<PoolEntry> pools;
  if (parse_pool_entries(cfg.indexer.kv_pools, pools)) return;  // validate() reports it
  for (size_t i = 0; i < pools.size(); ++i) cfg.scheduler.tier_weight_pool[i] = pool_tier_weight(pools[i]);
}

std::optional<std::string> parse_dns_entries(std::string_view text, std::vector<DnsEntry>& out) {
  constexpr std::string_view P = "discovery.dns";
  auto check = [&](const DnsEntry& d, size_t n, const std::vector<DnsEntry>&) -> std::optional<std::string> {
    if (d.host.empty()) return fmt::format("{}: entry {}: host is required", P, n);
    if (d.model.empty()) return fmt::format("{}: entry {}: model is required", P, n);
    if (d.scheme != "http" && d.scheme != "https")
      return fmt::format("{}: entry {}: scheme '{}' is not http or https", P, n, d.scheme);
    if (d.metrics_path.empty() || (d.metrics_path != "none" && d.metrics_path[0] != '/'))
      return fmt::format("{}: entry {}: metrics_path must start with '/' (or be 'none')", P, n);
    if (auto e = check_role(P, n, d.role)) return e;
    return std::nullopt;
  };
  return parse_entries(P, text, kDnsFields, check, out);
}

std::optional<std::string> validate(const Config& c) {
  if (c.router.host.empty()) return "router.host: must not be empty";
  {
    std::vector<WorkerEntry> w;
    if (auto e = parse_worker_entries(c.workers.static_list, w)) return e;
    std::vector<DnsEntry> d;
    if (auto e = parse_dns_entries(c.discovery.dns, d)) return e;
    std::vector<BandEntry> b;
    if (auto e = parse_band_entries(c.flow.bands, b)) return e;
    std::vector<TenantEntry> t;
    if (auto e = parse_tenant_entries(c.flow.tenants, t)) return e;
    std::vector<PoolEntry> p;
    if (auto e = parse_pool_entries(c.indexer.kv_pools, p)) return e;
  }
  if (c.workers.eject_max_ms < c.workers.eject_base_ms)
    return fmt::format("workers.eject_max_ms: {} must be >= workers.eject_base_ms ({})", c.workers.eject_max_ms,
                       c.workers.eject_base_ms);
  if (c.events.subject_prefix.empty() || c.events.subject_prefix.find_first_of(" *>") != std::string::npos)
    return "events.subject_prefix: must be a non-empty NATS subject without spaces or wildcards";
  // The same port on overlapping addresses (equal, or one of them every address).
  const auto any = [](const std::string& h) { return h == "0.0.0.0" || h == "::"; };
  if (c.admin.port != 0 && c.admin.port == c.router.port &&
      (c.admin.host.empty() || c.admin.host == c.router.host || any(c.admin.host) || any(c.router.host)))
    return fmt::format("admin.port: {} is also router.port; the admin API needs its own listener", c.admin.port);
  static const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error"};
  if (!levels.count(c.log.level))
    return fmt::format("log.level: '{}' is not one of trace, debug, info, warn, error", c.log.level);
  if (c.scheduler.cost != "weighted" && c.scheduler.cost != "predicted_ttft")
    return fmt::format("scheduler.cost: '{}' is not one of weighted, predicted_ttft", c.scheduler.cost);
  if (c.scheduler.inflight_kv != "distinct" && c.scheduler.inflight_kv != "prefix_once" &&
      c.scheduler.inflight_kv != "whole")
    return fmt::format("scheduler.inflight_kv: '{}' is not one of distinct, prefix_once, whole",
                       c.scheduler.inflight_kv);
  if (c.pd.policy != "conditional" && c.pd.policy != "always" && c.pd.policy != "never")
    return fmt::format("pd.policy: '{}' is not one of conditional, always, never", c.pd.policy);
  if (PdProtocol p; !parse_pd_protocol(c.pd.protocol, p))
    return fmt::format("pd.protocol: '{}' is not one of vllm_nixl, vllm_mooncake, sglang", c.pd.protocol);
  if (auto e = check_model_protocols(c.pd.model_protocols)) return "pd.model_protocols: " + *e;
  if (c.pd.decode_alpha != -1 && !(c.pd.decode_alpha >= 0 && c.pd.decode_alpha <= 1))
    return fmt::format("pd.decode_alpha: {} is neither -1 (the scheduler's alpha) nor within 0-1", c.pd.decode_alpha);
  if (c.pd.on_prefill_failure != "fallback" && c.pd.on_prefill_failure != "fail")
    return fmt::format("pd.on_prefill_failure: '{}' is not one of fallback, fail", c.pd.on_prefill_failure);
  if (c.tokenizer.remote != "auto" && c.tokenizer.remote != "off")
    return fmt::format("tokenizer.remote: '{}' is not one of auto, off", c.tokenizer.remote);
  if (c.log.format != "human" && c.log.format != "json")
    return fmt::format("log.format: '{}' is not one of human, json", c.log.format);
  if (!c.events.nats_url.empty() && c.events.nats_url.rfind("nats://", 0) != 0 &&
      c.events.nats_url.rfind("tls://", 0) != 0)
    return fmt::format("events.nats_url: '{}' must start with nats:// or tls:// (or be empty: no NATS)",
                       c.events.nats_url);
  if (c.router.max_body_bytes_in_flight < c.router.max_body_bytes)
    return fmt::format("router.max_body_bytes_in_flight: {} must be >= router.max_body_bytes ({}): a body of the "
                       "largest size must fit",
                       c.router.max_body_bytes_in_flight, c.router.max_body_bytes);
  if (std::string e; !UrlAllowList::parse(c.events.worker_url_allow, &e))
    return fmt::format("events.worker_url_allow: {} (entries: CIDR, IP, http://host:port, or *)", e);
  if (c.events.resync_backoff_max_ms < c.events.resync_backoff_ms)
    return fmt::format("events.resync_backoff_max_ms: {} must be >= events.resync_backoff_ms ({})",
                       c.events.resync_backoff_max_ms, c.events.resync_backoff_ms);
  if (!c.events.nats_creds_file.empty() + !c.events.nats_nkey_seed_file.empty() + !c.events.nats_token.empty() +
          !c.events.nats_user.empty() > 1)
    return "events.nats_user / nats_token / nats_creds_file / nats_nkey_seed_file: set at most one way to authenticate";
  if (c.events.nats_tls_cert_file.empty() != c.events.nats_tls_key_file.empty())
    return "events.nats_tls_cert_file and events.nats_tls_key_file: set both (mutual TLS) or neither";
  if (!c.router.worker_api_key_file.empty() && !c.router.worker_api_key_env.empty())
    return "router.worker_api_key_file and router.worker_api_key_env: set at most one";
  if (c.router.forward_client_credentials && !c.flow.keys_file.empty())
    return "router.forward_client_credentials: cannot be true with flow.keys_file set (the clients' keys are "
           "kvroute's, never a worker's)";
  if (c.router.forward_client_credentials && (!c.router.worker_api_key_file.empty() || !c.router.worker_api_key_env.empty()))
    return "router.forward_client_credentials: cannot be true with a worker key (router.worker_api_key_file / "
           "router.worker_api_key_env): workers get that key";
  if (c.scheduler.alpha_imbalanced < c.scheduler.alpha_balanced)
    return fmt::format("scheduler.alpha_imbalanced: {} must be >= scheduler.alpha_balanced ({})",
                       c.scheduler.alpha_imbalanced, c.scheduler.alpha_balanced);
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> key_values(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for_each_key(const_cast<Config&>(c), [&](const KeyInfo& k, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, std::string>) out.emplace_back(k.path, field);
    else out.emplace_back(k.path, fmt::format("{}", field));
  });
  return out;
}

std::optional<std::string> check_reload(const Config& current, const Config& next) {
  const auto a = key_values(current), b = key_values(next);
  const auto keys = config_keys();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second != b[i].second && !keys[i].reloadable)
      return fmt::format("{}: cannot change at runtime (restart kvroute to change it)", a[i].first);
  }
  return std::nullopt;
}

std::string to_yaml(const Config& c) {
  std::string out;
  std::string section;
  for_each_key(const_cast<Config&>(c), [&](const KeyInfo& k, auto& field) {
    auto dot = k.path.find('.');
    std::string sec(k.path.substr(0, dot));
    if (sec != section) {
      out += sec + ":\n";
      section = sec;
    }
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, std::string>)
      out += fmt::format("  {}: \"{}\"\n", k.path.substr(dot + 1), json_escape(field));
    else if constexpr (std::is_same_v<T, bool>)
      out += fmt::format("  {}: {}\n", k.path.substr(dot + 1), field ? "true" : "false");
    else
      out += fmt::format("  {}: {}\n", k.path.substr(dot + 1), field);
  });
  return out;
}

// ---- pd

std::string_view to_string(PdProtocol p) {
  switch (p) {
    case PdProtocol::VllmNixl: return "vllm_nixl";
    case PdProtocol::VllmMooncake: return "vllm_mooncake";
    case PdProtocol::Sglang: return "sglang";
  }
  return "vllm_nixl";
}

bool parse_pd_protocol(std::string_view s, PdProtocol& out) {
  if (s == "vllm_nixl") out = PdProtocol::VllmNixl;
  else if (s == "vllm_mooncake") out = PdProtocol::VllmMooncake;
  else if (s == "sglang") out = PdProtocol::Sglang;
  else return false;
  return true;
}

namespace {
// Calls f(model, protocol text) for each entry of pd.model_protocols; stops
// and returns false at the first f() that returns false.
template <class F>
bool for_each_model_protocol(std::string_view text, F&& f) {
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view entry = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    if (entry.empty()) continue;
    const size_t eq = entry.rfind('=');
    if (!f(eq == std::string_view::npos ? entry : entry.substr(0, eq),
           eq == std::string_view::npos ? std::string_view() : entry.substr(eq + 1)))
      return false;
  }
  return true;
}
}  // namespace

std::optional<std::string> check_model_protocols(std::string_view text) {
  std::optional<std::string> err;
  for_each_model_protocol(text, [&](std::string_view model, std::string_view proto) {
    PdProtocol p;
    if (model.empty()) err = fmt::format("entry '{}={}' names no model", model, proto);
    else if (!parse_pd_protocol(proto, p))
      err = fmt::format("model '{}': '{}' is not one of vllm_nixl, vllm_mooncake, sglang", model, proto);
    return !err;
  });
  return err;
}

PdProtocol pd_protocol_of(const PdConfig& pd, std::string_view model) {
  PdProtocol out = PdProtocol::VllmNixl;
  parse_pd_protocol(pd.protocol, out);
  if (pd.model_protocols.empty()) return out;
  for_each_model_protocol(pd.model_protocols, [&](std::string_view m, std::string_view proto) {
    if (m != model) return true;
    parse_pd_protocol(proto, out);
    return false;
  });
  return out;
}

}  // namespace kvroute
