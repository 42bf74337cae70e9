// kvroute-mocker: a simulated OpenAI-compatible inference worker with a paged
// KV cache (mocker/engine.h), publishing KV events and load on NATS.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <map>
#include <cstdio>
#include <thread>

#include "common/log.h"
#include "common/types.h"
#include "events/nats_bus.h"
#include "events/zmq_source.h"
#include "mocker/server.h"
#include "mocker/vllm_publisher.h"

using namespace kvroute;

namespace {

// One publisher per data-parallel rank, rank r at the endpoints' port + r
// (vLLM's offset_endpoint_port). Port 0 asks for free ports: rank 0 binds a
// free one and the others the ports after it, tried again from a new free
// port when one of those is taken.
bool bind_publishers(const mocker::VllmPublisherOptions& base, uint32_t dp_size,
                     std::vector<std::unique_ptr<mocker::VllmPublisher>>& out, std::string* err) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    out.clear();
    bool ok = true;
    for (uint32_t r = 0; r < dp_size && ok; ++r) {
      mocker::VllmPublisherOptions o = base;
      o.dp_rank = r;
      if (r > 0) {
        o.endpoint = offset_endpoint_port(out[0]->endpoint(), r);
        if (!base.replay_endpoint.empty()) o.replay_endpoint = offset_endpoint_port(out[0]->replay_endpoint(), r);
      }
      out.push_back(std::make_unique<mocker::VllmPublisher>(o));
      ok = out.back()->bind(err);
    }
    if (ok) return true;
    const bool any_port = base.endpoint.ends_with(":0") && (base.replay_endpoint.empty() || base.replay_endpoint.ends_with(":0"));
    if (!any_port || dp_size == 1) return false;
  }
  return false;
}

// The command line, parsed into the server's and the publishers' options.
struct Flags {
  mocker::MockerOptions o;
  mocker::VllmPublisherOptions zo;
  std::string nats_url, tier = "device", log_level = "info";
  uint16_t port = 0;
  std::string tokenizer_dir;
  std::string zmq_encoding = "positional", lora_modules;
  std::string engine_profile = mocker::kDefaultProfile;
  CLI::Option* kv_blocks = nullptr;
  // Polynomial coefficients: only with the dynamo-mocker profile (finish_flags checks).
  double prefill_a = 0, prefill_b = 0, prefill_c = 0, decode_base_ms = 0, decode_kv_ms = 0;
  std::vector<CLI::Option*> poly_flags;
  // Prefill/decode disaggregation.
  std::string role = "both", disaggregation_mode = "null", bad_params = "reject", nixl_params = "newest",
              connector = "nixl";
  CLI::Option* lease = nullptr;
  uint16_t bootstrap_port = 8998;
  CLI::Option* side_channel_port = nullptr;
  CLI::Option* bootstrap_port_flag = nullptr;
};

