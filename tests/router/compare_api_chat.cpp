// Compares kvroute's Responses / Messages conversion + chat template with the Python
// reference (tests/tokenizer/py_reference.py: vLLM's conversion of these APIs rewritten in
// Python, then Python Jinja2 as transformers configures it).
// Usage: kvroute-api-chat-compare MODEL_DIR CASES.jsonl REF.jsonl
//   CASES: per line {"name", "api": "responses"|"messages", "body": "<request JSON text>"}
//   REF: per line {"ok": true, "text"} or {"ok": false, "error"}, same order.
// Equal when both render the same bytes, or both refuse (the parser or the template).
// Prints one line per difference, then "N/M equal"; exit 1 on any difference.
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "router/api/messages_request.h"
#include "router/api/responses_request.h"
#include "tests/tokenizer/reference_pairs.h"
#include "tokenizer/chat_template.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR CASES REF\n", argv[0]);
    return 2;
  }
  std::string err;
  auto ct = kvroute::ChatTemplate::load(argv[1], &err);
  if (!ct) {
    std::printf("load: %s\n", err.c_str());
    return 2;
  }
  return kvroute::testing::compare_with_reference(argv[2], argv[3], [&](simdjson::dom::element c, simdjson::dom::element ref) {
    const std::string name(std::string_view(c["name"].get_string().value()));
    const std::string api(std::string_view(c["api"].get_string().value()));
    const std::string body(std::string_view(c["body"].get_string().value()));
    kvroute::ParsedRequest parsed;
    kvroute::ApiError api_err;
    std::string chat_body, out, error;
    bool ok = api == "responses" ? kvroute::parse_responses_request(body, parsed, chat_body, api_err)
                                 : kvroute::parse_messages_request(body, parsed, chat_body, api_err);
    if (!ok) error = "parser: " + api_err.message;
    ok = ok && ct->render_request(parsed.body, &out, &error);
    const bool ref_ok = ref["ok"].get_bool().value();
    if (!ref_ok) {
      if (ok) std::printf("DIFF %s: ref raised \"%s\", kvroute rendered %zu bytes\n", name.c_str(),
                          std::string(std::string_view(ref["error"].get_string().value())).c_str(), out.size());
      return !ok;
    }
    const std::string want(std::string_view(ref["text"].get_string().value()));
    if (!ok) {
      std::printf("DIFF %s: kvroute raised \"%s\", ref rendered %zu bytes\n", name.c_str(), error.c_str(), want.size());
      return false;
    }
    if (out == want) return true;
    const size_t at = std::mismatch(out.begin(), out.begin() + std::min(out.size(), want.size()), want.begin()).first - out.begin();
    const size_t from = at > 60 ? at - 60 : 0;
    std::printf("DIFF %s at byte %zu (kvroute %zu bytes, ref %zu bytes)\n  ref:     %s\n  kvroute: %s\n  chat body: %s\n",
                name.c_str(), at, out.size(), want.size(), want.substr(from, 120).c_str(), out.substr(from, 120).c_str(),
                chat_body.substr(0, 400).c_str());
    return false;
  });
}
