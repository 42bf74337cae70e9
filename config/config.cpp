#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/json_escape.h"

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

std::optional<std::string> walk_yaml(Config& c, const YAML::Node& node, const std::string& prefix,
                                     std::set<std::string>& known) {
  if (!node.IsMap()) return fmt::format("{}: expected a mapping", prefix.empty() ? "<root>" : prefix);
  for (const auto& kv : node) {
    std::string key = kv.first.as<std::string>();
    std::string path = prefix.empty() ? key : prefix + "." + key;
    if (kv.second.IsMap()) {
      if (auto e = walk_yaml(c, kv.second, path, known)) return e;
      continue;
    }
    if (!known.count(path)) return fmt::format("{}: unknown key", path);
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
  if (!found) return fmt::format("{}: unknown key", path);
  return err;
}

std::optional<std::string> apply_yaml(Config& c, std::string_view yaml_text) {
  std::set<std::string> known;
  for (const auto& k : config_keys()) known.insert(std::string(k.path));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return fmt::format("config: invalid YAML at line {}: {}", e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) return std::nullopt;  // empty file: defaults
  Config next = c;
  try {
    if (auto e = walk_yaml(next, root, "", known)) return e;
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

std::optional<std::string> validate(const Config& c) {
  if (c.router.host.empty()) return "router.host: must not be empty";
  if (c.events.subject_prefix.empty() || c.events.subject_prefix.find_first_of(" *>") != std::string::npos)
    return "events.subject_prefix: must be a non-empty NATS subject without spaces or wildcards";
  if (c.admin.port != 0 && c.admin.port == c.router.port && (c.admin.host.empty() || c.admin.host == c.router.host))
    return fmt::format("admin.port: {} is also router.port; the admin API needs its own listener", c.admin.port);
  static const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error"};
  if (!levels.count(c.log.level))
    return fmt::format("log.level: '{}' is not one of trace, debug, info, warn, error", c.log.level);
  if (c.log.format != "human" && c.log.format != "json")
    return fmt::format("log.format: '{}' is not one of human, json", c.log.format);
  if (c.events.nats_url.rfind("nats://", 0) != 0 && c.events.nats_url.rfind("tls://", 0) != 0)
    return fmt::format("events.nats_url: '{}' must start with nats:// or tls://", c.events.nats_url);
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

}  // namespace kvroute