void add_flags(CLI::App& app, Flags& f) {
  auto& o = f.o;
  auto& zo = f.zo;
  app.add_option("--host", o.host, "Address to bind (an IP)")->capture_default_str();
  app.add_option("--port", f.port, "Port to bind (0 = a free one)")->capture_default_str();
  app.add_option("--worker-id", o.worker_id, "Worker id in KV events and heartbeats (u64)")->capture_default_str();
  app.add_option("--model", o.model, "Model name served; requests for another model get 404")->capture_default_str();
  app.add_option("--nats-url", f.nats_url, "NATS URL (empty = no events, no heartbeats)");
  app.add_option("--subject-prefix", o.subject_prefix, "NATS subject prefix ({prefix}.kv_events, {prefix}.workers, {prefix}.kv_resync.{id})")->capture_default_str();
  app.add_option("--advertise-url", o.advertise_url, "URL announced in heartbeats (empty = http://HOST:PORT as bound)");
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "Interval of heartbeats (with load) on {prefix}.workers, in ms")->capture_default_str()->check(CLI::Range(10u, 60000u));
  app.add_option("--speedup", o.speedup, "Engine time runs this many times faster than real time (100 = 100x faster; for tests)")
      ->capture_default_str()->check(CLI::Range(0.001, 100000.0));
  app.add_option("--block-size", o.engine.block_size, "Tokens per KV block")->capture_default_str()->check(CLI::Range(1u, 65536u));
  app.add_option("--engine-profile", f.engine_profile,
                 "Engine step times and KV capacity (mocker/profile.h): " + mocker::profile_list())
      ->capture_default_str();
  f.kv_blocks = app.add_option("--kv-blocks", o.engine.kv_blocks,
                               "KV cache capacity in blocks (default: the profile's capacity / --block-size; "
                               "16384 for a profile without one)")
                    ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--max-seqs", o.engine.max_seqs, "Running sequences (request slots)")->capture_default_str()->check(CLI::Range(1u, 1000000u));
  app.add_option("--scheduling-policy", o.engine.policy,
                 "Waiting queue order (vLLM's --scheduling-policy): fcfs = arrival; priority = the request's "
                 "`priority` (lower first), then arrival. With fcfs a request whose priority is not 0 is refused "
                 "with 400, as vLLM refuses it")
      ->capture_default_str()
      ->transform(CLI::CheckedTransformer(std::map<std::string, mocker::SchedulingPolicy>{
          {"fcfs", mocker::SchedulingPolicy::Fcfs}, {"priority", mocker::SchedulingPolicy::Priority}}));
  app.add_option("--max-batched-tokens", o.engine.max_batched_tokens, "Token budget of one engine step (vLLM's max_num_batched_tokens): one per decoding sequence + prefill chunks; a longer prompt is prefilled in chunks over several steps")
      ->capture_default_str()->check(CLI::Range(1u, 10000000u));
  const mocker::EngineProfile& poly = *mocker::find_profile("dynamo-mocker");
  f.prefill_a = poly.prefill_a, f.prefill_b = poly.prefill_b, f.prefill_c = poly.prefill_c;
  f.decode_base_ms = poly.decode_base_ms, f.decode_kv_ms = poly.decode_kv_ms;
  f.poly_flags = {
      app.add_option("--prefill-a", f.prefill_a, "dynamo-mocker profile: engine ms of a step's prefill: a*t^2 + b*t + c, t = new (uncached) prompt tokens in the step (Dynamo's mocker polynomial)")->capture_default_str()->check(CLI::NonNegativeNumber),
      app.add_option("--prefill-b", f.prefill_b, "see --prefill-a")->capture_default_str()->check(CLI::NonNegativeNumber),
      app.add_option("--prefill-c", f.prefill_c, "see --prefill-a")->capture_default_str()->check(CLI::NonNegativeNumber),
      app.add_option("--decode-base-ms", f.decode_base_ms, "dynamo-mocker profile: engine ms of a decode step: base + kv * (KV blocks referenced by running requests / capacity)")->capture_default_str()->check(CLI::NonNegativeNumber),
      app.add_option("--decode-kv-ms", f.decode_kv_ms, "see --decode-base-ms")->capture_default_str()->check(CLI::NonNegativeNumber)};
  app.add_option("--storage-tier", f.tier, "Tier announced in KV events: device, host_pinned, disk, external")->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer_dir,
                 "Directory with the model's tokenizer.json (+ chat template), tokenized as kvroute does; "
                 "empty = the placeholder tokenizer");
  app.add_option("--zmq-endpoint", zo.endpoint,
                 "vLLM mode: publish KV events as vLLM does on a ZMQ PUB socket bound here "
                 "(tcp://HOST:PORT, PORT 0 = a free one); empty = NATS mode");
  app.add_option("--zmq-replay-endpoint", zo.replay_endpoint,
                 "vLLM mode: ROUTER socket answering replay requests from the last --zmq-buffer-steps batches "
                 "(tcp://HOST:PORT, 0 = a free port); empty = no replay");
  app.add_option("--zmq-encoding", f.zmq_encoding, "vLLM mode: msgpack layout: positional (array_like) or map (tagged maps)")
      ->capture_default_str()->check(CLI::IsMember({"positional", "map"}));
  app.add_option("--zmq-topic", zo.topic, "vLLM mode: topic frame of every message")->capture_default_str();
  app.add_option("--zmq-buffer-steps", zo.buffer_steps, "vLLM mode: batches kept for replay (vLLM's buffer_steps)")
      ->capture_default_str()->check(CLI::Range(size_t{0}, size_t{10000000}));
  app.add_option("--lora-modules", f.lora_modules,
                 "LoRA adapter names served besides --model, comma-separated (their blocks are hashed under the name)");
  app.add_option("--data-parallel-size", o.data_parallel_size,
                 "vLLM mode: data-parallel ranks, each with its own KV cache and publisher (rank r at the ZMQ "
                 "endpoints' port + r, as vLLM); a request's rank is its X-data-parallel-rank header, else the "
                 "rank with the lowest waiting*4 + running (vLLM's DP balancer)")
      ->capture_default_str()->check(CLI::Range(1u, 64u));
  auto& pd = o.pd;
  app.add_option("--role", f.role,
                 "vLLM NIXL disaggregation: prefill (a request with kv_transfer_params.do_remote_decode holds its "
                 "blocks and returns the params), decode (do_remote_prefill pulls the blocks from the prefill "
                 "mocker), both (no PD protocol)")
      ->capture_default_str()->check(CLI::IsMember({"prefill", "decode", "both"}));
  app.add_option("--pd-connector", f.connector,
                 "With --role: vLLM's kv_connector the worker speaks: nixl (NixlConnector: the prefill answer returns "
                 "kv_transfer_params) or mooncake (MooncakeConnector: the router mints transfer_id, the prefill "
                 "worker's bootstrap server on --pd-side-channel-port answers GET /query)")
      ->capture_default_str()->check(CLI::IsMember({"nixl", "mooncake"}));
  app.add_option("--pd-engine-id", pd.engine_id, "vLLM remote_engine_id of this worker (empty = a uuid4, as vLLM)");
  app.add_option("--pd-side-channel-host", pd.side_channel_host,
                 "remote_host reported in kv_transfer_params (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST; empty = --host)");
  f.side_channel_port = app.add_option("--pd-side-channel-port", pd.side_channel_port,
                                       "Port of the side channel decode workers pull from (vLLM's "
                                       "VLLM_NIXL_SIDE_CHANNEL_PORT; 0 = a free one)")
                            ->capture_default_str();
  f.lease = app.add_option("--pd-lease-ms", pd.lease_ms,
                 "Prefill: a held transfer not pulled within this many ms is freed (vLLM's kv_lease_duration 30 s; "
                 "480000 = the older connector's VLLM_NIXL_ABORT_REQUEST_TIMEOUT; Mooncake's default: "
                 "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480000)")
      ->capture_default_str()->check(CLI::Range(1.0, 86400000.0));
  app.add_option("--pd-max-held", pd.max_held, "Prefill: transfers held at once; a prefill leg beyond it gets 503")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1000000}));
  app.add_option("--kv-link-gbps", pd.link_gbps,
                 "Decode: link bandwidth in Gbit/s a transfer takes (blocks x block size x KV bytes per token); 0 = instantaneous")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--kv-bytes-per-token", pd.kv_bytes_per_token,
                 "KV bytes of one token for the transfer time (0 = the engine profile's)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e9));
  auto& off = o.offload;
  app.add_option("--kv-pool-dir", off.pool_dir,
                 "Offload mode: a shared KV pool, one file per block in this directory (mockers mounting the same "
                 "directory share it); empty = none")
      ->capture_default_str();
  app.add_option("--kv-pool-medium", off.pool_medium,
                 "Offload mode: the medium the pool's KV events carry (kvroute's indexer.kv_pools medium)")
      ->capture_default_str();
  app.add_option("--kv-pool-blocks", off.pool_blocks, "Offload mode: pool capacity in blocks (0 = unbounded)")
      ->capture_default_str();
  app.add_option("--kv-pool-gbps", off.pool_gbps, "Offload mode: load bandwidth from the pool, Gbit/s (0 = instantaneous)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--kv-host-blocks", off.host_blocks,
                 "Offload mode: host tier capacity in blocks (the device's evictions offloaded to CPU memory); 0 = none")
      ->capture_default_str();
  app.add_option("--kv-host-gbps", off.host_gbps,
                 "Offload mode: load bandwidth from the host tier, Gbit/s (0 = instantaneous)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--pd-nixl-params", f.nixl_params,
                 "Prefill: the kv_transfer_params dict returned: newest (grouped remote_block_ids, dcp/pp sizes, "
                 "remote_num_tokens, transfer_mode) or legacy (the older connector's 8 keys, a flat block list)")
      ->capture_default_str()->check(CLI::IsMember({"newest", "legacy"}));
  app.add_option("--pd-bad-params", f.bad_params,
                 "Decode: missing, forged or expired kv_transfer_params (or a failed pull): reject (HTTP 400, "
                 "the default: a test can tell a transfer from a recompute) or recompute (stock vLLM: compute locally)")
      ->capture_default_str()->check(CLI::IsMember({"reject", "recompute"}));
  app.add_option("--disaggregation-mode", f.disaggregation_mode,
                 "SGLang disaggregation: prefill (runs the bootstrap server, waits for the decode leg of each "
                 "bootstrap_room) or decode (takes the KV of its room from bootstrap_host:bootstrap_port); null = none")
      ->capture_default_str()->check(CLI::IsMember({"null", "prefill", "decode"}));
  f.bootstrap_port_flag = app.add_option("--disaggregation-bootstrap-port", f.bootstrap_port,
                                         "SGLang prefill: the bootstrap server's port (0 = a free one)")
                              ->capture_default_str();
  app.add_option("--disaggregation-bootstrap-timeout-ms", pd.bootstrap_timeout_ms,
                 "SGLang prefill: fail a request whose decode leg has not come (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)")
      ->capture_default_str()->check(CLI::Range(1.0, 86400000.0));
  app.add_option("--disaggregation-waiting-timeout-ms", pd.waiting_timeout_ms,
                 "SGLang decode: fail a request whose KV has not come (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")
      ->capture_default_str()->check(CLI::Range(1.0, 86400000.0));
  app.add_option("--pd-max-rooms", pd.max_rooms, "SGLang: bootstrap rooms open at once; more get 503")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1000000}));
  app.add_option("--api-key", o.api_key,
                 "vLLM's --api-key: /v1 requests without 'Authorization: Bearer KEY' get 401 (empty = no check)");
  app.add_flag("--no-extra-keys", o.no_extra_keys,
               "vLLM mode: BlockStored events without extra_keys (vLLM before that field): cache_salt still keys "
               "the engine's cache but is not on the wire (lora_name still is)");
}

