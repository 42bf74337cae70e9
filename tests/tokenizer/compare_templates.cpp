// Compares jinja::Template with Python Jinja2 (py_reference.py templates) on one-line templates.
// Usage: kvroute-template-compare CASES.jsonl REF.jsonl
//   CASES: per line {"template": str, "context": "<JSON object text>"}; REF: {"ok", "text"|"error"}.
// Equal: same bytes, or both fail. Prints each difference, then "N/M equal"; exit 1 on any.
#include <simdjson.h>

#include <cstdio>
#include <string>

#include "tests/tokenizer/reference_pairs.h"
#include "tokenizer/jinja.h"

int main(int argc, char** argv) {
  if (argc != 3) { std::fprintf(stderr, "usage: %s CASES REF\n", argv[0]); return 2; }
  return kvroute::testing::compare_with_reference(argv[1], argv[2], [](simdjson::dom::element cs, simdjson::dom::element ref) {
    std::string tpl(std::string_view(cs["template"].get_string().value()));
    std::string ctx(std::string_view(cs["context"].get_string().value()));
    bool ref_ok = ref["ok"].get_bool().value();
    std::string out, err;
    auto t = kvroute::jinja::Template::parse(tpl, &err);
    bool ok = t && t->render_json(ctx, &out, &err);
    if (!ref_ok) {
      if (ok)
        std::printf("DIFF %s  ctx %s: python raised \"%s\", kvroute rendered \"%s\"\n", tpl.c_str(), ctx.c_str(),
                    std::string(std::string_view(ref["error"].get_string().value())).c_str(), out.c_str());
      return !ok;
    }
    std::string want(std::string_view(ref["text"].get_string().value()));
    if (ok && out == want) return true;
    std::printf("DIFF %s  ctx %s\n  python:  %s\n  kvroute: %s\n", tpl.c_str(), ctx.c_str(), want.c_str(),
                ok ? out.c_str() : ("ERROR " + err).c_str());
    return false;
  });
}
