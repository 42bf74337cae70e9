#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <simdjson.h>

namespace kvroute::sim {

std::vector<SimRequest> load_slice(const Args& a, const std::string& workload, const std::string& slice) {
  // A generated workload's train slice is another draw (train_seed), its test slice and "all" the seed's own.
  if (workload != "trace")
    return make_workload(workload, a.trace, slice == "train" ? train_seed(a.sim.seed) : a.sim.seed, a.requests);
  auto all = make_workload(workload, a.trace, a.sim.seed, a.requests);
  if (slice == "all") return all;
  std::vector<SimRequest> train, test;
  time_split(all, 0.5, train, test);
  return slice == "train" ? train : test;
}

ReuseProfiles train_profiles(const Args& a, const std::string& workload) {
  std::vector<SimRequest> train, test;
  time_split(make_workload(workload, a.trace, a.sim.seed, a.requests), 0.5, train, test);
  return fit_reuse_profiles(train);
}

void print_table(const std::vector<PolicyResult>& results, double ideal) {
  std::printf("%-16s %8s %9s %9s %9s %9s %9s %10s %9s %8s %7s %7s %8s\n", "policy", "hit_rate", "ttft_p50",
              "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p99", "out_tok/s", "imbalance", "rejected", "gap", "mape",
              "itl_p99");
  for (const auto& r : results)
    std::printf("%-16s %8.3f %9.1f %9.1f %9.1f %9.1f %9.1f %10.0f %9.2f %8zu %7.3f %7.3f %8.1f\n", r.policy.c_str(),
                r.hit_rate, r.ttft_p50, r.ttft_p90, r.ttft_p99, r.e2e_p50, r.e2e_p99, r.throughput_tok_s, r.imbalance,
                r.rejected, r.cache_gap, r.ttft_mape, r.itl_p99);
  std::printf("%-16s %8.3f   (one infinite cache: an upper bound on the hit rate)\n", "ideal", ideal);
}

std::string results_json(const std::vector<PolicyResult>& results, double ideal) {
  std::string json = "{";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\":{\"hit_rate\":%.4f,\"ttft_p50_ms\":%.2f,\"ttft_p90_ms\":%.2f,\"ttft_p99_ms\":%.2f,"
                  "\"e2e_p50_ms\":%.1f,\"e2e_p99_ms\":%.1f,\"throughput_tok_s\":%.0f,\"imbalance\":%.3f,"
                  "\"rejected\":%zu,\"cache_gap\":%.4f,\"ttft_mape\":%.4f,\"itl_p50_ms\":%.2f,\"itl_p99_ms\":%.2f}",
                  i ? "," : "", r.policy.c_str(), r.hit_rate, r.ttft_p50, r.ttft_p90, r.ttft_p99, r.e2e_p50, r.e2e_p99,
                  r.throughput_tok_s, r.imbalance, r.rejected, r.cache_gap, r.ttft_mape, r.itl_p50, r.itl_p99);
    json += buf;
  }
  char tail[96];
  std::snprintf(tail, sizeof tail, ",\"ideal\":{\"hit_rate\":%.4f}}", ideal);
  return json + tail;
}

void write_cdf(const std::string& path, std::vector<PolicyResult>& results) {
  std::ofstream cdf(path);
  for (auto& r : results) {
    std::sort(r.ttft_ms.begin(), r.ttft_ms.end());
    cdf << "# " << r.policy << "\n";
    const size_t n = r.ttft_ms.size();
    for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 400))
      cdf << r.ttft_ms[i] << " " << double(i + 1) / double(n) << "\n";
    cdf << "\n\n";  // gnuplot: one data block per policy
  }
}

void write_requests(const std::string& path, const std::vector<PolicyResult>& results) {
  std::ofstream out(path);
  char line[256];
  for (const auto& r : results)
    for (const auto& q : r.requests) {
      std::snprintf(line, sizeof line,
                    "{\"policy\":\"%s\",\"i\":%zu,\"arrival_ms\":%.1f,\"ttft_ms\":%.1f,\"e2e_ms\":%.1f,\"worker\":%u,"
                    "\"cached\":%u,\"blocks\":%u,\"session\":%llu}\n",
                    r.policy.c_str(), q.index, q.arrival_ms, q.ttft_ms, q.e2e_ms, q.worker, q.cached_tokens, q.blocks,
                    (unsigned long long)q.session);
      out << line;
    }
}

