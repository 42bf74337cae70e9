#include "events/vllm_wire.h"

#include <msgpack.hpp>

#include <bit>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "events/msgpack_reader.h"
#include "indexer/block_hash.h"

namespace kvroute {

SequenceHash engine_block_id(std::span<const uint8_t> hash_bytes) {
  uint64_t v = 0;
  for (size_t i = hash_bytes.size() > 8 ? hash_bytes.size() - 8 : 0; i < hash_bytes.size(); ++i)
    v = (v << 8) | hash_bytes[i];
  return SequenceHash{v};
}

std::string_view to_string(VllmSkip s) {
  switch (s) {
    case VllmSkip::None: return "none";
    case VllmSkip::UnknownType: return "unknown_type";
    case VllmSkip::BlockSizeMismatch: return "block_size_mismatch";
    case VllmSkip::TokenCount: return "token_count";
    case VllmSkip::NotFullAttention: return "not_full_attention";
  }
  return "none";
}

bool vllm_kind_indexed(std::string_view kind, std::optional<uint32_t> sliding_window) {
  if (sliding_window) return false;
  return kind.empty() || kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention";
}

namespace {

// ---------------------------------------------------------------- decoding

struct Dec {
  mp::Reader r;
  const DecodeLimits& limits;
  std::string* detail;
  DecodeError err = DecodeError::None;

