// Fuzz target: the configuration loader (config/config.h): apply_yaml (a YAML
// file, SIGHUP reload, PUT /admin/config), set_key (flags, environment
// variables) and validate. Every input is read as a YAML document, and, when
// it has the form "section.key=value", also as one set_key call.
// Contract checked on every input:
//   - an error is a message, and the Config is left untouched;
//   - after a success every numeric key is inside its documented range (no
//     NaN), validate() passes, and the effective configuration printed by
//     key_values() and to_yaml() loads back to the same values.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "config/config.h"
#include "config/config_schema.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

// Every numeric key within [min, max]; strings and bools trivially.
bool in_ranges(Config& c) {
  bool ok = true;
  for_each_key(c, [&](const KeyInfo& k, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (!std::is_same_v<T, std::string>) {
      const double v = static_cast<double>(field);
      if (!(v >= k.min && v <= k.max)) {
        std::fprintf(stderr, "%.*s = %g is outside [%g, %g]\n", int(k.path.size()), k.path.data(), v, k.min, k.max);
        ok = false;
      }
    }
  });
  return ok;
}

// Field-by-field equality (cheaper than comparing key_values() text).
bool same(Config& a, Config& b) {
  std::vector<const void*> fields;
  for_each_key(b, [&](const KeyInfo&, auto& field) { fields.push_back(&field); });
  size_t i = 0;
  bool eq = true;
  for_each_key(a, [&](const KeyInfo&, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if (!(field == *static_cast<const T*>(fields[i++]))) eq = false;
  });
  return eq;
}

// The lines of to_yaml()'s output that print the keys in `paths`, under their
// section headers (to_yaml prints "section:" lines, then "  key: value" lines).
std::string printed_lines(const std::string& yaml, const std::set<std::string>& paths) {
  std::string out, section, last_section;
  for (size_t start = 0; start < yaml.size();) {
    const size_t end = std::min(yaml.find('\n', start), yaml.size() - 1);
    const std::string_view line(yaml.data() + start, end - start + 1);
    start = end + 1;
    if (line[0] != ' ') {
      section = std::string(line.substr(0, line.find(':')));
      continue;
    }
    if (!paths.count(section + "." + std::string(line.substr(2, line.find(':') - 2)))) continue;
    if (section != last_section) out += section + ":\n", last_section = section;
    out += line;
  }
  return out;
}

// The defaults, and once: the whole to_yaml() and every printed value of the
// defaults load back to the defaults.
Config& checked_defaults() {
  static Config defaults = [] {
    Config d, from_yaml, from_keys;
    FUZZ_CHECK(!apply_yaml(from_yaml, to_yaml(d)).has_value());
    FUZZ_CHECK(same(from_yaml, d));
    for (const auto& [path, value] : key_values(d)) FUZZ_CHECK(!set_key(from_keys, path, value).has_value());
    FUZZ_CHECK(same(from_keys, d));
    return d;
  }();
  return defaults;
}

// The effective configuration loads back to the same values. Keys still at
// their defaults were checked once (checked_defaults); for each other key:
// numbers and booleans, its printed value (key_values) through set_key;
// strings, which need YAML quoting, its line of to_yaml() through apply_yaml.
// (Reloading the whole ~2 KB to_yaml() for every input made this target ten
// times slower: yaml-cpp scans about 4 MB/s, 2.5 ms a document under ASan.)
void check_reloads(Config& c) {
  static const auto default_values = key_values(checked_defaults());
  static const auto keys = config_keys();
  const auto values = key_values(c);
  Config reloaded;
  std::set<std::string> strings;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [path, value] = values[i];
    if (value == default_values[i].second) continue;
    if (keys[i].is_string) {
      strings.insert(path);
      continue;
    }
    const auto err = set_key(reloaded, path, value);
    if (err) std::fprintf(stderr, "printed value does not load back: %s\n", err->c_str());
    FUZZ_CHECK(!err.has_value());
  }
  if (!strings.empty()) {
    const auto err = apply_yaml(reloaded, printed_lines(to_yaml(c), strings));
    if (err) std::fprintf(stderr, "to_yaml() output does not load back: %s\n", err->c_str());
    FUZZ_CHECK(!err.has_value());
  }
  FUZZ_CHECK(same(reloaded, c));
}

