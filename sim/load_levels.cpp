// The load levels of `kvroute-sim targets` (and the bisection `goodput`
// shares): a workload's rate multiplier compressed x2 or x3 says nothing of
// how loaded the fleet is (on h100-llama3-8b agentic x2 queues for every
// policy, bursts x3 does not), so the levels are fractions of a capacity:
// the highest rate at which the better of the peers dynamo and llmd still
// keeps its TTFT p99 within --slo-ttft-ms of the causal floor's p99 at that
// rate (sim/floor.h; the allowance for queueing that no router avoids),
// inter-token latency p99 <= --slo-itl-ms, nothing rejected. kvroute's own
// runs never enter it, so no setting of the policy under test moves the load
// it is judged at.
#include <cstdio>
#include <map>

#include "sim/floor.h"
#include "sim/report.h"

namespace kvroute::sim {

Capacity peer_capacity(const std::vector<SimRequest>& w, const Args& a) {
  const auto ec = engine_config(a.sim);
  std::map<double, PeerProbe> seen;
  auto meets = [&](double rate) {
    PeerProbe p;
    p.rate = rate;
    p.floor_p99 = percentile(causal_floor(w, rate, ec).ttft_ms, 0.99);
    SimOptions o = a.sim;
    o.rate = rate;
    for (const char* peer : {"dynamo", "llmd"}) {
      const PolicyResult r = simulate(w, o, peer);
      p.met = r.rejected == 0 && r.ttft_p99 <= p.floor_p99 + a.slo_ttft_ms && r.itl_p99 <= a.slo_itl_ms;
      if (p.met || p.peer.empty() || r.ttft_p99 < p.at.ttft_p99) p.peer = peer, p.at = r;
      if (p.met) break;  // the better peer meets it: the other's run is not needed
    }
    seen[rate] = p;
    return p.met;
  };
  const RateBracket b = bisect_rate(meets, a.level_steps);
  Capacity c;
  c.rate = b.lo;
  c.limit = seen[b.lo > 0 ? b.lo : kLowestRate];
  if (b.hi > 0) c.beyond = seen[b.hi];
  return c;
}

}  // namespace kvroute::sim