  bool fail(DecodeError e, std::string_view field) {
    if (err == DecodeError::None) {
      // A value that ran past the end (or a reserved byte) is malformed
      // msgpack whatever field was being read.
      err = (!r.ok() || (e == DecodeError::WrongType && r.peek() == mp::Type::Invalid)) ? DecodeError::Json : e;
      if (detail) *detail = std::string(field);
    }
    return false;
  }
};

// Every field any event type has; `type` decides which are meaningful.
struct Fields {
  std::string_view type;
  VllmBlockStored s;
  bool has_token_ids = false;
  bool has_block_hashes = false;
};

// An engine block hash: an int (any sign, as its 64-bit pattern) or bytes
// (bin or str) reduced by engine_block_id().
bool read_hash(Dec& d, SequenceHash& out, std::string_view field) {
  uint64_t bits;
  bool neg;
  if (d.r.integer(bits, neg)) { out = SequenceHash{bits}; return true; }
  std::span<const uint8_t> b;
  if (d.r.bin(b)) { out = engine_block_id(b); return true; }
  return d.fail(DecodeError::WrongType, field);
}

bool read_hashes(Dec& d, std::vector<SequenceHash>& out) {
  uint32_t n;
  if (d.r.nil()) { out.clear(); return true; }
  if (!d.r.array(n)) return d.fail(DecodeError::WrongType, "block_hashes");
  if (n > d.limits.max_blocks_per_event) return d.fail(DecodeError::TooLarge, "block_hashes");
  out.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    if (!read_hash(d, out[i], "block_hashes[]")) return false;
  return true;
}

bool read_opt_hash(Dec& d, std::optional<SequenceHash>& out) {
  if (d.r.nil()) { out.reset(); return true; }
  SequenceHash h;
  if (!read_hash(d, h, "parent_block_hash")) return false;
  out = h;
  return true;
}

bool read_tokens(Dec& d, std::vector<TokenId>& out) {
  uint32_t n;
  if (d.r.nil()) { out.clear(); return true; }
  if (!d.r.array(n)) return d.fail(DecodeError::WrongType, "token_ids");
  out.resize(n);  // n <= bytes left (checked by the reader)
  static_assert(sizeof(TokenId) == sizeof(uint32_t));
  if (!d.r.u32_run(n, out.data())) return d.fail(DecodeError::WrongType, "token_ids[]");
  return true;
}

bool read_opt_u32(Dec& d, std::optional<uint32_t>& out, std::string_view field) {
  if (d.r.nil()) { out.reset(); return true; }
  uint32_t v;
  if (!d.r.u32(v)) return d.fail(DecodeError::WrongType, field);
  out = v;
  return true;
}

bool read_opt_str(Dec& d, std::string& out, std::string_view field) {
  if (d.r.nil()) { out.clear(); return true; }
  std::string_view s;
  if (!d.r.str(s)) return d.fail(DecodeError::WrongType, field);
  out.assign(s);
  return true;
}

bool read_lora_id(Dec& d, std::optional<int64_t>& out) {
  if (d.r.nil()) { out.reset(); return true; }
  uint64_t bits;
  bool neg;
  if (!d.r.integer(bits, neg)) return d.fail(DecodeError::WrongType, "lora_id");
  out = static_cast<int64_t>(bits);
  return true;
}

// extra_keys: one entry (nil or a tuple) per block. vLLM builds block i's
// tuple as lora_name (LoRA requests) + multimodal keys (tuples, or strings in
// older versions) + cache_salt (block 0 only) + prompt-embeds hashes (bytes):
// the cache_salt is the last str of entry 0 that is not its leading LoRA name.
bool read_extra_keys(Dec& d, VllmBlockStored& s) {
  uint32_t n;
  s.cache_salt.clear();
  if (d.r.nil()) return true;
  if (!d.r.array(n)) return d.fail(DecodeError::WrongType, "extra_keys");
  for (uint32_t i = 0; i < n; ++i) {
    if (i > 0 || d.r.nil()) {
      if (i > 0 && !d.r.skip()) return d.fail(DecodeError::Json, "extra_keys[]");
      continue;
    }
    uint32_t m;
    if (!d.r.array(m)) return d.fail(DecodeError::WrongType, "extra_keys[0]");
    std::string_view salt;
    for (uint32_t j = 0; j < m; ++j) {
      std::string_view sv;
      if (d.r.str(sv)) {
        // Any str after the leading LoRA name (or a str at 0 when the event
        // names no LoRA) can be the salt; the last one wins.
        if (!(j == 0 && !s.lora_name.empty() && sv == s.lora_name)) salt = sv;
      } else if (!d.r.skip()) {
        return d.fail(DecodeError::Json, "extra_keys[0][]");
      }
    }
    s.cache_salt.assign(salt);
  }
  return true;
}

// Positional fields in vLLM's declaration order (after the tag).
enum class F : uint8_t {
  BlockHashes, Parent, TokenIds, BlockSize, LoraId, Medium, LoraName, ExtraKeys, GroupIdx, Kind, SlidingWindow, Unknown
};
constexpr F kStoredOrder[] = {F::BlockHashes, F::Parent,   F::TokenIds, F::BlockSize, F::LoraId,       F::Medium,
                              F::LoraName,    F::ExtraKeys, F::GroupIdx, F::Kind,      F::SlidingWindow};
constexpr F kRemovedOrder[] = {F::BlockHashes, F::Medium, F::GroupIdx};

F field_by_name(std::string_view k) {
  if (k == "block_hashes") return F::BlockHashes;
  if (k == "parent_block_hash") return F::Parent;
  if (k == "token_ids") return F::TokenIds;
  if (k == "block_size") return F::BlockSize;
  if (k == "lora_id") return F::LoraId;
  if (k == "medium") return F::Medium;
  if (k == "lora_name") return F::LoraName;
  if (k == "extra_keys") return F::ExtraKeys;
  if (k == "group_idx") return F::GroupIdx;
  if (k == "kv_cache_spec_kind") return F::Kind;
  if (k == "kv_cache_spec_sliding_window") return F::SlidingWindow;
  return F::Unknown;
}

// extra_keys is read after lora_name in both encodings (positional: it comes
// later; maps: deferred) so that the salt can be told from the LoRA name.
bool read_field(Dec& d, F f, Fields& x) {
  VllmBlockStored& s = x.s;
  switch (f) {
    case F::BlockHashes: x.has_block_hashes = true; return read_hashes(d, s.block_hashes);
    case F::Parent: return read_opt_hash(d, s.parent_block_hash);
    case F::TokenIds: x.has_token_ids = true; return read_tokens(d, s.token_ids);
    case F::BlockSize: {
      std::optional<uint32_t> v;
      if (!read_opt_u32(d, v, "block_size")) return false;
      s.block_size = v.value_or(0);
      return true;
    }
    case F::LoraId: return read_lora_id(d, s.lora_id);
    case F::Medium: return read_opt_str(d, s.medium, "medium");
    case F::LoraName: return read_opt_str(d, s.lora_name, "lora_name");
    case F::ExtraKeys: return read_extra_keys(d, s);
    case F::GroupIdx: return read_opt_u32(d, s.group_idx, "group_idx");
    case F::Kind: return read_opt_str(d, s.kv_cache_spec_kind, "kv_cache_spec_kind");
    case F::SlidingWindow: return read_opt_u32(d, s.kv_cache_spec_sliding_window, "kv_cache_spec_sliding_window");
    case F::Unknown: return d.r.skip() || d.fail(DecodeError::Json, "unknown field");
  }
  return false;
}

VllmEvent finish_event(Fields& x) {
  if (x.type == "BlockStored") return std::move(x.s);
  if (x.type == "BlockRemoved")
    return VllmBlockRemoved{std::move(x.s.block_hashes), std::move(x.s.medium), x.s.group_idx};
  if (x.type == "AllBlocksCleared") return VllmAllBlocksCleared{};
  return VllmUnknownEvent{std::string(x.type)};
}

std::span<const F> order_of(std::string_view type) {
  if (type == "BlockStored") return kStoredOrder;
  if (type == "BlockRemoved") return kRemovedOrder;
  return {};
}

// ["BlockStored", f0, f1, ...] (msgspec array_like with tag): trailing
// defaults may be omitted, extra trailing values are ignored.
bool decode_positional_event(Dec& d, uint32_t n, Fields& x) {
  if (n == 0 || !d.r.str(x.type)) return d.fail(DecodeError::BadEvent, "event tag");
  const std::span<const F> order = order_of(x.type);
  for (uint32_t i = 1; i < n; ++i) {
    const F f = i - 1 < order.size() ? order[i - 1] : F::Unknown;
    if (!read_field(d, f, x)) return false;
  }
  return true;
}

// {"type": "BlockStored", ...}: any key order, unknown keys skipped.
bool decode_map_event(Dec& d, uint32_t n, Fields& x) {
  mp::Reader extra_keys{std::span<const uint8_t>{}};
  bool has_extra = false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (!d.r.str(key)) return d.fail(d.r.ok() ? DecodeError::WrongType : DecodeError::Json, "event key");
    if (key == "type") {
      if (!d.r.str(x.type)) return d.fail(DecodeError::WrongType, "type");
      continue;
    }
    const F f = field_by_name(key);
    if (f == F::ExtraKeys) {  // deferred until lora_name is known
      mp::Reader at = d.r;
      if (!d.r.skip()) return d.fail(DecodeError::Json, "extra_keys");
      extra_keys = at;
      has_extra = true;
      continue;
    }
    if (!read_field(d, f, x)) return false;
  }
  if (x.type.empty()) return d.fail(DecodeError::MissingField, "type");
  if (has_extra && x.type == "BlockStored") {
    mp::Reader saved = d.r;
    d.r = extra_keys;
    const bool ok = read_extra_keys(d, x.s);
    d.r = saved;
    if (!ok) return false;
  }
  return true;
}

bool decode_event(Dec& d, VllmEvent& out) {
  Fields x;
  if (auto* prev = std::get_if<VllmBlockStored>(&out)) {
    // Reuse the capacity of the batch object's previous event (a caller
    // decoding into the same batch allocates nothing in the steady state).
    // Sizes are kept too: read_tokens' resize() then zero-fills only growth.
    x.s.token_ids.swap(prev->token_ids);
    x.s.block_hashes.swap(prev->block_hashes);
  }
  uint32_t n;
  if (d.r.array(n)) {
    if (!decode_positional_event(d, n, x)) return false;
  } else if (d.r.map(n)) {
    if (!decode_map_event(d, n, x)) return false;
  } else {
    return d.fail(DecodeError::WrongType, "event");
  }
  // Vectors reused from the previous event keep stale values unless read.
  if (!x.has_block_hashes) x.s.block_hashes.clear();
  if (!x.has_token_ids) x.s.token_ids.clear();
  if (x.type == "BlockStored" && !x.has_token_ids && !x.s.block_hashes.empty())
    return d.fail(DecodeError::MissingField, "token_ids");
  out = finish_event(x);
  return true;
}

bool decode_events(Dec& d, VllmEventBatch& out) {
  uint32_t n;
  if (d.r.nil()) { out.events.clear(); return true; }
  if (!d.r.array(n)) return d.fail(DecodeError::WrongType, "events");
  if (n > d.limits.max_events_per_message) return d.fail(DecodeError::TooLarge, "events");
  out.events.resize(n);  // earlier events of `out` are reused by decode_event
  for (uint32_t i = 0; i < n; ++i)
    if (!decode_event(d, out.events[i])) return false;
  return true;
}

bool decode_ts(Dec& d, double& ts) {
  if (d.r.nil()) { ts = 0; return true; }
  return d.r.number(ts) || d.fail(DecodeError::WrongType, "ts");
}

bool decode_batch(Dec& d, VllmEventBatch& out) {
  uint32_t n;
  if (d.r.array(n)) {  // [ts, events, data_parallel_rank?]
    if (n < 2) return d.fail(DecodeError::MissingField, "events");
    if (!decode_ts(d, out.ts) || !decode_events(d, out)) return false;
    if (n >= 3 && !read_opt_u32(d, out.data_parallel_rank, "data_parallel_rank")) return false;
    for (uint32_t i = 3; i < n; ++i)
      if (!d.r.skip()) return d.fail(DecodeError::Json, "batch");
    return true;
  }
  if (!d.r.map(n)) return d.fail(d.r.ok() ? DecodeError::WrongType : DecodeError::Json, "batch");
  bool has_events = false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (!d.r.str(key)) return d.fail(d.r.ok() ? DecodeError::WrongType : DecodeError::Json, "batch key");
    if (key == "ts") {
      if (!decode_ts(d, out.ts)) return false;
    } else if (key == "events") {
      if (!decode_events(d, out)) return false;
      has_events = true;
    } else if (key == "data_parallel_rank") {
      if (!read_opt_u32(d, out.data_parallel_rank, "data_parallel_rank")) return false;
    } else if (!d.r.skip()) {
      return d.fail(DecodeError::Json, "batch field");
    }
  }
  if (!has_events) out.events.clear();
  return has_events || d.fail(DecodeError::MissingField, "events");
}