void check_loaded(Config& c) {
  FUZZ_CHECK(in_ranges(c));
  FUZZ_CHECK(!validate(c).has_value());
  check_reloads(c);
}

void check_yaml(std::string_view text) {
  Config& defaults = checked_defaults();
  Config c;
  const auto err = apply_yaml(c, text);
  if (err) {
    FUZZ_CHECK(!err->empty());
    FUZZ_CHECK(same(c, defaults));
    return;
  }
  check_loaded(c);
}

void check_set_key(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq > 64) return;
  Config& defaults = checked_defaults();
  Config c;
  const auto err = set_key(c, text.substr(0, eq), text.substr(eq + 1));
  if (err) {
    FUZZ_CHECK(!err->empty());
    FUZZ_CHECK(same(c, defaults));
    return;
  }
  if (!validate(c)) check_loaded(c);
  else FUZZ_CHECK(in_ranges(c));
}

}  // namespace

// POST /admin/workers: a JSON (YAML) object or the text form, into the
// workers.static text form, which then parses as one valid entry or is an error.
void check_worker_body(std::string_view text) {
  if (text.empty() || text.front() != '{') return;  // the YAML parse is slow: JSON bodies only
  std::string entry;
  if (worker_entry_text(text, entry)) return;
  std::vector<WorkerEntry> parsed;
  if (!parse_worker_entries(entry, parsed)) {
    for (const auto& w : parsed) FUZZ_CHECK(!w.url.empty() && !w.model.empty() && w.dp_size >= 1);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_yaml(text);
  check_set_key(text);
  check_worker_body(text);
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  Config c;
  std::vector<std::string> seeds{to_yaml(c)};
  // One seed per section of the effective configuration (short inputs fuzz faster).
  const std::string full = to_yaml(c);
  for (size_t start = 0; start < full.size();) {
    size_t next = full.find("\n", start);
    while (next != std::string::npos && next + 1 < full.size() && full[next + 1] == ' ') next = full.find("\n", next + 1);
    const size_t end = next == std::string::npos ? full.size() : next + 1;
    seeds.push_back(full.substr(start, end - start));
    start = end;
  }
  c.scheduler.temperature = 0.25;
  c.scheduler.alpha_imbalanced = 1;
  c.router.port = 0;
  c.events.nats_url = "tls://nats.example:4222";
  c.admin.token = "s3cr\"et\n";
  c.log.access_log = false;
  seeds.push_back(to_yaml(c));
  seeds.push_back("# comment\nrouter: {port: 9000, threads: 4}\nscheduler:\n  gamma: 1e-3\n  temperature: 0x1p-2\n");
  seeds.push_back("defaults: &d {gamma: 0.5}\n");
  seeds.push_back("scheduler: &s\n  delta: 0.2\nrouter:\n  host: \"::\"\n");
  seeds.push_back("log: {level: debug, format: json, access_log: off}\nindexer: {approximate: yes}\n");
  for (const auto& [path, value] : key_values(Config{})) seeds.push_back(path + "=" + value);
  // Router-known workers and DNS discovery: YAML lists, the text form, an admin body.
  seeds.push_back("workers:\n  scrape_interval_ms: 100\n  static:\n    - url: http://127.0.0.1:8001\n"
                  "      model: qwen3\n      kv_events: tcp://127.0.0.1:5557\n      replay: tcp://127.0.0.1:5558\n"
                  "      dp_size: 2\n      lora: [sql-lora, chat-lora]\n"
                  "    - {url: \"http://[::1]:8002\", model: qwen3, metrics: none, id: 42}\n");
  seeds.push_back("workers:\n  - {url: http://a:1, model: m, max_seqs: 8, kv_blocks: 100}\n");
  seeds.push_back("workers.static=url=http://a:1,model=m; url=http://b:2,model=m,dp_size=4");
  seeds.push_back("discovery:\n  dns:\n    - {host: vllm.svc, port: 8000, model: m, kv_events_port: 5557}\n");
  seeds.push_back(R"({"url": "http://10.0.0.7:8000", "model": "qwen3", "dp_size": 2, "lora": ["a", "b"]})");
  return seeds;
}
