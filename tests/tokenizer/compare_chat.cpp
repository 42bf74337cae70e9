// Compares ChatTemplate::render_request with a reference renderer (py_reference.py: Python
// Jinja2 as transformers configures it, after vLLM's preprocessing).
// Usage: kvroute-chat-compare MODEL_DIR CONVERSATIONS.jsonl REF.jsonl
//   CONVERSATIONS: per line {"name": ..., "request": <OpenAI chat body>} or {"name", "body": "<JSON text>"}
//   REF: per line {"ok": true, "text": ...} or {"ok": false, "error": ...}, same order.
// A case is equal when both render the same bytes, or both fail (e.g. raise_exception).
// Prints one line per failure with a diff excerpt, then "N/M equal"; exit 1 on any difference.
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "tests/tokenizer/reference_pairs.h"
#include "tokenizer/chat_template.h"

namespace {

std::string excerpt(const std::string& s, size_t at) {
  size_t b = at > 60 ? at - 60 : 0;
  std::string e = s.substr(b, 120), out;
  for (char c : e) {
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) { std::fprintf(stderr, "usage: %s MODEL_DIR CONVERSATIONS REF\n", argv[0]); return 2; }
  std::string err;
  auto ct = kvroute::ChatTemplate::load(argv[1], &err);
  if (!ct) { std::printf("load: %s\n", err.c_str()); return 2; }
  return kvroute::testing::compare_with_reference(argv[2], argv[3], [&](simdjson::dom::element conv, simdjson::dom::element ref) {
    std::string name(std::string_view(conv["name"].get_string().value()));
    // "body": the request's JSON text as sent (may hold numbers no 64-bit reader keeps).
    std::string request;
    if (auto body = conv["body"]; !body.error()) request = std::string(std::string_view(body.get_string().value()));
    else request = simdjson::minify(conv["request"]);
    bool ref_ok = ref["ok"].get_bool().value();
    std::string out, error;
    bool ok = ct->render_request(request, &out, &error);
    if (!ref_ok) {
      std::string ref_err(std::string_view(ref["error"].get_string().value()));
      if (ok) {
        std::printf("DIFF %s: ref raised \"%s\", kvroute rendered %zu bytes\n", name.c_str(), ref_err.c_str(), out.size());
        return false;
      }
      if (ref_err != error) std::printf("  note %s: both raise; ref: \"%s\" kvroute: \"%s\"\n", name.c_str(), ref_err.c_str(), error.c_str());
      return true;
    }
    std::string want(std::string_view(ref["text"].get_string().value()));
    if (!ok) { std::printf("DIFF %s: kvroute raised \"%s\", ref rendered %zu bytes\n", name.c_str(), error.c_str(), want.size()); return false; }
    if (out == want) return true;
    size_t at = std::mismatch(out.begin(), out.begin() + std::min(out.size(), want.size()), want.begin()).first - out.begin();
    std::printf("DIFF %s at byte %zu (kvroute %zu bytes, ref %zu bytes)\n  ref:    %s\n  kvroute: %s\n", name.c_str(), at,
                out.size(), want.size(), excerpt(want, at).c_str(), excerpt(out, at).c_str());
    return false;
  });
}