// ---------------------------------------------------------------- encoding

using Packer = msgpack::packer<msgpack::sbuffer>;

// A float64 as is (vLLM's ts). msgpack-c's pack_double packs integral values
// as ints and converts 2^64 to uint64_t, which is undefined (UBSan, found by
// scripts/fuzz.sh re-encoding a decoded ts of 2^64).
void pack_float64(msgpack::sbuffer& buf, double d) {
  const uint64_t bits = std::bit_cast<uint64_t>(d);
  char b[9] = {static_cast<char>(0xcb)};
  for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  buf.write(b, sizeof b);
}

void pack_str_or_nil(Packer& pk, const std::string& s) {
  if (s.empty()) pk.pack_nil();
  else pk.pack(s);
}

// extra_keys as vLLM sends them: per block, the LoRA name (LoRA requests),
// then on the first block of a request (no parent) the cache_salt.
bool pack_extra_keys(Packer& pk, const VllmBlockStored& s) {
  const bool salt = !s.cache_salt.empty() && !s.parent_block_hash;
  if (s.omit_extra_keys || (s.lora_name.empty() && !salt)) return false;
  pk.pack_array(static_cast<uint32_t>(s.block_hashes.size()));
  for (size_t i = 0; i < s.block_hashes.size(); ++i) {
    const bool with_salt = salt && i == 0;
    const uint32_t m = (s.lora_name.empty() ? 0 : 1) + (with_salt ? 1 : 0);
    if (m == 0) { pk.pack_nil(); continue; }
    pk.pack_array(m);
    if (!s.lora_name.empty()) pk.pack(s.lora_name);
    if (with_salt) pk.pack(s.cache_salt);
  }
  return true;
}

