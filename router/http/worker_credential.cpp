// WorkerCredential (worker_credential.h): reading the worker key.
#include "router/http/worker_credential.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>

#include "common/log.h"

namespace kvroute {

namespace {

constexpr size_t kMaxKeyBytes = 4096;

// The key as it goes into `Authorization: Bearer <key>`: trimmed of
// surrounding whitespace; every byte visible ASCII (a CR or LF would split
// the header; a space would make another scheme parameter).
std::optional<std::string> check_key(std::string_view source, std::string& key) {
  while (!key.empty() && (key.back() == ' ' || key.back() == '\t' || key.back() == '\r' || key.back() == '\n'))
    key.pop_back();
  size_t lead = 0;
  while (lead < key.size() && (key[lead] == ' ' || key[lead] == '\t')) ++lead;
  key.erase(0, lead);
  if (key.empty()) return fmt::format("{}: the key is empty", source);
  if (key.size() > kMaxKeyBytes) return fmt::format("{}: the key is longer than {} bytes", source, kMaxKeyBytes);
  for (const char c : key)
    if (c < 0x21 || c > 0x7e)
      return fmt::format("{}: the key must be visible ASCII without spaces (it goes into a header)", source);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> WorkerCredential::read_key(const RouterConfig& rc, Key& out) {
  std::string key;
  if (!rc.worker_api_key_file.empty()) {
    std::ifstream in(rc.worker_api_key_file);
    if (!in) return fmt::format("router.worker_api_key_file: cannot read '{}'", rc.worker_api_key_file);
    std::getline(in, key);
    if (key.size() > kMaxKeyBytes + 2)
      return fmt::format("router.worker_api_key_file: the key is longer than {} bytes", kMaxKeyBytes);
    if (auto e = check_key("router.worker_api_key_file", key)) return e;
  } else if (!rc.worker_api_key_env.empty()) {
    const char* v = std::getenv(rc.worker_api_key_env.c_str());
    if (!v) return fmt::format("router.worker_api_key_env: the environment has no '{}'", rc.worker_api_key_env);
    key = v;
    if (auto e = check_key("router.worker_api_key_env", key)) return e;
  } else {
    out = Key{};
    return std::nullopt;
  }
  out.authorization = "Bearer " + key;
  out.fields = "Authorization: " + out.authorization + "\r\n";
  return std::nullopt;
}

std::optional<std::string> WorkerCredential::reload(const std::shared_ptr<const Config>& cfg) {
  auto key = std::make_shared<Key>();
  auto e = read_key(cfg->router, *key);
  std::lock_guard lock(mu_);
  for_ = cfg.get();
  for_holder_ = cfg;
  if (!e) key_ = std::move(key);
  else reload_failures_.fetch_add(1, std::memory_order_relaxed);
  return e;
}

std::shared_ptr<const WorkerCredential::Key> WorkerCredential::get(const std::shared_ptr<const Config>& cfg) {
  {
    std::lock_guard lock(mu_);
    if (cfg.get() == for_) return key_;
  }
  if (auto e = reload(cfg)) {
    static RateLimiter rl;
    if (rl.allow()) spdlog::warn("{}; workers keep getting the previous key", *e);
  }
  std::lock_guard lock(mu_);
  return key_;
}

}  // namespace kvroute