// --engine-profile into the engine options: the profile's step times (the
// polynomial flags apply to dynamo-mocker only) and, unless --kv-blocks is
// given, its KV capacity. False on error (printed).
bool apply_profile(Flags& f) {
  auto& o = f.o;
  const mocker::EngineProfile* profile = mocker::find_profile(f.engine_profile);
  if (!profile) {
    std::fprintf(stderr, "kvroute-mocker: --engine-profile: '%s' is not one of %s\n", f.engine_profile.c_str(),
                 mocker::profile_list().c_str());
    return false;
  }
  o.engine.profile = *profile;
  const bool polynomial = profile->kind == mocker::EngineProfile::Kind::Polynomial;
  for (const CLI::Option* flag : f.poly_flags) {
    if (flag->count() == 0 || polynomial) continue;
    std::fprintf(stderr, "kvroute-mocker: %s applies to the dynamo-mocker profile only (--engine-profile is %s)\n",
                 flag->get_name().c_str(), f.engine_profile.c_str());
    return false;
  }
  if (polynomial) {
    o.engine.profile.prefill_a = f.prefill_a;
    o.engine.profile.prefill_b = f.prefill_b;
    o.engine.profile.prefill_c = f.prefill_c;
    o.engine.profile.decode_base_ms = f.decode_base_ms;
    o.engine.profile.decode_kv_ms = f.decode_kv_ms;
  }
  if (f.kv_blocks->count() == 0 && profile->kv_blocks(o.engine.block_size) > 0)
    o.engine.kv_blocks = profile->kv_blocks(o.engine.block_size);
  return true;
}