void pack_hashes(Packer& pk, const std::vector<SequenceHash>& h) {
  pk.pack_array(static_cast<uint32_t>(h.size()));
  for (SequenceHash x : h) pk.pack_uint64(x.value);
}

void pack_opt_u32(Packer& pk, std::optional<uint32_t> v) {
  if (v) pk.pack_uint32(*v);
  else pk.pack_nil();
}

// Fields with no default are always sent; defaulted ones (extra_keys and
// after) only when set, as msgspec's omit_defaults does (positional: a set
// field keeps the defaults before it, as nil).
void pack_stored(msgpack::sbuffer& buf, const VllmBlockStored& s, VllmEncoding enc) {
  Packer pk(buf);
  msgpack::sbuffer extra;
  Packer epk(extra);
  const bool has_extra = pack_extra_keys(epk, s);
  const bool has_group = s.group_idx.has_value(), has_kind = !s.kv_cache_spec_kind.empty(),
             has_sw = s.kv_cache_spec_sliding_window.has_value();
  const bool pos = enc == VllmEncoding::Positional;
  auto key = [&](std::string_view k) { if (!pos) pk.pack(k); };
  if (pos) {
    uint32_t n = 1 + 7;
    if (has_extra) n = 1 + 8;
    if (has_group) n = 1 + 9;
    if (has_kind) n = 1 + 10;
    if (has_sw) n = 1 + 11;
    pk.pack_array(n);
  } else {
    pk.pack_map(8 + has_extra + has_group + has_kind + has_sw);
    pk.pack(std::string_view("type"));
  }
  pk.pack(std::string_view("BlockStored"));
  key("block_hashes"); pack_hashes(pk, s.block_hashes);
  key("parent_block_hash");
  if (s.parent_block_hash) pk.pack_uint64(s.parent_block_hash->value); else pk.pack_nil();
  key("token_ids");
  pk.pack_array(static_cast<uint32_t>(s.token_ids.size()));
  for (TokenId t : s.token_ids) pk.pack_uint32(t);
  key("block_size"); pk.pack_uint32(s.block_size);
  key("lora_id");
  if (s.lora_id) pk.pack_int64(*s.lora_id); else pk.pack_nil();
  key("medium"); pack_str_or_nil(pk, s.medium);
  key("lora_name"); pack_str_or_nil(pk, s.lora_name);
  if (has_extra) { key("extra_keys"); buf.write(extra.data(), extra.size()); }
  else if (pos && (has_group || has_kind || has_sw)) pk.pack_nil();
  if (has_group) { key("group_idx"); pack_opt_u32(pk, s.group_idx); }
  else if (pos && (has_kind || has_sw)) pk.pack_nil();
  if (has_kind) { key("kv_cache_spec_kind"); pk.pack(s.kv_cache_spec_kind); }
  else if (pos && has_sw) pk.pack_nil();
  if (has_sw) { key("kv_cache_spec_sliding_window"); pack_opt_u32(pk, s.kv_cache_spec_sliding_window); }
}

