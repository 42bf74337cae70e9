#include "mocker/profile.h"

#include <cmath>

#include "mocker/profiles/h100_fit.h"

namespace kvroute::mocker {

namespace {

// s * softplus((t - t0) / s), written so that neither branch overflows.
double knee(double t, double t0, double s) {
  const double z = (t - t0) / s;
  return z > 0 ? s * (z + std::log1p(std::exp(-z))) : s * std::log1p(std::exp(z));
}

// An H100 80GB HBM3 as the driver reports it: 81,559 MiB.
constexpr double kH100Bytes = 81559.0 * 1024 * 1024;

EngineProfile roofline(std::string name, std::string what, const double (&c)[9], double params, double kv_bytes) {
  EngineProfile p;
  p.name = std::move(name);
  p.what = std::move(what);
  p.kind = EngineProfile::Kind::Roofline;
  p.w0 = c[0];
  p.w1 = c[1];
  p.w2 = c[2];
  p.attn_new = c[3];
  p.attn_cached = c[4];
  p.prefix_read = c[5];
  p.decode_read = c[6];
  p.knee_tokens = c[7];
  p.knee_width = c[8];
  p.kv_capacity_tokens = kv_capacity_tokens(kH100Bytes, params, kv_bytes);
  p.kv_bytes_per_token = kv_bytes;
  return p;
}

std::vector<EngineProfile> make_profiles() {
  std::vector<EngineProfile> v;
  // Parameter counts and KV bytes per token of the measured shapes (mocker/profiles/h100.json).
  v.push_back(roofline("h100-llama3-8b", "NVIDIA H100 80GB, Llama-3-8B shape, bf16 (measured, mocker/profiles/)",
                       fitted::h100_llama3_8b, 8030257152.0, 131072.0));
  v.push_back(roofline("h100-llama3-1b", "NVIDIA H100 80GB, Llama-3.2-1B shape, bf16 (measured, mocker/profiles/)",
                       fitted::h100_llama3_1b, 1498480640.0, 32768.0));
  EngineProfile d;
  d.name = "dynamo-mocker";
  d.what = "Dynamo's mocker: prefill polynomial in new tokens, decode linear in KV occupancy";
  d.kind = EngineProfile::Kind::Polynomial;
  d.prefill_a = 4.209989e-7;
  d.prefill_b = 1.518344e-2;
  d.prefill_c = 16.50142;
  d.decode_base_ms = 8.0;
  d.decode_kv_ms = 12.0;
  v.push_back(d);
  return v;
}

const std::vector<EngineProfile>& profiles() {
  static const std::vector<EngineProfile> p = make_profiles();
  return p;
}

}  // namespace

uint64_t kv_capacity_tokens(double gpu_bytes, double params, double kv_bytes_per_token, double gpu_memory_utilization,
                            double reserve_bytes) {
  const double free = gpu_bytes * gpu_memory_utilization - params * 2.0 - reserve_bytes;
  return free > 0 && kv_bytes_per_token > 0 ? static_cast<uint64_t>(std::floor(free / kv_bytes_per_token)) : 0;
}

double EngineProfile::step_ms(const StepShape& s) const {
  if (s.empty()) return 0;
  if (kind == Kind::Polynomial) {
    double ms = 0;
    if (s.prefill_tokens > 0) {
      const double t = double(s.prefill_tokens);
      ms += prefill_a * t * t + prefill_b * t + prefill_c;
    }
    if (s.decodes > 0) ms += decode_base_ms + decode_kv_ms * s.kv_occupancy;
    return ms;
  }
  const double t = double(s.prefill_tokens) + double(s.decodes);
  return w0 + w1 * t + w2 * knee(t, knee_tokens, knee_width) + attn_new * s.prefill_self +
         attn_cached * s.prefill_cross + prefix_read * double(s.prefill_context) +
         decode_read * double(s.decode_context);
}

double EngineProfile::prefill_ms(uint64_t new_tokens, uint64_t cached) const {
  StepShape s;
  s.add_chunk(new_tokens, cached);
  return step_ms(s);
}

const EngineProfile* find_profile(std::string_view name) {
  for (const auto& p : profiles())
    if (p.name == name) return &p;
  return nullptr;
}

const std::vector<std::string>& profile_names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v;
    for (const auto& p : profiles()) v.push_back(p.name);
    return v;
  }();
  return n;
}

std::string profile_list() {
  std::string s;
  const auto& n = profile_names();
  for (size_t i = 0; i < n.size(); ++i) s += (i ? (i + 1 == n.size() ? " or " : ", ") : "") + n[i];
  return s;
}

}  // namespace kvroute::mocker