int check_run(const std::vector<SimRequest>& w, const Args& a, const std::vector<PolicyResult>& results,
              double ideal, double capacity_bound) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "kvroute-sim --check FAILED: %s\n", what.c_str());
    return 1;
  };
  const PolicyResult* rr = nullptr;
  const PolicyResult* kv = nullptr;
  for (const auto& r : results) {
    if (r.completed + r.rejected != w.size())
      return fail(r.policy + ": " + std::to_string(r.completed) + " completed + " + std::to_string(r.rejected) +
                  " rejected != " + std::to_string(w.size()) + " requests");
    if (r.hit_rate < 0 || r.hit_rate > ideal + 1e-9) return fail(r.policy + ": hit rate above the infinite-cache ideal");
    if (r.hit_rate > capacity_bound + 1e-9) return fail(r.policy + ": hit rate above the fleet's capacity bound");
    if (!(r.ttft_p50 > 0) || r.ttft_p50 > r.ttft_p99) return fail(r.policy + ": TTFT percentiles out of order");
    if (!std::isfinite(r.ttft_mape) || r.ttft_mape < 0) return fail(r.policy + ": TTFT MAPE not finite");
    if (r.policy == "round_robin") rr = &r;
    if (r.policy == "kvroute") kv = &r;
  }
  if (rr && kv && !(kv->hit_rate > rr->hit_rate))
    return fail("kvroute's hit rate is not above round_robin's");
  if (kv && kv->rejected) return fail("kvroute rejected requests");
  // Determinism: the same seed gives the same numbers.
  if (kv) {
    const auto again = simulate(w, a.sim, "kvroute");
    if (again.ttft_p99 != kv->ttft_p99 || again.hit_rate != kv->hit_rate)
      return fail("kvroute: a second run with the same seed differs");
  }
  std::printf("check: ok (%zu policies, %zu requests)\n", results.size(), w.size());
  return 0;
}

int compare_cells(const char* what, const std::string& path, const std::vector<std::string>& lines, double tol,
                  double abs_floor) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kvroute-sim %s: cannot read --expect %s\n", what, path.c_str());
    return 2;
  }
  simdjson::dom::parser pa, pb;
  std::string line;
  size_t i = 0, bad = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    if (i >= lines.size()) {
      std::fprintf(stderr, "%s --expect: the published table has more cells than this run\n", what);
      return 1;
    }
    simdjson::dom::object want, got;
    if (pa.parse(line).get(want) || pb.parse(lines[i]).get(got)) return 2;
    for (auto [key, v] : want) {
      if (v.is_string()) {
        std::string_view sx, sy;
        if (v.get_string().get(sx) || got[key].get_string().get(sy) || sx != sy) {
          std::fprintf(stderr, "%s --expect: cell %zu %s differs\n", what, i, std::string(key).c_str());
          ++bad;
        }
        continue;
      }
      double x = 0, y = 0;
      if (v.get_double().get(x) || got[key].get_double().get(y)) return 2;
      if (std::abs(x - y) > std::max(tol * std::max(std::abs(x), 1e-9), abs_floor)) {
        std::fprintf(stderr, "%s --expect: cell %zu %s: published %g, now %g (tolerance %.0f%%)\n", what, i,
                     std::string(key).c_str(), x, y, tol * 100);
        ++bad;
      }
    }
    ++i;
  }
  if (i != lines.size()) {
    std::fprintf(stderr, "%s --expect: %zu published cells, %zu now\n", what, i, lines.size());
    return 1;
  }
  if (bad) return 1;
  std::printf("%s: all %zu cells within %.0f%% of %s\n", what, i, tol * 100, path.c_str());
  return 0;
}

}  // namespace kvroute::sim