void pack_removed(Packer& pk, const VllmBlockRemoved& r, VllmEncoding enc) {
  const bool pos = enc == VllmEncoding::Positional;
  if (pos) pk.pack_array(r.group_idx ? 4 : 3);
  else { pk.pack_map(r.group_idx ? 4 : 3); pk.pack(std::string_view("type")); }
  pk.pack(std::string_view("BlockRemoved"));
  if (!pos) pk.pack(std::string_view("block_hashes"));
  pack_hashes(pk, r.block_hashes);
  if (!pos) pk.pack(std::string_view("medium"));
  pack_str_or_nil(pk, r.medium);
  if (r.group_idx) {
    if (!pos) pk.pack(std::string_view("group_idx"));
    pk.pack_uint32(*r.group_idx);
  }
}

void pack_tag_only(Packer& pk, std::string_view type, VllmEncoding enc) {
  if (enc == VllmEncoding::Positional) pk.pack_array(1);
  else { pk.pack_map(1); pk.pack(std::string_view("type")); }
  pk.pack(type);
}

// ---------------------------------------------------------------- conversion

void learn_group(VllmGroupState* groups, const VllmBlockStored& s, bool indexed) {
  if (!groups || !s.group_idx || *s.group_idx >= 1024) return;  // bounded: vLLM has a handful of groups
  if (groups->indexed.size() <= *s.group_idx) groups->indexed.resize(*s.group_idx + 1, -1);
  groups->indexed[*s.group_idx] = indexed ? 1 : 0;
}

