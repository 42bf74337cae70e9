#include "common/log.h"

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/json_escape.h"

namespace kvroute {

namespace {

std::atomic<bool> g_json{false};

// %* : the message, JSON-escaped (for the JSON line format).
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string s = json_escape(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

// %* in the human format: the message with control characters escaped (\n,
// \r, \t, \xNN), so text from a client, a worker or the bus (a model name,
// a URL) can never start a forged log line or rewrite the terminal.
class EscapedMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char ch : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto u = static_cast<unsigned char>(ch);
      if (u >= 0x20 && u != 0x7f && ch != '\\') {
        dest.push_back(ch);
        continue;
      }
      const char* esc = ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : ch == '\\' ? "\\\\" : nullptr;
      if (esc) {
        dest.append(esc, esc + 2);
      } else {
        const char hex[4] = {'\\', 'x', kHex[u >> 4], kHex[u & 15]};
        dest.append(hex, hex + 4);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedMessageFlag>(); }
};

std::string now_iso8601() {
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

}  // namespace

void setup_logging(std::string_view level, std::string_view format) {
  auto logger = spdlog::default_logger();
  // Logs go to stderr; stdout carries only the "listening on" line.
  if (logger->name() != "kvroute") {
    logger = std::make_shared<spdlog::logger>("kvroute", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    spdlog::set_default_logger(logger);
  }
  logger->set_level(spdlog::level::from_str(std::string(level)));
  const bool json = format == "json";
  g_json.store(json);
  if (json) {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","msg":"%*"})");
    logger->set_formatter(std::move(f));
  } else {
    auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    f->add_flag<EscapedMessageFlag>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %*");
    logger->set_formatter(std::move(f));
  }
}

void log_access(const AccessRecord& r) {
  auto logger = spdlog::default_logger();
  if (!logger->should_log(spdlog::level::info)) return;
  if (g_json.load()) {
    // A complete JSON object per line, written raw (not wrapped in "msg").
    std::string line = fmt::format(
        R"({{"ts":"{}","level":"info","msg":"access","method":"{}","path":"{}","model":"{}","status":{},"worker":{},"prompt_tokens":{},"cached_tokens":{},"attempts":{},"ttfb_ms":{},"duration_ms":{:.3f},"stream":{},"outcome":"{}"}})",
        now_iso8601(), json_escape(r.method), json_escape(r.path), json_escape(r.model), r.status,
        r.worker < 0 ? std::string("null") : std::to_string(r.worker), r.prompt_tokens, r.cached_tokens, r.attempts,
        r.ttfb_ms < 0 ? std::string("null") : fmt::format("{:.3f}", r.ttfb_ms), r.duration_ms, r.stream,
        json_escape(r.outcome));
    std::fprintf(stderr, "%s\n", line.c_str());
  } else {
    logger->info("access {} {} status={} model={} worker={} prompt_tokens={} cached_tokens={} attempts={} ttfb_ms={} "
                 "duration_ms={:.3f} stream={} outcome={}",
                 r.method, r.path, r.status, r.model, r.worker < 0 ? std::string("-") : std::to_string(r.worker),
                 r.prompt_tokens, r.cached_tokens, r.attempts,
                 r.ttfb_ms < 0 ? std::string("-") : fmt::format("{:.3f}", r.ttfb_ms), r.duration_ms, r.stream,
                 r.outcome);
  }
}

bool RateLimiter::allow() {
  if (seen_.fetch_add(1, std::memory_order_relaxed) < burst_) return true;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now >= next && next_ns_.compare_exchange_strong(next, now + interval_ns_)) {
    suppressed_.store(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace kvroute
