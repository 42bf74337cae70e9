// Native Hugging Face `tokenizer.json` tokenizer (BPE: byte-level and
// SentencePiece-style with byte_fallback). Work in progress: see README.md
// for what is supported and what is still missing (NFC normalization, added
// token lstrip/rstrip/single_word, BPE cache).
// Thread-safety: an HfTokenizer is immutable after load(); encode() may be
// called concurrently from any thread.
#pragma once

#include <cstdint>
#include <memory>
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

  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens) const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute
