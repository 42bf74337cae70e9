// kvroute-sim: a deterministic discrete-event simulation of a fleet in
// virtual time. It replays a Mooncake-format trace (timestamp ms,
// input_length, output_length, hash_ids of 512-token blocks) against N
// simulated engines (mocker/engine.h, the model kvroute-mocker runs) and
// routes every request with the production code: the RadixIndexer fed by the
// engines' KV events, the WorkerRegistry with load reports every
// --report-ms, and RoutingService::route_blocks with the policy's weights.
// The block of hash id h is LocalBlockHash(mix(h)): equal ids are equal
// content, as if token ids were synthesized from the ids.
//
// Policies: round_robin, random, least_loaded (fewest active + waiting,
// predicted), dynamo_baseline (DESIGN.md's cost, default weights, no pending
// prefill), kvroute (the scheduler's defaults incl. predicted prefill). The
// `ideal` line is the hit rate of one infinite cache (an upper bound).
//
// Run: build/sim/kvroute-sim [--trace PATH] [--workers 8] [--kv-blocks 2000]
//        [--rate 1.0] [--requests N] [--policies a,b] [--seed 1]
// Prints a table; the last line is one JSON object per policy.
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "indexer/radix_indexer.h"
#include "mocker/engine.h"
#include "router/routing.h"

using namespace kvroute;

namespace {

struct TraceRequest {
  double t_ms;
  uint32_t input_tokens, output_tokens;
  std::vector<uint64_t> ids;
};

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<TraceRequest> load_trace(const std::string& path, size_t limit) {
  std::vector<TraceRequest> out;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kvroute-sim: cannot read --trace %s\n", path.c_str());
    std::exit(2);
  }
  simdjson::dom::parser parser;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line) && out.size() < limit) {
    ++lineno;
    auto doc = parser.parse(line);
    TraceRequest r{};
    uint64_t ts = 0, il = 0, ol = 0;
    simdjson::dom::array ids;
    if (doc.error() || doc["timestamp"].get_uint64().get(ts) || doc["input_length"].get_uint64().get(il) ||
        doc["output_length"].get_uint64().get(ol) || doc["hash_ids"].get_array().get(ids)) {
      std::fprintf(stderr, "kvroute-sim: %s:%zu: not a trace line (timestamp, input_length, output_length, hash_ids)\n",
                   path.c_str(), lineno);
      std::exit(2);
    }
    r.t_ms = static_cast<double>(ts);
    r.input_tokens = static_cast<uint32_t>(std::max<uint64_t>(il, 1));
    r.output_tokens = static_cast<uint32_t>(std::max<uint64_t>(ol, 1));
    for (auto v : ids) r.ids.push_back(v.get_uint64().value_unsafe());
    out.push_back(std::move(r));
  }
  return out;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct Options {
  std::string trace = KVROUTE_DEFAULT_TRACE;
  uint32_t workers = 8;
  uint64_t kv_blocks = 2000;  // per worker, 512-token blocks
  uint32_t max_seqs = 64;
  double rate = 1.0;
  size_t requests = SIZE_MAX;
  double report_ms = 100;
  uint64_t seed = 1;
  std::vector<std::string> policies = {"round_robin", "random", "least_loaded", "dynamo_baseline", "kvroute"};
  std::string cdf_out;  // write TTFT CDF points per policy here (for plots)
  std::vector<std::pair<std::string, std::string>> sets;  // --set scheduler.key=value for the kvroute policy
};

struct PolicyResult {
  std::string policy;
  double hit_rate = 0, ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0, e2e_p50 = 0, e2e_p99 = 0;
  double throughput_tok_s = 0, imbalance = 0;
  size_t completed = 0, rejected = 0;
  std::vector<double> ttft_ms;  // every request's TTFT, for the CDF plot
};

constexpr uint32_t kBlock = 512;