// Options that need more than CLI11 checks; an error is printed, false returned.
bool finish_flags(Flags& f) {
  auto& o = f.o;
  f.zo.encoding = f.zmq_encoding == "map" ? VllmEncoding::TaggedMap : VllmEncoding::Positional;
  const std::string& lora_modules = f.lora_modules;
  for (size_t b = 0; !lora_modules.empty() && b <= lora_modules.size();) {
    size_t e = lora_modules.find(',', b);
    if (e == std::string::npos) e = lora_modules.size();
    if (e > b) o.lora_modules.push_back(lora_modules.substr(b, e - b));
    b = e + 1;
  }
  o.port = f.port;
  if (!apply_profile(f)) return false;
  auto& pd = o.pd;
  if (f.role != "both" && f.disaggregation_mode != "null") {
    std::fprintf(stderr, "kvroute-mocker: --role (vLLM) and --disaggregation-mode (SGLang) exclude each other\n");
    return false;
  }
  if (f.role == "both" && f.connector != "nixl") {
    std::fprintf(stderr, "kvroute-mocker: --pd-connector needs --role prefill|decode\n");
    return false;
  }
  if (f.role != "both") {
    pd.protocol = f.connector == "mooncake" ? mocker::PdProtocol::VllmMooncake : mocker::PdProtocol::VllmNixl;
    if (pd.protocol == mocker::PdProtocol::VllmMooncake && f.lease->count() == 0) pd.lease_ms = 480000;
    pd.role = f.role == "prefill" ? mocker::PdRole::Prefill : mocker::PdRole::Decode;
  } else if (f.disaggregation_mode != "null") {
    pd.protocol = mocker::PdProtocol::Sglang;
    pd.role = f.disaggregation_mode == "prefill" ? mocker::PdRole::Prefill : mocker::PdRole::Decode;
    if (f.side_channel_port->count() > 0) {
      std::fprintf(stderr, "kvroute-mocker: --pd-side-channel-port is vLLM's; SGLang uses --disaggregation-bootstrap-port\n");
      return false;
    }
    if (pd.role == mocker::PdRole::Decode && f.bootstrap_port_flag->count() > 0) {
      std::fprintf(stderr, "kvroute-mocker: --disaggregation-bootstrap-port is the prefill side's (a decode worker "
                           "finds it in each request's bootstrap_port)\n");
      return false;
    }
    pd.side_channel_port = f.bootstrap_port;
  } else if (f.side_channel_port->count() > 0 || f.bootstrap_port_flag->count() > 0) {
    std::fprintf(stderr, "kvroute-mocker: a side-channel or bootstrap port needs --role or --disaggregation-mode\n");
    return false;
  }
  pd.recompute_bad_params = f.bad_params == "recompute";
  pd.legacy_params = f.nixl_params == "legacy";
  if (!parse_storage_tier(f.tier, o.engine.tier)) {
    std::fprintf(stderr, "kvroute-mocker: --storage-tier: '%s' is not one of device, host_pinned, disk, external\n",
                 f.tier.c_str());
    return false;
  }
  return true;
}

