#include "tokenizer/placeholder.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute {

std::vector<TokenId> placeholder_tokenize(std::string_view text) {
  std::vector<TokenId> out;
  out.reserve((text.size() + 3) / 4);
  for (size_t i = 0; i < text.size(); i += 4) {
    const size_t n = std::min<size_t>(4, text.size() - i);
    // 32-bit vocabulary of hashed 4-byte chunks, like a tokenizer's id space.
    out.push_back(static_cast<TokenId>(XXH32(text.data() + i, n, 0) & 0x7fffffffu));
  }
  return out;
}

std::string placeholder_chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string s;
  for (const auto& m : messages) {
    s += "<|im_start|>";
    s += m.role;
    s += '\n';
    s += m.content;
    s += "<|im_end|>\n";
  }
  s += "<|im_start|>assistant\n";
  return s;
}

}  // namespace kvroute