PolicyResult simulate(const std::vector<TraceRequest>& trace, const Options& o, const std::string& policy,
                      const SchedulerConfig* weights = nullptr) {
  ManualClock clock;
  SeededRandom random(o.seed);
  std::mt19937_64 rng(o.seed);
  RadixIndexer index;
  WorkerRegistry registry(clock);
  Config cfg;
  cfg.indexer.block_size = kBlock;
  if (policy == "kvroute")
    for (const auto& [k, v] : o.sets)
      if (auto e = set_key(cfg, k, v)) {
        std::fprintf(stderr, "kvroute-sim: --set %s\n", e->c_str());
        std::exit(2);
      }
  if (policy == "dynamo_baseline") cfg.scheduler.pending_prefill_weight = 0;
  if (weights) cfg.scheduler = *weights;
  ConfigStore config(cfg);
  RoutingService routing(index, registry, config, random);

  std::vector<std::unique_ptr<mocker::Engine>> engines;
  for (uint32_t w = 0; w < o.workers; ++w) {
    mocker::EngineConfig ec;
    ec.block_size = kBlock;
    ec.kv_blocks = o.kv_blocks;
    ec.max_seqs = o.max_seqs;
    ec.owner = CacheOwner{WorkerId{w}, 0};
    engines.push_back(std::make_unique<mocker::Engine>(ec, [&index](const KvEvent& e) { index.apply(e); }));
  }
  auto report = [&](double now) {
    clock.set(TimePoint{} + std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(now)));
    for (uint32_t w = 0; w < o.workers; ++w) {
      const auto l = engines[w]->load();
      WorkerAnnouncement a;
      a.id = WorkerId{w};
      a.url = "sim://" + std::to_string(w);
      a.model = "m";
      a.block_size = kBlock;
      a.load = WorkerLoad{l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks,
                          l.kv_total_blocks};
      registry.on_heartbeat(a);
    }
  };
  report(0);

  struct Live {
    double arrival;
    uint32_t worker, input, blocks, cached = 0;
    double first = -1;
    std::unique_ptr<InflightGuard> guard;
  };
  std::vector<Live> live(trace.size());
  std::vector<double> ttft, e2e;
  uint64_t prompt_blocks = 0, hit_blocks = 0, out_tokens = 0;
  std::vector<uint64_t> per_worker(o.workers, 0);
  size_t rejected = 0, next = 0, rr = 0;
  double now = 0, last_report = 0, end_time = 0;
  const size_t progress_step = std::max<size_t>(1, trace.size() / 10);

  while (true) {
    // Next event: an arrival, an engine step end, or a load report.
    double t_arrival = next < trace.size() ? trace[next].t_ms / o.rate : 1e300;
    double t_engine = 1e300;
    uint32_t which = 0;
    for (uint32_t w = 0; w < o.workers; ++w)
      if (auto t = engines[w]->next_event_time(); t && *t < t_engine) t_engine = *t, which = w;
    if (t_arrival == 1e300 && t_engine == 1e300) break;
    const double t_report = last_report + o.report_ms;
    if (t_report < t_arrival && t_report < t_engine) {
      now = last_report = t_report;
      report(now);
      continue;
    }
    if (t_engine <= t_arrival) {
      now = t_engine;
      for (const auto& out : engines[which]->advance_to(now)) {
        Live& l = live[out.request];
        if (out.kind == mocker::EngineOutput::Kind::FirstToken) {
          l.first = now;
          l.cached = out.cached_tokens;
          ttft.push_back(now - l.arrival);
          if (l.guard) l.guard->first_byte();
        } else if (out.kind == mocker::EngineOutput::Kind::Finished) {
          e2e.push_back(now - l.arrival);
          out_tokens += trace[out.request].output_tokens;
          end_time = std::max(end_time, now);
          l.guard.reset();
        }
      }
      continue;
    }
    now = t_arrival;
    const size_t id = next++;
    if (!weights && id % progress_step == 0) std::fprintf(stderr, "\r  %-16s %3zu%%", policy.c_str(), id * 100 / trace.size());
    const auto& r = trace[id];
    std::vector<LocalBlockHash> hashes;
    const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
    for (uint32_t i = 0; i < full; ++i) hashes.push_back(LocalBlockHash{mix(r.ids[i])});
    uint32_t w = 0;
    RouteResult route;
    clock.set(TimePoint{} + std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(now)));
    if (policy == "round_robin") {
      w = static_cast<uint32_t>(rr++ % o.workers);
    } else if (policy == "random") {
      w = static_cast<uint32_t>(rng() % o.workers);
    } else if (policy == "least_loaded") {
      auto views = registry.candidates("m");
      uint64_t best = ~0ull;
      for (const auto& v : views) {
        const uint64_t l = uint64_t{v.predicted.request_active_slots} + v.predicted.num_requests_waiting;
        if (l < best) best = l, w = static_cast<uint32_t>(v.info->id.value);
      }
    } else {
      routing.route_blocks("m", r.input_tokens, hashes, false, route);
      if (!route.ok) {
        ++rejected;
        continue;
      }
      w = static_cast<uint32_t>(route.ranked.front().worker.value);
    }
    Live& l = live[id];
    l.arrival = now;
    l.worker = w;
    l.input = r.input_tokens;
    l.blocks = full;
    const uint32_t cached_pred = route.ok ? route.ranked.front().cached_tokens : 0;
    l.guard = std::make_unique<InflightGuard>(registry, WorkerId{w}, (uint64_t{r.input_tokens} + kBlock - 1) / kBlock,
                                              r.input_tokens - cached_pred);
    if (!engines[w]->add_request_hashed(id, r.input_tokens, hashes, r.output_tokens, now)) {
      ++rejected;  // larger than a worker's whole cache
      l.guard.reset();
      continue;
    }
    per_worker[w]++;
  }
  if (!weights) std::fprintf(stderr, "\r  %-16s 100%%\n", policy.c_str());
  for (size_t i = 0; i < live.size(); ++i) {
    if (live[i].first < 0) continue;
    prompt_blocks += live[i].blocks;
    hit_blocks += std::min<uint64_t>(live[i].cached / kBlock, live[i].blocks);
  }
  PolicyResult res;
  res.policy = policy;
  res.completed = e2e.size();
  res.rejected = rejected;
  res.hit_rate = prompt_blocks ? double(hit_blocks) / double(prompt_blocks) : 0;
  res.ttft_p50 = pct(ttft, 0.5);
  res.ttft_p90 = pct(ttft, 0.9);
  res.ttft_p99 = pct(ttft, 0.99);
  res.e2e_p50 = pct(e2e, 0.5);
  res.e2e_p99 = pct(e2e, 0.99);
  res.ttft_ms = ttft;
  res.throughput_tok_s = end_time > 0 ? double(out_tokens) / (end_time / 1000.0) : 0;
  const double mean = double(std::accumulate(per_worker.begin(), per_worker.end(), uint64_t{0})) / o.workers;
  res.imbalance = mean > 0 ? double(*std::max_element(per_worker.begin(), per_worker.end())) / mean : 0;
  return res;
}

