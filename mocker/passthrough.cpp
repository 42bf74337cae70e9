// MockerServer::Impl: the routes vLLM serves besides generation that kvroute
// passes through by model: POST /detokenize, /v1/rerank, /v1/score and
// Anthropic's /v1/messages/count_tokens, simulated with deterministic answers
// in vLLM's shapes (vllm/entrypoints/serve/tokenize/protocol.py
// DetokenizeResponse, pooling/score/protocol.py RerankResponse and
// ScoreResponse, anthropic/protocol.py AnthropicCountTokensResponse).
#include "mocker/server_impl.h"

namespace kvroute::mocker {

namespace {

// A deterministic relevance in [0, 1) for a document.
double mock_score(std::string_view doc) { return static_cast<double>(doc.size() % 97) / 97.0; }

// The documents of a rerank (`documents`) or score (`text_2`) body: strings,
// or a single string.
bool read_documents(simdjson::dom::object o, const char* key, std::vector<std::string_view>& out) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e)) return false;
  std::string_view one;
  if (!e.get_string().get(one)) {
    out.push_back(one);
    return true;
  }
  simdjson::dom::array a;
  if (e.get_array().get(a)) return false;
  for (auto d : a) {
    std::string_view s;
    if (d.get_string().get(s)) return false;
    out.push_back(s);
  }
  return true;
}

}  // namespace

awaitable<bool> MockerServer::Impl::passthrough(beast::tcp_stream& s, const http::request<http::string_body>& req,
                                                ApiKind kind) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  auto fail = [&](unsigned status, std::string message, std::string_view type) {
    return std::pair{status, api_error_body(kind, ApiError{status, std::move(message), type, "", ""})};
  };
  std::pair<unsigned, std::string> answer{200, ""};
  simdjson::dom::parser p;
  simdjson::dom::object o;
  std::string_view model;
  if (p.parse(req.body()).get(o)) {
    answer = fail(400, "the body must be a JSON object", "invalid_request_error");
  } else if (!o.at_key("model").get(model) && !serves(model)) {
    answer = fail(404, fmt::format("The model `{}` does not exist.", model), "NotFoundError");
  } else if (kind == ApiKind::Detokenize) {
    simdjson::dom::array tokens;
    if (o.at_key("tokens").get(tokens)) {
      answer = fail(400, "'tokens' must be an array of token ids", "invalid_request_error");
    } else {
      std::string text;
      for (auto t : tokens) text += fmt::format("{}<{}>", text.empty() ? "" : " ", simdjson::to_string(t));
      answer.second = fmt::format(R"({{"prompt":"{}"}})", json_escape(text));
    }
  } else if (kind == ApiKind::Rerank || kind == ApiKind::Score) {
    std::vector<std::string_view> docs;
    if (!read_documents(o, kind == ApiKind::Rerank ? "documents" : "text_2", docs)) {
      answer = fail(400, kind == ApiKind::Rerank ? "'documents' must be strings" : "'text_2' must be strings",
                    "invalid_request_error");
    } else {
      std::string items;
      for (size_t i = 0; i < docs.size(); ++i)
        items += kind == ApiKind::Rerank
                     ? fmt::format(R"({}{{"index":{},"document":{{"text":"{}"}},"relevance_score":{}}})",
                                   i ? "," : "", i, json_escape(docs[i]), mock_score(docs[i]))
                     : fmt::format(R"({}{{"index":{},"object":"score","score":{}}})", i ? "," : "", i,
                                   mock_score(docs[i]));
      answer.second =
          kind == ApiKind::Rerank
              ? fmt::format(R"({{"id":"rerank-{}","model":"{}","usage":{{"total_tokens":0}},"results":[{}]}})",
                            next_id++, json_escape(opts.model), items)
              : fmt::format(R"({{"id":"score-{}","object":"list","model":"{}","data":[{}],"usage":{{}}}})",
                            next_id++, json_escape(opts.model), items);
    }
  } else {  // CountTokens: the Messages body's prompt, tokenized as generation tokenizes it
    // A count_tokens body has no max_tokens, which the Messages parser
    // requires: one is put first (a client's own, later in the body, wins).
    std::string body = req.body();
    const size_t open = body.find('{');
    const bool empty = body.find_first_not_of(" \t\r\n", open + 1) == body.find('}', open + 1);
    body.insert(open + 1, empty ? R"("max_tokens":1)" : R"("max_tokens":1,)");
    ParsedRequest parsed;
    std::string chat_body;
    ApiError err;
    if (!parse_api_request(ApiKind::Messages, body, parsed, chat_body, err)) {
      answer = {err.status, api_error_body(kind, err)};
    } else {
      std::vector<TokenId> buffer;
      TokenSource source;
      TokenizerFallback fallback;
      const auto tokens = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, nullptr);
      answer.second = fmt::format(R"({{"input_tokens":{}}})", tokens.size());
    }
  }
  co_return co_await respond(s, v, keep, static_cast<http::status>(answer.first), std::move(answer.second));
}

}  // namespace kvroute::mocker
