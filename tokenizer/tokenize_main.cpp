// kvroute-tokenize: what kvroute computes for a request, for operators to
// check against their engine. Reads JSON lines (stdin or --input):
//   {"text": "..."}                              a completion prompt (special tokens added)
//   {"messages": [...], "tools": [...], ...}     a chat request (template, then no special tokens)
// An "add_special_tokens" field overrides the default, as in vLLM. Prints one
// line per input line: the JSON array of token ids; with --block-size N (or
// --show-prompt) an object {"tokens": [...], "block_hashes": [...], "prompt": "..."}.
// A bad line prints {"error": "..."} and the exit status is 1 at the end.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "common/json_escape.h"
#include "common/json_numbers.h"
#include "indexer/block_hash.h"
#include "common/json_numbers.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/placeholder.h"

using namespace kvroute;

namespace {

std::string ids_json(const std::vector<TokenId>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) fmt::format_to(std::back_inserter(s), "{}{}", i ? "," : "", ids[i]);
  return s + "]";
}

// One line -> its output line; false on a bad line (the output is then an error object).
bool process(const ModelTokenizer* mt, std::string_view line, uint32_t block_size, bool show_prompt,
             simdjson::dom::parser& parser, std::string& out) {
  auto fail = [&](std::string_view msg) {
    out = fmt::format(R"({{"error":"{}"}})", json_escape(msg));
    return false;
  };
  simdjson::dom::element doc;
  std::string in_range;  // numbers Python's json reads but simdjson does not (the template reads `line`)
  auto e = parser.parse(line.data(), line.size()).get(doc);
  if ((e == simdjson::NUMBER_ERROR) && replace_out_of_range_numbers(line, &in_range))
    e = parser.parse(in_range.data(), in_range.size()).get(doc);
  if (e)
    return fail(std::string("not JSON: ") + simdjson::error_message(e));
  if (!doc.is_object()) return fail("each line must be a JSON object");
  std::optional<bool> add_special;
  if (auto a = doc["add_special_tokens"]; !a.error() && !a.value_unsafe().is_null()) {
    if (!a.value_unsafe().is_bool()) return fail("add_special_tokens must be a boolean");
    add_special = a.value_unsafe().get_bool().value_unsafe();
  }
  std::vector<TokenId> ids;
  std::string prompt;
  if (auto t = doc["text"]; !t.error()) {
    if (!t.value_unsafe().is_string()) return fail("text must be a string");
    prompt = std::string(t.value_unsafe().get_string().value_unsafe());
    if (mt) mt->encode_prompt(prompt, add_special.value_or(true), ids);
    else ids = placeholder_tokenize(prompt);
  } else if (auto m = doc["messages"]; !m.error()) {
    if (!mt) return fail("chat lines need --tokenizer (the placeholder renders no template)");
    std::string err;
    if (!mt->render_chat(line, prompt, &err)) return fail(err);
    mt->encode_prompt(prompt, add_special.value_or(false), ids);
  } else {
    return fail(R"(a line needs "text" or "messages")");
  }
  if (block_size == 0 && !show_prompt) {
    out = ids_json(ids);
    return true;
  }
  out = R"({"tokens":)" + ids_json(ids);
  if (block_size > 0) {
    out += R"(,"block_hashes":[)";
    const auto hashes = hash_blocks(ids, block_size);
    for (size_t i = 0; i < hashes.size(); ++i) fmt::format_to(std::back_inserter(out), "{}{}", i ? "," : "", hashes[i].value);
    out += "]";
  }
  if (show_prompt) out += R"(,"prompt":")" + json_escape(prompt) + "\"";
  out += "}";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvroute-tokenize: token ids (and KV block hashes) of completion prompts and chat requests,\n"
               "computed exactly as kvroute routes them. Input: JSON lines {\"text\":...} or {\"messages\":[...]}."};
  std::string dir, input;
  uint32_t block_size = 0;
  bool show_prompt = false, placeholder = false;
  app.add_option("--tokenizer", dir, "Directory with tokenizer.json (and tokenizer_config.json / chat_template.jinja)");
  app.add_flag("--placeholder", placeholder, "Use kvroute's placeholder tokenizer (text lines only)");
  app.add_option("--block-size", block_size, "Also print the KV block hashes for blocks of N tokens")
      ->check(CLI::Range(1u, 65536u));
  app.add_flag("--show-prompt", show_prompt, "Also print the text that was tokenized (the rendered chat template)");
  app.add_option("--input", input, "Read this file instead of stdin");
  CLI11_PARSE(app, argc, argv);
  if (dir.empty() == !placeholder) {
    std::fprintf(stderr, "kvroute-tokenize: give exactly one of --tokenizer DIR and --placeholder\n");
    return 2;
  }
  std::unique_ptr<ModelTokenizer> mt;
  if (!dir.empty()) {
    std::string err;
    mt = ModelTokenizer::load(dir, &err);
    if (!mt) {
      std::fprintf(stderr, "kvroute-tokenize: --tokenizer %s: %s\n", dir.c_str(), err.c_str());
      return 2;
    }
  }
  std::ifstream file;
  if (!input.empty()) {
    file.open(input);
    if (!file) {
      std::fprintf(stderr, "kvroute-tokenize: --input %s: cannot open\n", input.c_str());
      return 2;
    }
  }
  std::istream& in = input.empty() ? std::cin : file;
  simdjson::dom::parser parser;
  std::string line, out;
  int status = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (!process(mt.get(), line, block_size, show_prompt, parser, out)) status = 1;
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  }
  return status;
}