double ideal_hit_rate(const std::vector<TraceRequest>& trace) {
  std::unordered_set<uint64_t> seen;  // prefix identities: (parent chain) hashes
  uint64_t total = 0, hits = 0;
  for (const auto& r : trace) {
    uint64_t chain = 0;
    const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
    for (uint32_t i = 0; i < full; ++i) {
      chain = mix(chain ^ mix(r.ids[i]));
      ++total;
      hits += !seen.insert(chain).second;
    }
  }
  return total ? double(hits) / double(total) : 0;
}

}  // namespace

// `kvroute-sim tune`: sweeps the cost weights on the trace with the kvroute
// policy and prints the best configuration (lowest ttft_p50 + ttft_p99 among
// over 72 weight sets) as a ready-to-use config snippet.
int tune(const std::vector<TraceRequest>& trace, const Options& o) {
  struct Trial {
    SchedulerConfig w;
    PolicyResult r;
  };
  std::vector<Trial> trials;
  for (double alpha : {0.1, 0.3, 0.5})
    for (double gamma : {0.0, 0.1, 0.5})
      for (double pending : {0.0, 0.25, 0.5, 1.0})
        for (double threshold : {0.1, 0.5}) {
          SchedulerConfig w;
          w.alpha_balanced = alpha;
          w.alpha_imbalanced = std::max(alpha, 0.7);
          w.gamma = gamma;
          w.pending_prefill_weight = pending;
          w.balance_threshold = threshold;
          trials.push_back({w, simulate(trace, o, "kvroute", &w)});
          std::fprintf(stderr, "\r  tune %3zu/72", trials.size());
        }
  std::fprintf(stderr, "\n");
  // Objective: TTFT (p50 + p99 / 10, so the tail counts without dominating).
  auto score = [](const PolicyResult& r) { return r.ttft_p50 + r.ttft_p99 / 10; };
  std::sort(trials.begin(), trials.end(), [&](const Trial& a, const Trial& b) { return score(a.r) < score(b.r); });
  std::printf("%-6s %-6s %-8s %-9s | %8s %9s %9s\n", "alpha", "gamma", "pending", "threshold", "hit_rate", "ttft_p50",
              "ttft_p99");
  for (size_t i = 0; i < std::min<size_t>(8, trials.size()); ++i) {
    const auto& t = trials[i];
    std::printf("%-6.2f %-6.2f %-8.2f %-9.2f | %8.3f %9.1f %9.1f\n", t.w.alpha_balanced, t.w.gamma,
                t.w.pending_prefill_weight, t.w.balance_threshold, t.r.hit_rate, t.r.ttft_p50, t.r.ttft_p99);
  }
  const auto& best = trials.front();
  std::printf("\n# kvroute.yaml: best of %zu weight sets on this trace (objective ttft_p50 + ttft_p99/10)\n"
              "scheduler:\n  alpha_balanced: %g\n  alpha_imbalanced: %g\n  balance_threshold: %g\n  gamma: %g\n"
              "  pending_prefill_weight: %g\n",
              trials.size(), best.w.alpha_balanced, best.w.alpha_imbalanced, best.w.balance_threshold, best.w.gamma,
              best.w.pending_prefill_weight);
  std::printf("{\"tune\":{\"alpha_balanced\":%g,\"gamma\":%g,\"pending_prefill_weight\":%g,"
              "\"balance_threshold\":%g,\"hit_rate\":%.4f,\"ttft_p50_ms\":%.2f,\"ttft_p99_ms\":%.2f}}\n",
              best.w.alpha_balanced, best.w.gamma, best.w.pending_prefill_weight, best.w.balance_threshold,
              best.r.hit_rate, best.r.ttft_p50, best.r.ttft_p99);
  return 0;
}

int main(int argc, char** argv) {
  Options o;
  bool tune_mode = false;
  if (argc > 1 && std::string(argv[1]) == "tune") {
    tune_mode = true;
    --argc;
    ++argv;
  }
  for (int i = 1; i < argc; ++i) {
    auto need = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvroute-sim: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    std::string a = argv[i];
    try {
      if (a == "--trace") o.trace = need("--trace");
      else if (a == "--workers") o.workers = static_cast<uint32_t>(std::stoul(need("--workers")));
      else if (a == "--kv-blocks") o.kv_blocks = std::stoull(need("--kv-blocks"));
      else if (a == "--max-seqs") o.max_seqs = static_cast<uint32_t>(std::stoul(need("--max-seqs")));
      else if (a == "--rate") o.rate = std::stod(need("--rate"));
      else if (a == "--requests") o.requests = std::stoull(need("--requests"));
      else if (a == "--report-ms") o.report_ms = std::stod(need("--report-ms"));
      else if (a == "--seed") o.seed = std::stoull(need("--seed"));
      else if (a == "--cdf-out") o.cdf_out = need("--cdf-out");
      else if (a == "--set") {
        const std::string kv = need("--set");
        const auto eq = kv.find('=');
        if (eq == std::string::npos) {
          std::fprintf(stderr, "kvroute-sim: --set needs key=value (a config key, e.g. scheduler.gamma=0.2)\n");
          return 2;
        }
        o.sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      }
      else if (a == "--policies") {
        o.policies.clear();
        std::stringstream ss(need("--policies"));
        for (std::string p; std::getline(ss, p, ',');) o.policies.push_back(p);
      } else if (a == "--help" || a == "-h") {
        std::printf(
            "kvroute-sim [tune]: replay a Mooncake trace against simulated engines with kvroute's router code.\n"
            "  tune              sweep the cost weights (kvroute policy) and print the best as a config snippet\n"
            "  --trace PATH      JSONL trace (default: ../shared/traces/mooncake_conversation_trace.jsonl)\n"
            "  --workers N       engines (default 8)\n"
            "  --kv-blocks N     KV capacity per engine in 512-token blocks (default 2000)\n"
            "  --max-seqs N      running sequences per engine (default 64)\n"
            "  --rate X          arrival rate multiplier (default 1.0 = the trace's timing)\n"
            "  --requests N      replay only the first N requests\n"
            "  --report-ms T     load report interval in virtual ms (default 100)\n"
            "  --policies LIST   comma-separated: round_robin,random,least_loaded,dynamo_baseline,kvroute\n"
            "  --seed N          randomness seed (default 1); the same seed gives the same numbers\n"
            "  --cdf-out FILE    write TTFT CDF points (policy ttft_ms fraction) for plotting\n"
            "  --set KEY=VALUE   a config key for the kvroute policy (e.g. scheduler.gamma=0.2); repeatable\n");
        return 0;
      } else {
        std::fprintf(stderr, "kvroute-sim: unknown argument %s (see --help)\n", a.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "kvroute-sim: %s: not a number\n", a.c_str());
      return 2;
    }
  }
  if (o.workers == 0 || o.kv_blocks == 0 || o.rate <= 0 || o.max_seqs == 0) {
    std::fprintf(stderr, "kvroute-sim: --workers, --kv-blocks, --max-seqs and --rate must be > 0\n");
    return 2;
  }
  for (const auto& p : o.policies) {
    static const std::vector<std::string> known = {"round_robin", "random", "least_loaded", "dynamo_baseline",
                                                   "kvroute"};
    if (std::find(known.begin(), known.end(), p) == known.end()) {
      std::fprintf(stderr, "kvroute-sim: unknown policy '%s'\n", p.c_str());
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto trace = load_trace(o.trace, o.requests);
  std::printf("trace: %zu requests; %u workers x %llu blocks of 512 tokens; rate x%.2f; seed %llu\n", trace.size(),
              o.workers, (unsigned long long)o.kv_blocks, o.rate, (unsigned long long)o.seed);
  if (tune_mode) return tune(trace, o);
  std::vector<PolicyResult> results;
  for (const auto& p : o.policies) results.push_back(simulate(trace, o, p));
  const double ideal = ideal_hit_rate(trace);
  if (!o.cdf_out.empty()) {
    std::ofstream cdf(o.cdf_out);
    for (auto& r : results) {
      std::sort(r.ttft_ms.begin(), r.ttft_ms.end());
      cdf << "# " << r.policy << "\n";
      const size_t n = r.ttft_ms.size();
      for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 400))
        cdf << r.ttft_ms[i] << " " << double(i + 1) / double(n) << "\n";
      cdf << "\n\n";  // gnuplot: one data block per policy
    }
  }
  std::printf("%-16s %8s %9s %9s %9s %9s %9s %10s %9s %8s\n", "policy", "hit_rate", "ttft_p50", "ttft_p90", "ttft_p99",
              "e2e_p50", "e2e_p99", "out_tok/s", "imbalance", "rejected");
  for (const auto& r : results)
    std::printf("%-16s %8.3f %9.1f %9.1f %9.1f %9.1f %9.1f %10.0f %9.2f %8zu\n", r.policy.c_str(), r.hit_rate,
                r.ttft_p50, r.ttft_p90, r.ttft_p99, r.e2e_p50, r.e2e_p99, r.throughput_tok_s, r.imbalance,
                r.rejected);
  std::printf("%-16s %8.3f   (one infinite cache: an upper bound on the hit rate)\n", "ideal", ideal);
  std::printf("simulated in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::string json = "{";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\":{\"hit_rate\":%.4f,\"ttft_p50_ms\":%.2f,\"ttft_p90_ms\":%.2f,\"ttft_p99_ms\":%.2f,"
                  "\"e2e_p50_ms\":%.1f,\"e2e_p99_ms\":%.1f,\"throughput_tok_s\":%.0f,\"imbalance\":%.3f}",
                  i ? "," : "", r.policy.c_str(), r.hit_rate, r.ttft_p50, r.ttft_p90, r.ttft_p99, r.e2e_p50, r.e2e_p99,
                  r.throughput_tok_s, r.imbalance);
    json += buf;
  }
  char tail[96];
  std::snprintf(tail, sizeof tail, ",\"ideal\":{\"hit_rate\":%.4f}}", ideal);
  std::printf("%s%s\n", json.c_str(), tail);
  return 0;
}
