// Placeholder tokenizer shared by kvroute and kvroute-mocker until a model's
// real tokenizer is configured (tokenizer/README.md). It is deterministic and
// prefix-stable: if text A is a prefix of text B, tokens(A) minus its last
// (possibly partial) token is a prefix of tokens(B). Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace kvroute {

struct ChatMessage {
  std::string role;
  std::string content;
};

// One token per 4 bytes of UTF-8 text (the last token may cover fewer).
std::vector<TokenId> placeholder_tokenize(std::string_view text);
// The same into `out` (replaced; its capacity is reused).
void placeholder_tokenize(std::string_view text, std::vector<TokenId>& out);

// Renders messages as a ChatML-like prompt ("<|im_start|>role\ncontent<|im_end|>\n"
// each, then "<|im_start|>assistant\n") for placeholder_tokenize.
std::string placeholder_chat_prompt(const std::vector<ChatMessage>& messages);
// The same into `out` (replaced; its capacity is reused).
void placeholder_chat_prompt(const std::vector<ChatMessage>& messages, std::string& out);

}  // namespace kvroute
