// `kvroute-sim tune`: honest tuning. Candidate scheduler blocks are scored on
// the trace's TRAIN slice (first half of its time) at every --rates level, by
// TTFT relative to the dynamo policy on the same slice and rate; the best and
// the shipped defaults are then reported on the disjoint TEST slice and on
// every generated workload, none of which the choice saw.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sim/report.h"

namespace kvroute::sim {

namespace {

struct Trial {
  std::string name;
  SchedulerConfig s;
  double score = 0;  // sum over rates of p50/dynamo_p50 + p99/dynamo_p99 (lower is better)
  double worst_hit = 1;  // lowest hit rate / ideal over the rates (must stay >= 0.9)
};

std::vector<Trial> candidates() {
  std::vector<Trial> t;
  t.push_back({"defaults", SchedulerConfig{}});
  for (const char* cost : {"weighted", "predicted_ttft"})
    for (double alpha : {0.1, 0.3})
      for (double gamma : {0.1, 0.5})
        for (double pending : {0.2, 0.5, 1.0}) {
          // alpha matters only for predicted_ttft (the weighted cost rarely sees balanced load);
          // pending_prefill_weight is not a term of predicted_ttft.
          if (std::string(cost) == "predicted_ttft" ? pending != 1.0 : alpha != 0.3) continue;
          SchedulerConfig s;
          s.cost = cost;
          s.alpha_balanced = alpha;
          s.gamma = gamma;
          s.pending_prefill_weight = pending;
          char name[96];
          std::snprintf(name, sizeof name, "%s a=%.1f g=%.1f p=%.1f", cost, alpha, gamma, pending);
          t.push_back({name, s});
        }
  return t;
}

double relative(const PolicyResult& r, const PolicyResult& base) {
  return r.ttft_p50 / std::max(base.ttft_p50, 1e-9) + r.ttft_p99 / std::max(base.ttft_p99, 1e-9);
}

// kvroute with `s` vs dynamo on one workload at each rate: "p50x/p99x" columns.
void report_line(const Args& a, const std::vector<SimRequest>& w, const std::string& label, const Trial& t) {
  std::printf("  %-10s %-34s", label.c_str(), t.name.c_str());
  for (double rate : a.rates) {
    SimOptions o = a.sim;
    o.rate = rate;
    const auto k = simulate(w, o, "kvroute", &t.s), d = simulate(w, o, "dynamo");
    std::printf("  x%g %.2f/%.2f", rate, k.ttft_p50 / d.ttft_p50, k.ttft_p99 / d.ttft_p99);
  }
  std::printf("\n");
}

}  // namespace

int tune(const Args& a) {
  const auto train = load_slice(a, "trace", "train"), test = load_slice(a, "trace", "test");
  std::printf("tune: trace train slice %zu requests, test slice %zu requests (time split at 50%%)\n", train.size(),
              test.size());
  if (a.check && (train.empty() || test.empty())) {
    std::fprintf(stderr, "kvroute-sim tune --check FAILED: an empty slice\n");
    return 1;
  }
  std::vector<PolicyResult> dynamo;
  for (double rate : a.rates) {
    SimOptions o = a.sim;
    o.rate = rate;
    dynamo.push_back(simulate(train, o, "dynamo"));
  }
  auto trials = candidates();
  const double ideal = ideal_hit_rate(train);
  for (auto& t : trials) {
    for (size_t i = 0; i < a.rates.size(); ++i) {
      SimOptions o = a.sim;
      o.rate = a.rates[i];
      const auto r = simulate(train, o, "kvroute", &t.s);
      t.score += relative(r, dynamo[i]);
      t.worst_hit = std::min(t.worst_hit, ideal > 0 ? r.hit_rate / ideal : 1.0);
    }
    std::fprintf(stderr, "\r  tune %zu/%zu", &t - trials.data() + 1, trials.size());
  }
  std::fprintf(stderr, "\n");
  // Lowest TTFT among those keeping the hit-rate target (>= 0.9 of ideal) at every rate.
  std::stable_sort(trials.begin(), trials.end(), [](const Trial& x, const Trial& y) {
    const bool xo = x.worst_hit >= 0.9, yo = y.worst_hit >= 0.9;
    return xo != yo ? xo : x.score < y.score;
  });
  std::printf("train objective: sum over rates of TTFT p50 and p99 relative to dynamo (2 per rate = parity),\n"
              "among settings whose hit rate stays >= 0.9 of the infinite-cache ideal at every rate\n");
  for (size_t i = 0; i < std::min<size_t>(8, trials.size()); ++i)
    std::printf("  %-34s %.3f  hit >= %.2f of ideal\n", trials[i].name.c_str(), trials[i].score, trials[i].worst_hit);
  const Trial* defaults = nullptr;
  for (const auto& t : trials)
    if (t.name == "defaults") defaults = &t;
  std::printf("  %-34s %.3f  hit >= %.2f of ideal (the shipped defaults)\n", "defaults", defaults->score,
              defaults->worst_hit);
  const auto& best = trials.front();
  std::printf("\nheld out: kvroute p50/p99 relative to dynamo (test slice and workloads tune never saw)\n");
  for (const Trial* t : {&best, defaults}) {
    if (t == defaults && &best != defaults && best.score == defaults->score && best.s.cost == defaults->s.cost &&
        best.s.pending_prefill_weight == defaults->s.pending_prefill_weight && best.s.gamma == defaults->s.gamma &&
        best.s.alpha_balanced == defaults->s.alpha_balanced)
      break;  // the same setting as the best: already reported
    if (t == defaults && &best == defaults) break;
    report_line(a, test, "trace/test", *t);
    for (const auto& wl : a.workloads)
      if (wl != "trace") report_line(a, load_slice(a, wl, "all"), wl, *t);
  }
  std::printf("\n# kvroute.yaml: best on the train slice\nscheduler:\n  cost: %s\n  alpha_balanced: %g\n  gamma: %g\n"
              "  pending_prefill_weight: %g\n",
              best.s.cost.c_str(), best.s.alpha_balanced, best.s.gamma, best.s.pending_prefill_weight);
  std::printf("{\"tune\":{\"cost\":\"%s\",\"alpha_balanced\":%g,\"gamma\":%g,\"pending_prefill_weight\":%g,"
              "\"train_score\":%.4f,\"defaults_train_score\":%.4f}}\n",
              best.s.cost.c_str(), best.s.alpha_balanced, best.s.gamma, best.s.pending_prefill_weight, best.score,
              defaults->score);
  // --check: the chosen configuration beats dynamo on the slice it was tuned
  // on (parity is 2 per rate), and the shipped defaults are within 10% of it.
  const double parity = 2.0 * static_cast<double>(a.rates.size());
  if (a.check && !(best.score < parity)) {
    std::fprintf(stderr, "kvroute-sim tune --check FAILED: the best score %.3f is not below dynamo's %.1f\n",
                 best.score, parity);
    return 1;
  }
  if (a.check && !(defaults->score <= 1.1 * best.score)) {
    std::fprintf(stderr, "kvroute-sim tune --check FAILED: the defaults score %.3f, over 1.1x the best %.3f\n",
                 defaults->score, best.score);
    return 1;
  }
  return 0;
}

}  // namespace kvroute::sim