// The seed of a root block no request may match (SaltAttribution's
// `unattributed`): per engine block, so that two of them never share a node.
uint64_t unattributed_seed(uint64_t lora_seed, SequenceHash engine_block) {
  return lora_seed + XXH3_64bits_withSeed(&engine_block.value, sizeof engine_block.value, 0x5a17b11dULL);
}

VllmSkip convert_stored(const VllmBlockStored& s, CacheOwner owner, uint32_t block_size, std::vector<KvEvent>& out,
                        VllmGroupState* groups, SaltAttribution* salts) {
  const bool indexed = vllm_kind_indexed(s.kv_cache_spec_kind, s.kv_cache_spec_sliding_window);
  learn_group(groups, s, indexed);
  if (!indexed || (groups && groups->skips(s.group_idx))) return VllmSkip::NotFullAttention;
  if (s.block_size != block_size) return VllmSkip::BlockSizeMismatch;
  const StorageTier tier = tier_of(s.medium);
  if (vllm_announces_copies(s)) {
    // A copy in this tier of each block the index holds for the worker.
    KvEvent ev{owner, std::nullopt, tier, KvStored{}};
    ev.medium = bounded_medium(s.medium);
    KvStored& st = std::get<KvStored>(ev.data);
    st.copies = true;
    st.blocks.reserve(s.block_hashes.size());
    for (SequenceHash h : s.block_hashes) st.blocks.push_back(StoredBlock{h, LocalBlockHash{0}});
    out.push_back(std::move(ev));
    return VllmSkip::None;
  }
  if (s.token_ids.size() != s.block_hashes.size() * size_t{block_size}) return VllmSkip::TokenCount;
  // The salt enters only a request's first block; a chain with a parent
  // continues a prefix whose first block carried it.
  const HashNamespace ns{s.lora_name, s.parent_block_hash ? std::string_view{} : std::string_view{s.cache_salt}};
  thread_local std::vector<LocalBlockHash> locals;
  hash_blocks(s.token_ids, block_size, ns, locals);
  if (salts && !s.parent_block_hash && !locals.empty()) {
    // A root block: its salt, from the event or from what the router sent.
    if (!s.cache_salt.empty()) {
      salts->saw_salt_in_events(owner.worker);
    } else {
      const auto r = salts->resolve(owner, locals[0], s.block_hashes[0]);  // locals[0] is unsalted here
      const std::span<const TokenId> first(s.token_ids.data(), block_size);
      if (r.how == SaltAttribution::How::Attributed)
        locals[0] = hash_block(first, block_hash_seed(s.lora_name) + r.salt_hash);
      else if (r.how == SaltAttribution::How::Unattributed)
        locals[0] = hash_block(first, unattributed_seed(block_hash_seed(s.lora_name), s.block_hashes[0]));
    }
  }
  KvEvent ev{owner, std::nullopt, tier, KvStored{}};
  ev.medium = bounded_medium(s.medium);
  KvStored& st = std::get<KvStored>(ev.data);
  st.parent = s.parent_block_hash;
  st.blocks.resize(locals.size());
  for (size_t i = 0; i < locals.size(); ++i) st.blocks[i] = StoredBlock{s.block_hashes[i], locals[i]};
  out.push_back(std::move(ev));
  return VllmSkip::None;
}

}  // namespace