// --tokenizer: the model's tokenizer, and its LoRA adapters'. False on error (printed).
bool load_tokenizers(Flags& f) {
  auto& o = f.o;
  if (f.tokenizer_dir.empty()) return true;
  auto set = std::make_shared<TokenizerSet>();
  std::string terr;
  auto t = ModelTokenizer::load(f.tokenizer_dir, &terr);
  if (!t) {
    std::fprintf(stderr, "kvroute-mocker: --tokenizer: %s\n", terr.c_str());
    return false;
  }
  set->add(o.model, std::move(t));
  // A LoRA adapter tokenizes with its base model's tokenizer (vLLM does,
  // unless the adapter ships its own).
  for (const auto& lora : o.lora_modules) set->add(lora, ModelTokenizer::load(f.tokenizer_dir, &terr));
  o.tokenizers = std::move(set);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvroute-mocker: a simulated OpenAI-compatible inference worker (paged KV cache, continuous\n"
               "batching, chunked prefill, step times from an engine profile) that publishes KV events and heartbeats on NATS.\n"
               "Prints 'kvroute-mocker listening on http://HOST:PORT' once it serves."};
  Flags f;
  add_flags(app, f);
  CLI11_PARSE(app, argc, argv);
  if (!finish_flags(f)) return 2;
  setup_logging(f.log_level, "human");
  if (!load_tokenizers(f)) return 2;
  auto& o = f.o;
  auto& zo = f.zo;
  const std::string& nats_url = f.nats_url;

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<NatsBus> bus;
  std::string err;
  if (!nats_url.empty()) {
    bus = NatsBus::connect(nats_url, "kvroute-mocker", std::chrono::seconds(10), &err);
    if (!bus) {
      std::fprintf(stderr, "kvroute-mocker: --nats-url: %s\n", err.c_str());
      return 1;
    }
  }
  // The host tier also runs in vLLM mode (one rank), announcing its copies as
  // vLLM's OffloadingConnector does; the pool's events are NATS mode's.
  if (o.offload.enabled() &&
      (o.pd.role != mocker::PdRole::Both || o.pd.protocol != mocker::PdProtocol::None ||
       (!zo.endpoint.empty() && (!o.offload.pool_dir.empty() || o.data_parallel_size > 1)))) {
    std::fprintf(stderr, "kvroute-mocker: --kv-pool-dir needs NATS mode, --kv-host-blocks NATS mode or vLLM mode "
                         "with one rank, and neither a PD role\n");
    return 2;
  }
  if (!o.offload.pool_medium.empty() && o.offload.pool_medium.size() > kMaxMediumBytes) {
    std::fprintf(stderr, "kvroute-mocker: --kv-pool-medium: at most %zu bytes\n", kMaxMediumBytes);
    return 2;
  }
  if (o.data_parallel_size > 1 && zo.endpoint.empty()) {
    std::fprintf(stderr, "kvroute-mocker: --data-parallel-size needs --zmq-endpoint (vLLM mode)\n");
    return 2;
  }
  std::vector<std::unique_ptr<mocker::VllmPublisher>> ranks;
  if (!zo.endpoint.empty() && !bind_publishers(zo, o.data_parallel_size, ranks, &err)) {
    std::fprintf(stderr, "kvroute-mocker: %s\n", err.c_str());
    return 1;
  }
  std::vector<mocker::VllmPublisher*> publishers;
  for (auto& p : ranks) {
    p->start();
    publishers.push_back(p.get());
  }
  mocker::VllmPublisher* vllm = publishers.empty() ? nullptr : publishers[0];
  mocker::MockerServer server(o, bus.get(), publishers);
  if (!server.listen(&err) || !server.start_nats(&err)) {
    std::fprintf(stderr, "kvroute-mocker: %s\n", err.c_str());
    return 1;
  }
  // One line with everything (a harness reads one line), the URL last.
  std::string pd_part;
  if (o.pd.protocol != mocker::PdProtocol::None)
    pd_part = std::string(" pd ") + (o.pd.role == mocker::PdRole::Prefill ? "prefill" : "decode") +
              (o.pd.protocol == mocker::PdProtocol::VllmNixl ? " side_channel " : " bootstrap ") + o.host + ":" +
              std::to_string(server.side_channel_port());
  if (vllm)
    std::printf("kvroute-mocker%s zmq kv_events %s replay %s listening on http://%s:%u\n", pd_part.c_str(),
                vllm->endpoint().c_str(), vllm->replay_endpoint().empty() ? "-" : vllm->replay_endpoint().c_str(),
                o.host.c_str(), server.port());
  else
    std::printf("kvroute-mocker%s listening on http://%s:%u\n", pd_part.c_str(), o.host.c_str(), server.port());
  std::fflush(stdout);
  std::thread io([&] { server.run(); });
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("kvroute-mocker: signal {}, shutting down", sig);
  server.stop();
  io.join();
  for (auto& p : ranks) p->stop();
  // Close NATS before the server goes: a resync request arriving now must
  // not reach a destroyed server.
  if (bus) {
    bus->flush(std::chrono::milliseconds(500));
    bus.reset();
  }
  return 0;
}
