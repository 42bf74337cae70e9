// bench/tokenizer: single-thread encode throughput of kvroute's HfTokenizer,
// compared with Hugging Face `tokenizers` measured by bench_hf.js on the same
// corpus in the same run (bench/tokenizer/run.sh), and the in-process latency
// of tokenizing an ~8k-token chat prompt.
//
// What it measures
//   1. per_string: every corpus string encoded (add_special_tokens=false),
//      after one warm-up pass (both sides keep a word cache), repeated until
//      --min-seconds; MB/s = UTF-8 bytes of the strings / time.
//   2. big_text: all corpus strings joined by "\n", encoded as one text,
//      repeated until --min-seconds (at least twice).
//   3. chat_8k: what the router does with an ~8k-token chat request for
//      qwen3 and llama3_1: an OpenAI body (system + 16 user/assistant turns
//      of mostly-ASCII corpus strings, <= 2 KB each, grown until >= 8,000
//      tokens) rendered by the model's chat template, tokenized without
//      special tokens (ModelTokenizer::encode_chat, the router's code) and
//      hashed into 16-token blocks; p50/p99 over --reps runs on a warm thread
//      (word cache filled by earlier requests), the template step alone, and
//      "cold" p50/p99 each on a fresh thread (empty cache: a router's first
//      request of a kind).
// Ratios: kvroute MB/s / HF MB/s per tokenizer, where HF is Hugging Face
// `tokenizers` through its Node binding (npm, Rust core; its encode also
// builds offsets, which kvroute does not), hence the JSON names
// *_vs_hf_node. speed_ratio_vs_hf_node (the JSON headline) is the geometric
// mean over the tokenizers of the big_text ratio (no per-call binding
// overhead on the HF side); the per-string geometric mean and the llama3_1
// values are reported beside it. unexplained_mismatches > 0 exits 1.
// Inputs: --models DIR (tokenizer.json per model), --corpus FILE (one JSON
// string per line, tests/tokenizer/make_corpus.py), --hf FILE (bench_hf.js
// output), --exact FILE (run_reference.sh summary lines), model names.
// Deterministic input; no randomness.
// Run: bench/tokenizer/run.sh [--quick]   (the last line is one JSON object)
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/json_escape.h"
#include "indexer/block_hash.h"
#include "tokenizer/model_tokenizer.h"

#include "tokenizer/hf_tokenizer.h"

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct HfResult { double per_string = 0, big = 0; };

struct Latency { double p50_us = 0, p99_us = 0; };

