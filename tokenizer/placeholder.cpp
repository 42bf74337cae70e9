#include "tokenizer/placeholder.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute {

std::vector<TokenId> placeholder_tokenize(std::string_view text) {
  std::vector<TokenId> out;
  placeholder_tokenize(text, out);
  return out;
}

void placeholder_tokenize(std::string_view text, std::vector<TokenId>& out) {
  out.resize((text.size() + 3) / 4);
  for (size_t i = 0; i < text.size(); i += 4) {
    const size_t n = std::min<size_t>(4, text.size() - i);
    // 32-bit vocabulary of hashed 4-byte chunks, like a tokenizer's id space.
    out[i / 4] = static_cast<TokenId>(XXH32(text.data() + i, n, 0) & 0x7fffffffu);
  }
}

std::string placeholder_chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string s;
  placeholder_chat_prompt(messages, s);
  return s;
}

void placeholder_chat_prompt(const std::vector<ChatMessage>& messages, std::string& out) {
  out.clear();
  for (const auto& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += m.content;
    out += "<|im_end|>\n";
  }
  out += "<|im_start|>assistant\n";
}

}  // namespace kvroute