// vLLM's media (GPU, CPU, DISK) and SGLang HiCache's tiers (CPU_TIER1: host
// memory, CPU_TIER2: its storage backend, python/sglang/srt/disaggregation/kv_events.py).
StorageTier tier_of(std::string_view medium) {
  if (medium.empty() || same_medium(medium, "GPU")) return StorageTier::Device;
  if (same_medium(medium, "CPU") || same_medium(medium, "CPU_TIER1")) return StorageTier::HostPinned;
  if (same_medium(medium, "DISK")) return StorageTier::Disk;
  return StorageTier::External;
}

bool vllm_announces_copies(const VllmBlockStored& s) {
  return s.token_ids.empty() && !s.parent_block_hash && tier_of(s.medium) != StorageTier::Device;
}

DecodeError decode_vllm_batch(std::span<const uint8_t> payload, const DecodeLimits& limits, VllmEventBatch& out,
                              std::string* detail) {
  out.ts = 0;
  out.data_parallel_rank.reset();  // out.events is kept for its capacity (decode_events)
  if (payload.size() > limits.max_message_bytes) {
    if (detail) *detail = "message";
    return DecodeError::TooLarge;
  }
  Dec d{mp::Reader(payload), limits, detail};
  if (!decode_batch(d, out)) return d.err == DecodeError::None ? DecodeError::Json : d.err;
  return DecodeError::None;
}

std::string encode_vllm_batch(const VllmEventBatch& batch, VllmEncoding encoding) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  const bool pos = encoding == VllmEncoding::Positional;
  const uint32_t n = batch.data_parallel_rank ? 3 : 2;
  if (pos) pk.pack_array(n);
  else pk.pack_map(n);
  if (!pos) pk.pack(std::string_view("ts"));
  pack_float64(buf, batch.ts);
  if (!pos) pk.pack(std::string_view("events"));
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const VllmEvent& e : batch.events) {
    if (auto* s = std::get_if<VllmBlockStored>(&e)) pack_stored(buf, *s, encoding);
    else if (auto* r = std::get_if<VllmBlockRemoved>(&e)) pack_removed(pk, *r, encoding);
    else if (std::holds_alternative<VllmAllBlocksCleared>(e)) pack_tag_only(pk, "AllBlocksCleared", encoding);
    else pack_tag_only(pk, std::get<VllmUnknownEvent>(e).type, encoding);
  }
  if (batch.data_parallel_rank) {
    if (!pos) pk.pack(std::string_view("data_parallel_rank"));
    pk.pack_uint32(*batch.data_parallel_rank);
  }
  return std::string(buf.data(), buf.size());
}

void to_kv_events(const VllmEventBatch& batch, CacheOwner owner, uint32_t block_size, std::vector<KvEvent>& out,
                  std::array<uint64_t, 5>* skipped, VllmGroupState* groups, SaltAttribution* salts) {
  if (batch.data_parallel_rank) owner.dp_rank = *batch.data_parallel_rank;
  for (const VllmEvent& e : batch.events) {
    VllmSkip skip = VllmSkip::None;
    if (auto* s = std::get_if<VllmBlockStored>(&e)) {
      skip = convert_stored(*s, owner, block_size, out, groups, salts);
    } else if (auto* r = std::get_if<VllmBlockRemoved>(&e)) {
      if (groups && groups->skips(r->group_idx)) skip = VllmSkip::NotFullAttention;
      else {
        out.push_back(KvEvent{owner, std::nullopt, tier_of(r->medium), KvRemoved{r->block_hashes}});
        out.back().medium = bounded_medium(r->medium);
      }
      if (salts && skip == VllmSkip::None) salts->removed(owner, r->block_hashes);
    } else if (std::holds_alternative<VllmAllBlocksCleared>(e)) {
      out.push_back(KvEvent{owner, std::nullopt, StorageTier::Device, KvCleared{}});
      if (salts) salts->cleared(owner);
    } else {
      skip = VllmSkip::UnknownType;
    }
    if (skipped && skip != VllmSkip::None) ++(*skipped)[static_cast<size_t>(skip)];
  }
}

}  // namespace kvroute