Latency percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  if (us.empty()) return {};
  auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  return {at(0.50), at(0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string models_dir, corpus_path, hf_path, exact_path;
  double min_seconds = 1.0;
  int reps = 200;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string { if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); } return argv[++i]; };
    if (a == "--models") models_dir = val();
    else if (a == "--corpus") corpus_path = val();
    else if (a == "--hf") hf_path = val();
    else if (a == "--exact") exact_path = val();
    else if (a == "--min-seconds") min_seconds = std::stod(val());
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--quick") { min_seconds = 0.2; reps = 20; }
    else models.push_back(a);
  }
  if (models_dir.empty() || corpus_path.empty() || models.empty()) {
    std::fprintf(stderr, "usage: %s --models DIR --corpus FILE [--hf FILE] [--exact FILE] [--min-seconds S] [--reps N] [--quick] MODEL...\n", argv[0]);
    return 2;
  }
  // Corpus.
  std::vector<std::string> texts;
  {
    std::ifstream f(corpus_path);
    if (!f) { std::fprintf(stderr, "cannot open %s\n", corpus_path.c_str()); return 2; }
    simdjson::dom::parser p;
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      std::string_view s;
      if (p.parse(line).get_string().get(s)) { std::fprintf(stderr, "bad corpus line\n"); return 2; }
      texts.emplace_back(s);
    }
  }
  size_t bytes = 0;
  std::string big;
  for (auto& t : texts) { bytes += t.size(); big += t; big += '\n'; }
  if (!big.empty()) big.pop_back();
  std::printf("corpus: %zu strings, %.2f MB; big text %.2f MB; min %.1f s per measurement\n", texts.size(), bytes / 1e6, big.size() / 1e6, min_seconds);

  // HF figures.
  std::map<std::string, HfResult> hf;
  if (!hf_path.empty()) {
    std::ifstream f(hf_path);
    simdjson::dom::parser p;
    std::string line;
    while (std::getline(f, line)) {
      simdjson::dom::element e;
      if (line.empty() || p.parse(line).get(e)) continue;
      std::string_view m;
      double a, b;
      if (e["model"].get(m) || e["per_string_mbps"].get(a) || e["big_text_mbps"].get(b)) continue;
      hf[std::string(m)] = {a, b};
    }
  }

  // Exactness (run_reference.sh lines "model: A/B exact, E explained, U unexplained").
  size_t ex_ok = 0, ex_total = 0, ex_explained = 0, ex_unexplained = 0;
  bool have_exact = false;
  if (!exact_path.empty()) {
    std::ifstream f(exact_path);
    std::string line;
    while (std::getline(f, line)) {
      char name[64];
      size_t a, b, e, u;
      if (std::sscanf(line.c_str(), "%63[^:]: %zu/%zu exact, %zu explained, %zu unexplained", name, &a, &b, &e, &u) == 5) {
        ex_ok += a; ex_total += b; ex_explained += e; ex_unexplained += u; have_exact = true;
      }
    }
  }

  std::printf("\n%-12s %14s %10s %7s   %14s %10s %7s\n", "tokenizer", "per-string MB/s", "HF", "ratio", "big-text MB/s", "HF", "ratio");
  double log_big = 0, log_str = 0;
  int n_ratio = 0;
  double llama_big = 0, llama_str = 0;
  std::string json_models;
  std::string latency_json;
  size_t sink = 0;
  for (auto& m : models) {
    std::string err;
    auto tok = kvroute::HfTokenizer::load(models_dir + "/" + m, &err);
    if (!tok) { std::fprintf(stderr, "%s: %s\n", m.c_str(), err.c_str()); return 2; }
    std::vector<uint32_t> ids;
    for (auto& t : texts) { tok->encode(t, false, ids); sink += ids.size(); }  // warm-up
    auto t0 = Clock::now();
    size_t passes = 0;
    double el = 0;
    do {
      for (auto& t : texts) { tok->encode(t, false, ids); sink += ids.size(); }
      ++passes;
      el = seconds_since(t0);
    } while (el < min_seconds);
    const double per_string = bytes * passes / el / 1e6;
    t0 = Clock::now();
    passes = 0;
    size_t big_tokens = 0;
    do {
      tok->encode(big, false, ids);
      big_tokens = ids.size();
      ++passes;
      el = seconds_since(t0);
    } while (el < min_seconds || passes < 2);
    const double big_mbps = big.size() * passes / el / 1e6;
    const HfResult h = hf.count(m) ? hf[m] : HfResult{};
    const double r_str = h.per_string > 0 ? per_string / h.per_string : 0, r_big = h.big > 0 ? big_mbps / h.big : 0;
    std::printf("%-12s %14.2f %10.2f %7.2f   %14.2f %10.2f %7.2f   (%zu tokens in big text)\n", m.c_str(), per_string, h.per_string, r_str, big_mbps, h.big, r_big, big_tokens);
    if (r_big > 0 && r_str > 0) { log_big += std::log(r_big); log_str += std::log(r_str); ++n_ratio; }
    if (m == "llama3_1") { llama_big = r_big; llama_str = r_str; }
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s\"%s\":{\"kvroute_per_string_mbps\":%.2f,\"hf_per_string_mbps\":%.2f,\"kvroute_big_text_mbps\":%.2f,\"hf_big_text_mbps\":%.2f}",
                  json_models.empty() ? "" : ",", m.c_str(), per_string, h.per_string, big_mbps, h.big);
    json_models += buf;

    // ~8k-token chat request, as the router handles it: an OpenAI body through
    // the model's chat template (tokenizer_config.json), the tokenizer without
    // special tokens (ModelTokenizer::encode_chat), then the block hashes.
    if (m == "llama3_1" || m == "qwen3") {
      auto mt = kvroute::ModelTokenizer::load(models_dir + "/" + m, &err);
      if (!mt || !mt->chat_template()) { std::fprintf(stderr, "%s: no chat template: %s\n", m.c_str(), err.c_str()); return 2; }
      // Chat text: corpus strings of at most 2,000 bytes that are >= 90% ASCII
      // (English quotes, word lists, source code), in a fixed stride order.
      std::vector<const std::string*> prose;
      for (auto& t : texts) {
        const size_t ascii = size_t(std::count_if(t.begin(), t.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
        if (!t.empty() && t.size() <= 2000 && ascii * 10 >= t.size() * 9) prose.push_back(&t);
      }
      if (prose.empty()) prose.push_back(&texts.front());
      std::vector<std::string> turns(16);
      auto body_of = [&] {
        std::string b = R"({"model":"m","messages":[{"role":"system","content":"You are a helpful assistant. Answer concisely and cite the quotes you use."})";
        for (size_t i = 0; i < turns.size(); ++i)
          b += std::string(R"(,{"role":")") + (i % 2 ? "assistant" : "user") + R"(","content":")" + kvroute::json_escape(turns[i]) + "\"}";
        return b + "]}";
      };
      std::string body = body_of();
      size_t k = 0;
      while (k < prose.size() * 4) {
        if (!mt->encode_chat(body, false, ids, &err)) { std::fprintf(stderr, "%s: %s\n", m.c_str(), err.c_str()); return 2; }
        if (ids.size() >= 8000) break;
        turns[k % 16] += *prose[(k * 7919) % prose.size()] + "\n";
        ++k;
        body = body_of();
      }
      const size_t prompt_tokens = ids.size();
      size_t blocks = 0;
      auto route_stages = [&](std::vector<uint32_t>& out) {
        mt->encode_chat(body, false, out, &err);
        blocks = kvroute::hash_blocks(out, 16).size();
      };
      std::vector<double> warm, cold, render;
      for (int r = 0; r < reps; ++r) {
        auto s0 = Clock::now();
        route_stages(ids);
        warm.push_back(seconds_since(s0) * 1e6);
      }
      std::string prompt_text;
      for (int r = 0; r < reps; ++r) {
        auto s0 = Clock::now();
        mt->render_chat(body, prompt_text, &err);
        render.push_back(seconds_since(s0) * 1e6);
      }
      for (int r = 0; r < std::max(5, reps / 10); ++r) {
        std::thread th([&] {
          std::vector<uint32_t> local;
          auto s0 = Clock::now();
          route_stages(local);
          cold.push_back(seconds_since(s0) * 1e6);
        });
        th.join();
      }
      const Latency w = percentiles(warm), c = percentiles(cold), rd = percentiles(render);
      std::printf("  chat request %zu tokens (%zu blocks of 16), %.1f KB body: template+tokenize+hash warm p50 %.0f us p99 %.0f us "
                  "(template alone p50 %.0f us); cold (fresh thread, empty cache) p50 %.0f us p99 %.0f us\n",
                  prompt_tokens, blocks, body.size() / 1e3, w.p50_us, w.p99_us, rd.p50_us, c.p50_us, c.p99_us);
      std::snprintf(buf, sizeof buf, "%s\"%s\":{\"tokens\":%zu,\"warm_p50_us\":%.0f,\"warm_p99_us\":%.0f,\"template_p50_us\":%.0f,\"cold_p50_us\":%.0f,\"cold_p99_us\":%.0f}",
                    latency_json.empty() ? "" : ",", m.c_str(), prompt_tokens, w.p50_us, w.p99_us, rd.p50_us, c.p50_us, c.p99_us);
      latency_json += buf;
    }
  }
  const double g_big = n_ratio ? std::exp(log_big / n_ratio) : 0, g_str = n_ratio ? std::exp(log_str / n_ratio) : 0;
  std::printf("\nspeed ratio vs HF, geometric mean over %d tokenizers: big text %.2f, per string %.2f; llama3_1: big text %.2f, per string %.2f\n",
              n_ratio, g_big, g_str, llama_big, llama_str);
  if (have_exact)
    std::printf("exactness: %zu/%zu strings x tokenizers exact, %zu explained mismatches, %zu unexplained\n", ex_ok, ex_total, ex_explained, ex_unexplained);
  std::fprintf(stderr, "(checksum %zu)\n", sink);
  char head[512];
  if (have_exact)
    std::snprintf(head, sizeof head, "\"exact_match_ratio\":%.6f,\"explained_mismatches\":%zu,\"unexplained_mismatches\":%zu,",
                  ex_total ? double(ex_ok) / double(ex_total) : 0.0, ex_explained, ex_unexplained);
  else
    std::snprintf(head, sizeof head, "\"exact_match_ratio\":null,\"explained_mismatches\":null,\"unexplained_mismatches\":null,");
  std::printf("{%s\"speed_ratio_vs_hf_node\":%.3f,\"speed_ratio_basis\":\"geomean_big_text\","
              "\"baseline\":\"HF tokenizers 0.23 via its Node binding (npm), one thread, encode with offsets\","
              "\"speed_ratio_vs_hf_node_per_string\":%.3f,\"speed_ratio_vs_hf_node_llama3_1_big_text\":%.3f,"
              "\"models\":{%s},\"chat_8k_latency\":{%s}}\n",
              head, g_big, g_str, llama_big, json_models.c_str(), latency_json.c_str());
  if (have_exact && ex_unexplained > 0) {
    std::fprintf(stderr, "exactness failed: %zu unexplained mismatches\n", ex_unexplained);
    return 1;
  }
  return 0;
}
