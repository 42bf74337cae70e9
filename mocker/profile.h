// Engine profiles: what one engine step costs on a given GPU and model, and
// how much KV cache that GPU holds. The engine model (mocker/engine.h) asks
// its profile for every step's duration; kvroute-mocker and kvroute-sim pick
// one by name (--engine-profile).
//
// A step holds prefill chunks (chunk i computes n_i new tokens after c_i
// tokens already in its KV cache: its cached prefix plus its earlier chunks)
// and decodes (decode j reads the L_j KV tokens of its sequence). Two kinds:
//
//   Roofline (h100-llama3-8b, h100-llama3-1b; fitted by mocker/profiles/fit.py
//   to GPU measurements, mocker/profiles/README.md):
//     T       = sum n_i + decodes                       (rows through the linear layers)
//     step_ms = w0 + w1*T + w2*knee(T)                  (weight read, then compute-bound past ~T0 rows)
//             + attn_new * sum n_i^2/2 + attn_cached * sum n_i*c_i   (each chunk's attention)
//             + prefix_read * sum c_i + decode_read * sum L_j        (KV reads)
//     knee(T) = s*softplus((T - T0)/s)
//   Polynomial (dynamo-mocker: Dynamo's mocker, the model this engine had first):
//     step_ms = a*t^2 + b*t + c [if t = sum n_i > 0] + decode_base + decode_kv * KV occupancy [if decodes]
//
// KV capacity (roofline profiles): the GPU memory vLLM may use, minus the
// weights and a reserve for activations and CUDA graphs, over the KV bytes of
// one token:
//   kv_tokens = floor((gpu_bytes * gpu_memory_utilization - params * 2 - reserve_bytes) / kv_bytes_per_token)
// with vLLM's default gpu_memory_utilization 0.9, bf16 weights (2 bytes per
// parameter) and a 2 GiB reserve.
//
// Threading: immutable values; find_profile() returns pointers to constants.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::mocker {

// One engine step's work, as the cost model needs it.
struct StepShape {
  uint64_t prefill_tokens = 0;   // sum n_i
  double prefill_self = 0;       // sum n_i^2 / 2
  double prefill_cross = 0;      // sum n_i * c_i
  uint64_t prefill_context = 0;  // sum c_i
  uint32_t decodes = 0;
  uint64_t decode_context = 0;   // sum L_j
  double kv_occupancy = 0;       // KV blocks referenced by running requests / capacity (polynomial only)

  void add_chunk(uint64_t new_tokens, uint64_t context) {
    prefill_tokens += new_tokens;
    prefill_self += 0.5 * double(new_tokens) * double(new_tokens);
    prefill_cross += double(new_tokens) * double(context);
    prefill_context += context;
  }
  void add_decode(uint64_t context) {
    ++decodes;
    decode_context += context;
  }
  bool empty() const { return prefill_tokens == 0 && decodes == 0; }
};

struct EngineProfile {
  enum class Kind : uint8_t { Roofline, Polynomial };
  std::string name;
  Kind kind = Kind::Roofline;
  std::string what;  // one line: GPU, model, source

  // Roofline coefficients (ms; per token, per token^2 or per token pair).
  double w0 = 0, w1 = 0, w2 = 0, knee_tokens = 0, knee_width = 1;
  double attn_new = 0, attn_cached = 0, prefix_read = 0, decode_read = 0;

  // Polynomial coefficients (Dynamo's mocker).
  double prefill_a = 0, prefill_b = 0, prefill_c = 0;
  double decode_base_ms = 0, decode_kv_ms = 0;

  // KV capacity in tokens (0: none given; the engine's kv_blocks stands).
  uint64_t kv_capacity_tokens = 0;
  // KV bytes of one token (all layers, K and V; 0: not given): what a
  // prefill/decode transfer moves per token (kvroute-mocker --kv-link-gbps,
  // kvroute-sim's PD fleets).
  double kv_bytes_per_token = 0;

  double step_ms(const StepShape& s) const;
  // One sequence's prefill of `new_tokens` after `cached` tokens, alone, in one step.
  double prefill_ms(uint64_t new_tokens, uint64_t cached) const;
  // KV capacity in blocks of `block_size` tokens (0 without one).
  uint64_t kv_blocks(uint32_t block_size) const { return block_size ? kv_capacity_tokens / block_size : 0; }
};

// The KV capacity formula above; `gpu_bytes` is the device's memory as the driver reports it.
uint64_t kv_capacity_tokens(double gpu_bytes, double params, double kv_bytes_per_token,
                            double gpu_memory_utilization = 0.9, double reserve_bytes = 2.0 * (1ull << 30));

// The named profile, or nullptr. Names: profile_names().
const EngineProfile* find_profile(std::string_view name);
const std::vector<std::string>& profile_names();
// "a, b or c" for error messages and --help.
std::string profile_list();
inline constexpr const char* kDefaultProfile = "h100-llama3-8b";

}  // namespace kvroute::mocker
