// kvroute-mocker's OpenAI-compatible HTTP server around the engine model
// (mocker/README.md: endpoints, test hooks, NATS subjects).
//
// Threading: everything (HTTP sessions, the engine, its timer, heartbeats)
// runs on the ONE thread that calls run(); NATS callbacks (resync requests)
// only post work to it. Call listen(), start_nats(), then run() (blocks until
// stop()); port() is valid after listen(). stop() is thread-safe. The bus must
// outlive run(); destroy (or close) it before the server, so that no NATS
// callback reaches a destroyed server.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mocker/engine.h"
#include "mocker/kv_pool.h"
#include "mocker/pd.h"
#include "tokenizer/model_tokenizer.h"

namespace kvroute {
class NatsBus;
}

namespace kvroute::mocker {

class VllmPublisher;

// Prefill/decode disaggregation (mocker/README.md "Prefill/decode
// disaggregation"; the pure parts in mocker/pd.h).
struct PdConfig {
  PdRole role = PdRole::Both;               // Both: no PD protocol (aggregated only)
  PdProtocol protocol = PdProtocol::None;  // VllmNixl (--role) or Sglang (--disaggregation-mode)
  std::string engine_id;                   // vLLM remote_engine_id; empty = a uuid4 at start
  std::string side_channel_host;           // remote_host reported; empty = --host
  uint16_t side_channel_port = 0;          // vLLM side channel / SGLang bootstrap port to bind (0 = a free one)
  double lease_ms = 30000;                 // vLLM kv_lease_duration: a held transfer without a pull is freed
  size_t max_held = 4096;                  // transfers held at once; more: 503
  double link_gbps = 100;                  // KV link bandwidth for the transfer time (0 = instantaneous)
  double kv_bytes_per_token = 0;           // 0 = the engine profile's
  bool recompute_bad_params = false;       // stock vLLM: bad/failed decode params compute locally (default: 400)
  bool legacy_params = false;              // the older connector's dict (flat remote_block_ids, 8 keys)
  double bootstrap_timeout_ms = 300000;    // SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (prefill waits for decode)
  double waiting_timeout_ms = 300000;      // SGLANG_DISAGGREGATION_WAITING_TIMEOUT (decode waits for the KV)
  size_t max_rooms = 4096;                 // SGLang rooms waiting at once; more: 503
};

struct MockerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t worker_id = 1;
  std::string model = "mock-model";
  std::string subject_prefix = "kvroute";
  std::string advertise_url;  // URL in heartbeats; empty = http://host:port
  uint32_t heartbeat_ms = 500;
  double speedup = 1.0;  // engine ms per real ms
  EngineConfig engine;
  // The served model's tokenizer (--tokenizer DIR), the same library and rules
  // as the router's; null = the placeholder tokenizer.
  std::shared_ptr<const TokenizerSet> tokenizers;
  // LoRA adapters served besides `model` (vLLM's --lora-modules names): a
  // request naming one is served, its blocks hashed under that LoRA name.
  std::vector<std::string> lora_modules;
  // vLLM's --data-parallel-size: this many engines (ranks), each with its own
  // KV cache and, in vLLM mode, its own publisher (vllm[r]). A request's rank
  // is its X-data-parallel-rank header, else the least loaded rank as vLLM's
  // DP balancer picks it (mocker/README.md).
  uint32_t data_parallel_size = 1;
  // vLLM mode: BlockStored without extra_keys, as vLLM sent it before that
  // field: the engine's cache stays keyed by cache_salt, the events no longer
  // say so (lora_name, a field of its own, is still sent).
  bool no_extra_keys = false;
  // vLLM's --api-key: every /v1 request needs `Authorization: Bearer <key>`,
  // else 401 {"error":"Unauthorized"} (vLLM's AuthenticationMiddleware,
  // vllm/entrypoints/openai/server_utils.py); empty = no check.
  std::string api_key;
  PdConfig pd;
  // Offload mode (mocker/kv_pool.h): a shared pool and a host tier, NATS mode
  // with one rank only.
  OffloadConfig offload;
};

class MockerServer {
 public:
  // `bus` may be null (no NATS: no events, no heartbeats). `vllm` (may be
  // null) receives the KV events as vLLM batches, one per engine step; it
  // must outlive run().
  MockerServer(MockerOptions opts, NatsBus* bus, VllmPublisher* vllm = nullptr);
  // Data parallel: one publisher per rank (vllm.size() == data_parallel_size),
  // or none (then data_parallel_size must be 1).
  MockerServer(MockerOptions opts, NatsBus* bus, std::vector<VllmPublisher*> vllm);
  ~MockerServer();
  bool listen(std::string* error);
  uint16_t port() const;
  // The PD side channel's port (vLLM) or SGLang bootstrap port, once bound by listen(); 0 without a PD role.
  uint16_t side_channel_port() const;
  // Subscribes to resync requests (if a bus is given). False + error on failure.
  bool start_nats(std::string* error);
  void run();   // serves until stop()
  void stop();  // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::mocker
