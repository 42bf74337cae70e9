// Native Hugging Face `tokenizer.json` tokenizer: BPE models, byte-level
// (GPT-2 style) and SentencePiece-style (`▁`, byte_fallback), with the
// normalizers, pre-tokenizers, added tokens and post-processors listed in
// README.md. Matches HF `tokenizers` 0.23 token for token (see
// tests/tokenizer/run_reference.sh).
//
// Thread-safety: an HfTokenizer is immutable after load(); encode() may be
// called concurrently from any thread. Each thread keeps its own bounded
// word cache and PCRE2 match state (thread_local), so there is no locking.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute {

class HfTokenizer {
 public:
  // dir_or_file: a directory holding tokenizer.json, or the file itself.
  // Returns nullptr and sets *error on failure (unsupported component, bad JSON).
  static std::unique_ptr<HfTokenizer> load(const std::string& dir_or_file, std::string* error);
  ~HfTokenizer();

  // Token ids of `text`; add_special_tokens adds the post-processor's tokens
  // (e.g. BOS). Any bytes are accepted: invalid UTF-8 is first replaced by
  // U+FFFD per maximal invalid subsequence (as String::from_utf8_lossy).
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Same, into `ids` (cleared first), reusing its capacity.
  void encode(std::string_view text, bool add_special_tokens, std::vector<uint32_t>& ids) const;

  // Id of a vocabulary or added token, if any.
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // Vocabulary plus added tokens not in it.
  size_t vocab_size() const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute
