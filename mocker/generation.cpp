// MockerServer::Impl: completions and POST /tokenize. A request is parsed,
// tokenized, admitted to a rank's engine, and its tokens relayed (SSE or one body).
#include "mocker/server_impl.h"

namespace kvroute::mocker {

bool parse_gen_params(std::string_view body, GenParams& p, std::string& err) {
  thread_local simdjson::dom::parser parser;
  auto doc = parser.parse(body.data(), body.size(), true);
  if (doc.error()) return false;
  simdjson::dom::object o;
  if (doc.value_unsafe().get_object().get(o)) return false;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    auto v = o.at_key(key);
    if (v.error() || v.value_unsafe().is_null()) continue;
    uint64_t n = 0;
    if (v.value_unsafe().get_uint64().get(n) || n == 0 || n > 1000000) {
      err = fmt::format("'{}' must be an integer in [1, 1000000]", key);
      return false;
    }
    p.max_tokens = static_cast<uint32_t>(n);
  }
  auto salt = o.at_key("cache_salt");
  if (!salt.error() && !salt.value_unsafe().is_null()) {
    std::string_view sv;
    if (salt.value_unsafe().get_string().get(sv) || sv.empty()) {
      err = "'cache_salt' must be a non-empty string";
      return false;
    }
    p.cache_salt.assign(sv);
  }
  auto so = o.at_key("stream_options");
  if (!so.error() && so.value_unsafe().is_object()) {
    auto iu = so.value_unsafe().at_key("include_usage");
    if (!iu.error() && iu.value_unsafe().is_bool()) p.include_usage = iu.value_unsafe().get_bool().value_unsafe();
  }
  return true;
}

// POST /tokenize as vLLM serves it (vllm/entrypoints/serve/tokenize/
// protocol.py and serving.py): {"model"?, "prompt", "add_special_tokens"?}
// or {"model"?, "messages", "add_generation_prompt"?, ...} -> {"count",
// "max_model_len", "tokens", "token_strs": null}, tokenized exactly as this
// worker's completions and chat endpoints tokenize (same code); a missing
// model is the served one, an unknown one 404, a template error 400.
awaitable<bool> MockerServer::Impl::tokenize(beast::tcp_stream& s, const http::request<http::string_body>& req) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  ++tokenize_total;
  if (tokenize_mode == "hang") {
    char b;
    beast::error_code ec;
    s.expires_never();
    co_await s.socket().async_receive(asio::buffer(&b, 1), nothrow(ec));
    co_return false;
  }
  if (tokenize_mode == "reject") {
    std::string body = error_body(ApiError{400, "rejected (test hook)", "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  if (tokenize_mode == "error") {
    std::string body = error_body(ApiError{500, "tokenizer unavailable (test hook)", "InternalServerError", "", ""});
    co_return co_await respond(s, v, keep, http::status::internal_server_error, std::move(body));
  }
  std::string text = req.body();
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(text).get(doc) || !doc.is_object()) {
    std::string body = error_body(ApiError{400, "the body must be a JSON object", "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  const bool chat = !doc["messages"].error();
  if (doc["model"].error()) {  // optional in vLLM: the served model
    const size_t open = text.find('{');
    const bool empty = text.find_first_not_of(" \t\r\n", open + 1) == text.find('}', open + 1);
    text.insert(open + 1, fmt::format(R"("model":"{}"{})", json_escape(opts.model), empty ? "" : ","));
  }
  ParsedRequest parsed;
  ApiError err;
  if (!parse_openai_request(chat ? ApiKind::ChatCompletions : ApiKind::Completions, text, parsed, err)) {
    std::string body = error_body(err);
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  if (!serves(parsed.model)) {
    std::string body = error_body(ApiError{404, fmt::format("The model `{}` does not exist.", parsed.model),
                                           "NotFoundError", "model", "model_not_found"});
    co_return co_await respond(s, v, keep, http::status::not_found, std::move(body));
  }
  TokenizerFallback fallback = TokenizerFallback::None;
  TokenSource source;
  std::string terr;
  std::vector<TokenId> buffer;
  const auto tokens = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, &terr);
  if (opts.tokenizers && fallback != TokenizerFallback::None) {
    std::string body = error_body(ApiError{
        400, fallback == TokenizerFallback::NoChatTemplate ? std::string("The model has no chat template.") : terr,
        "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  std::string body = fmt::format(R"({{"count":{},"max_model_len":{},"tokens":[{}],"token_strs":null}})", tokens.size(),
                                 uint64_t{opts.engine.kv_blocks} * opts.engine.block_size, fmt::join(tokens, ","));
  co_return co_await respond(s, v, keep, http::status::ok, std::move(body));
}

std::optional<MockerServer::Impl::Reject> MockerServer::Impl::parse_generation(
    const http::request<http::string_body>& req, ApiKind kind, ParsedRequest& parsed, std::string& chat_body,
    GenParams& gen, bool& lora) const {
  ApiError err;
  std::string gerr;
  if (!parse_api_request(kind, req.body(), parsed, chat_body, err)) return Reject{http::status::bad_request, err};
  if (!parse_gen_params(req.body(), gen, gerr)) {
    if (gerr.empty()) gerr = "the request body is not a JSON object";
    return Reject{http::status::bad_request, ApiError{400, gerr, "invalid_request_error", "max_tokens", ""}};
  }
  // Responses' max_output_tokens and Messages' max_tokens, as their parsers read them.
  if (parsed.max_tokens) {
    if (*parsed.max_tokens > 1000000)
      return Reject{http::status::bad_request,
                    ApiError{400, "the output token limit must be in [1, 1000000]", "invalid_request_error",
                             kind == ApiKind::Responses ? "max_output_tokens" : "max_tokens", ""}};
    gen.max_tokens = static_cast<uint32_t>(*parsed.max_tokens);
  }
  // As vLLM (vllm/v1/engine/input_processor.py): a priority other than 0
  // needs --scheduling-policy priority; the engine refuses it otherwise, and
  // the OpenAI server answers 400.
  if (parsed.priority.value_or(0) != 0 && opts.engine.policy != SchedulingPolicy::Priority)
    return Reject{http::status::bad_request,
                  ApiError{400, fmt::format("Got priority {} but Priority scheduling is not enabled.", *parsed.priority),
                           "BadRequestError", "", ""}};
  // As vLLM (responses/serving.py create_responses): a response it does not
  // hold is 404 invalid_request_error.
  if (!parsed.previous_response_id.empty() && !stores_response(parsed.previous_response_id))
    return Reject{http::status::not_found,
                  ApiError{404, fmt::format("Response with id '{}' not found.", parsed.previous_response_id),
                           "invalid_request_error", "", ""}};
  lora = std::find(opts.lora_modules.begin(), opts.lora_modules.end(), parsed.model) != opts.lora_modules.end();
  if (parsed.model != opts.model && !lora)
    return Reject{http::status::not_found, ApiError{404, fmt::format("The model `{}` does not exist.", parsed.model),
                                                    "invalid_request_error", "model", "model_not_found"}};
  return std::nullopt;
}

std::optional<MockerServer::Impl::Reject> MockerServer::Impl::prepare_generation(
    const http::request<http::string_body>& req, const ParsedRequest& parsed, const GenParams& gen, bool lora,
    Prepared& out) {
  TokenizerFallback fallback = TokenizerFallback::None;
  TokenSource source;
  std::string terr;
  std::vector<TokenId> buffer;
  const auto span = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, &terr);
  out.tokens.assign(span.begin(), span.end());
  if (opts.tokenizers && fallback != TokenizerFallback::None) {
    // As vLLM: a chat request its template cannot render is the client's error.
    return Reject{http::status::bad_request,
                  ApiError{400,
                           fallback == TokenizerFallback::NoChatTemplate ? std::string("The model has no chat template.")
                                                                         : terr,
                           "invalid_request_error", "messages", ""}};
  }
  if (out.tokens.empty())
    return Reject{http::status::bad_request, ApiError{400, "The prompt is empty.", "invalid_request_error", "prompt", ""}};
  if (lora) out.lora_name = parsed.model;
  out.priority = parsed.priority.value_or(0);
  out.read_cache = !parsed.prompt_logprobs;
  out.ns = HashNamespace{out.lora_name, gen.cache_salt};
  out.rank = pick_rank(req);
  if (out.rank < 0)
    return Reject{http::status::bad_request,
                  ApiError{400, fmt::format("X-data-parallel-rank must be in [0, {}).", engines.size()),
                           "invalid_request_error", "", ""}};
  return std::nullopt;
}

std::optional<MockerServer::Impl::Reject> MockerServer::Impl::admit_generation(const Prepared& prep,
                                                                               const GenParams& gen, uint64_t id,
                                                                               Engine*& engine, double now) {
  engine = engines[static_cast<size_t>(prep.rank)].get();
  PdOptions pd;
  pd.hold = gen.leg == PdLeg::NixlPrefill || gen.leg == PdLeg::MooncakePrefill || gen.leg == PdLeg::SglPrefill;
  pd.imported_blocks = prep.imported_blocks;
  if (!engine->add_request(id, prep.tokens, gen.max_tokens, now, prep.ns, prep.read_cache, pd, prep.priority))
    return Reject{http::status::bad_request,
                  ApiError{400,
                           fmt::format("This request needs more KV blocks than the worker has ({}).",
                                       opts.engine.kv_blocks),
                           "invalid_request_error", "messages", "context_length_exceeded"}};
  ++requests_by_rank[static_cast<size_t>(prep.rank)];
  last_priority = prep.priority;
  return std::nullopt;
}

// One generation's answer as it is written: ids, counts, the SSE framing, and
// the shapes of each API (chat and completions; the Responses API as OpenAI
// and vllm/entrypoints/openai/responses/serving.py write it; the Messages API
// as Anthropic and vllm/entrypoints/anthropic/serving.py write it).
struct MockerServer::Impl::Reply {
  // `base_id`: the id after the API's prefix (vLLM's X-Request-Id, for a PD
  // role); empty = "WORKER-N".
  Reply(const ParsedRequest& parsed, const GenParams& gen, uint64_t id, uint64_t worker_id, ApiKind api, bool keep,
        unsigned version, uint32_t prompt_len, std::string_view base_id = {})
      : parsed(parsed), gen(gen), id(id), api(api), chat(api == ApiKind::ChatCompletions), keep(keep),
        version(version), prompt_len(prompt_len),
        rid(base_id.empty() ? fmt::format("{}{}-{}", id_prefix(api), worker_id, id)
                            : fmt::format("{}{}", id_prefix(api), base_id)),
        item_id(fmt::format("msg_{}-{}", worker_id, id)),
        created(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                    .count()),
        model(json_escape(parsed.model)),  // the base model or the LoRA adapter asked for
        head{http::status::ok, version}, sr{head} {}

  static std::string_view id_prefix(ApiKind api) {
    switch (api) {
      case ApiKind::ChatCompletions: return "chatcmpl-";
      case ApiKind::Responses: return "resp_";
      case ApiKind::Messages: return "msg_";
      default: return "cmpl-";
    }
  }

  const ParsedRequest& parsed;
  const GenParams& gen;
  const uint64_t id;
  const ApiKind api;
  const bool chat, keep;
  const unsigned version;
  const uint32_t prompt_len;
  const std::string rid;
  const std::string item_id;  // the Responses output message's id
  const int64_t created;
  const std::string model;
  uint32_t generated = 0, cached = 0;
  double queued_ms = 0;   // FirstToken's queued_ms (engine ms)
  std::chrono::steady_clock::time_point received{};  // the request read whole
  uint64_t sequence = 0;  // the Responses stream's sequence_number
  std::string text;
  std::string extra;  // more top-level fields of a non-streamed body (",\"kv_transfer_params\":{...}")
  bool header_sent = false;
  beast::error_code ec;
  http::response<http::empty_body> head;
  http::response_serializer<http::empty_body> sr;

  std::string chunk_json(std::string_view piece, const char* finish) const {
    const std::string fin = finish ? fmt::format("\"{}\"", finish) : "null";
    if (chat)
      return fmt::format(
          R"({{"id":"{}","object":"chat.completion.chunk","created":{},"model":"{}","choices":[{{"index":0,"delta":{},"logprobs":null,"finish_reason":{}}}]}})",
          rid, created, model,
          finish ? std::string("{}") : fmt::format(R"({{"content":"{}"}})", json_escape(piece)), fin);
    return fmt::format(
        R"({{"id":"{}","object":"text_completion","created":{},"model":"{}","choices":[{{"index":0,"text":"{}","logprobs":null,"finish_reason":{}}}]}})",
        rid, created, model, json_escape(piece), fin);
  }
  std::string usage_json() const {
    return fmt::format(
        R"({{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{}}}}})",
        prompt_len, generated, prompt_len + generated, cached);
  }
  awaitable<bool> write_chunk(beast::tcp_stream& s, std::string payload) {
    std::string frame = "data: " + payload + "\n\n";
    co_await asio::async_write(s, http::make_chunk(asio::buffer(frame)), nothrow(ec));
    co_return !ec;
  }
  // A named SSE event (the Responses and Messages streams).
  awaitable<bool> write_event(beast::tcp_stream& s, std::string_view type, std::string payload) {
    std::string frame = fmt::format("event: {}\ndata: {}\n\n", type, payload);
    co_await asio::async_write(s, http::make_chunk(asio::buffer(frame)), nothrow(ec));
    co_return !ec;
  }

  // ---- Responses API. The mocker always generates max_output_tokens tokens:
  // the response is `incomplete` (reason max_output_tokens), as vLLM marks a
  // generation that stopped at its length limit.
  std::string responses_usage() const {
    return fmt::format(
        R"({{"input_tokens":{},"input_tokens_details":{{"cached_tokens":{}}},"output_tokens":{},"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{}}})",
        prompt_len, cached, generated, prompt_len + generated);
  }
  std::string output_text_part(std::string_view t) const {
    return fmt::format(R"({{"type":"output_text","text":"{}","annotations":[]}})", json_escape(t));
  }
  std::string output_message(bool done) const {
    return fmt::format(R"({{"id":"{}","type":"message","status":"{}","role":"assistant","content":[{}]}})", item_id,
                       done ? "completed" : "in_progress", done ? output_text_part(text) : std::string());
  }
  std::string response_json(bool done) const {
    const std::string prev =
        parsed.previous_response_id.empty() ? "null" : "\"" + json_escape(parsed.previous_response_id) + "\"";
    return fmt::format(
        R"({{"id":"{}","object":"response","created_at":{},"status":"{}","error":null,"incomplete_details":{},"model":"{}","output":[{}],"parallel_tool_calls":true,"previous_response_id":{},"tool_choice":"auto","tools":[],"max_output_tokens":{},"usage":{},"metadata":{{}}}})",
        rid, created, done ? "incomplete" : "in_progress", done ? R"({"reason":"max_output_tokens"})" : "null", model,
        done ? output_message(true) : std::string(), prev, gen.max_tokens, done ? responses_usage() : "null");
  }
  // A Responses stream event: its type and sequence_number, then `fields`.
  awaitable<bool> responses_event(beast::tcp_stream& s, std::string_view type, std::string fields) {
    co_return co_await write_event(
        s, type, fmt::format(R"({{"type":"{}","sequence_number":{},{}}})", type, sequence++, fields));
  }
  std::string item_fields() const {
    return fmt::format(R"("item_id":"{}","output_index":0,"content_index":0)", item_id);
  }

  // ---- Messages API. input_tokens counts the prompt tokens not read from the
  // cache, as Anthropic's usage does (cache_read_input_tokens the rest).
  std::string messages_usage(bool done) const {
    return fmt::format(
        R"({{"input_tokens":{},"output_tokens":{},"cache_read_input_tokens":{},"cache_creation_input_tokens":0}})",
        prompt_len - cached, done ? generated : 0, cached);
  }
  std::string message_json(bool done) const {
    return fmt::format(
        R"({{"id":"{}","type":"message","role":"assistant","model":"{}","content":[{}],"stop_reason":{},"stop_sequence":null,"usage":{}}})",
        rid, model, done ? fmt::format(R"({{"type":"text","text":"{}"}})", json_escape(text)) : std::string(),
        done ? "\"max_tokens\"" : "null", messages_usage(done));
  }

  // The stream's opening events, before its first token.
  awaitable<bool> open_stream(beast::tcp_stream& s) {
    if (chat)
      co_return co_await write_chunk(s, fmt::format(
          R"({{"id":"{}","object":"chat.completion.chunk","created":{},"model":"{}","choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}})",
          rid, created, model));
    if (api == ApiKind::Responses) {
      co_return co_await responses_event(s, "response.created", R"("response":)" + response_json(false)) &&
          co_await responses_event(s, "response.in_progress", R"("response":)" + response_json(false)) &&
          co_await responses_event(s, "response.output_item.added",
                                   R"("output_index":0,"item":)" + output_message(false)) &&
          co_await responses_event(s, "response.content_part.added",
                                   item_fields() + R"(,"part":)" + output_text_part(""));
    }
    if (api == ApiKind::Messages) {
      co_return co_await write_event(s, "message_start",
                                     R"({"type":"message_start","message":)" + message_json(false) + "}") &&
          co_await write_event(s, "content_block_start",
                               R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})");
    }
    co_return true;
  }
  // One token's piece of the stream.
  awaitable<bool> stream_piece(beast::tcp_stream& s, std::string_view piece) {
    if (api == ApiKind::Responses)
      co_return co_await responses_event(
          s, "response.output_text.delta",
          fmt::format(R"({},"delta":"{}","logprobs":[])", item_fields(), json_escape(piece)));
    if (api == ApiKind::Messages)
      co_return co_await write_event(
          s, "content_block_delta",
          fmt::format(R"({{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{}"}}}})",
                      json_escape(piece)));
    co_return co_await write_chunk(s, chunk_json(piece, nullptr));
  }
  // The Responses and Messages streams' closing events (vLLM sends
  // response.completed with the final response whatever its status).
  awaitable<bool> close_event_stream(beast::tcp_stream& s) {
    if (api == ApiKind::Responses)
      co_return co_await responses_event(s, "response.output_text.done",
                                         fmt::format(R"({},"text":"{}","logprobs":[])", item_fields(),
                                                     json_escape(text))) &&
          co_await responses_event(s, "response.content_part.done",
                                   item_fields() + R"(,"part":)" + output_text_part(text)) &&
          co_await responses_event(s, "response.output_item.done",
                                   R"("output_index":0,"item":)" + output_message(true)) &&
          co_await responses_event(s, "response.completed", R"("response":)" + response_json(true));
    co_return co_await write_event(s, "content_block_stop", R"({"type":"content_block_stop","index":0})") &&
        co_await write_event(
            s, "message_delta",
            fmt::format(
                R"({{"type":"message_delta","delta":{{"stop_reason":"max_tokens","stop_sequence":null}},"usage":{}}})",
                messages_usage(true))) &&
        co_await write_event(s, "message_stop", R"({"type":"message_stop"})");
  }
};

// Relays the engine's tokens as they come (streamed, or gathered into
// r.text); true when the engine finished, false when the client left or a
// write failed.
awaitable<bool> MockerServer::Impl::relay_tokens(beast::tcp_stream& s, Pending& p, Reply& r) {
  bool ok = true;
  while (ok) {
    if (p.outputs.empty()) {
      p.wake.expires_at(asio::steady_timer::time_point::max());
      co_await p.wake.async_wait(nothrow(r.ec));
      r.ec = {};
      if (p.client_gone) break;
      continue;
    }
    const EngineOutput out = p.outputs.front();
    p.outputs.pop_front();
    if (out.kind == EngineOutput::Kind::Finished) co_return true;
    if (out.kind == EngineOutput::Kind::FirstToken) {
      r.cached = out.cached_tokens;
      // The engine's own time to first token, and how late this thread handed
      // it on (its timer firing late on a busy host): bench/replay.sh
      // separates them from what the client measured.
      spdlog::debug("kvroute-mocker: first token of request {}: prompt {} tokens, {} cached; arrived {:.3f}, first "
                    "token {:.3f}, handed on {:.3f} engine ms",
                    r.id, r.prompt_len, out.cached_tokens, p.arrival_ms, out.time_ms, now_ms());
      r.queued_ms = out.queued_ms;
    }
    const std::string piece = kWords[(r.id + r.generated) % std::size(kWords)];
    ++r.generated;
    r.text += piece;
    if (!r.parsed.stream) continue;
    if (!r.header_sent) {
      r.head.set(http::field::server, "kvroute-mocker");
      r.head.set(http::field::content_type, "text/event-stream");
      r.head.set(http::field::cache_control, "no-cache");
      // Not vLLM's: how long the request waited in the engine before its
      // first step (the step in progress, then the waiting queue), wall ms;
      // benchmarks split a TTFT into router, engine wait and prefill with it.
      r.head.set("x-mocker-queued-ms", fmt::format("{:.3f}", r.queued_ms / std::max(opts.speedup, 1e-9)));
      // ... and from the request read whole to this head (its TTFT inside the mocker).
      r.head.set("x-mocker-ttft-ms",
                 fmt::format("{:.3f}", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                                 r.received)
                                           .count()));
      r.head.chunked(true);
      r.head.keep_alive(r.keep);
      co_await http::async_write_header(s, r.sr, nothrow(r.ec));
      r.header_sent = true;
      if (r.ec) break;
      if (!(ok = co_await r.open_stream(s))) break;
    }
    ok = co_await r.stream_piece(s, piece);
  }
  co_return false;
}

// The end of a finished generation: the whole answer, or the stream's last
// chunks. Returns whether the connection goes on.
awaitable<bool> MockerServer::Impl::finish_reply(beast::tcp_stream& s, Reply& r) {
  if (r.api == ApiKind::Responses) store_response(r.rid, r.response_json(true));  // vLLM stores it once complete
  if (r.api == ApiKind::Responses || r.api == ApiKind::Messages) {
    if (!r.parsed.stream) {
      std::string body = r.api == ApiKind::Responses ? r.response_json(true) : r.message_json(true);
      co_return co_await respond(s, r.version, r.keep, http::status::ok, std::move(body));
    }
    if (!co_await r.close_event_stream(s)) co_return false;
    co_await asio::async_write(s, http::make_chunk_last(), nothrow(r.ec));
    co_return !r.ec && r.keep;
  }
  if (!r.parsed.stream) {
    // One choice per prompt of a batch and per `n` (the same text), index
    // ordered as vLLM's (prompt-major), so a router's n > 1 and batched
    // prompts can be checked; streams still carry one choice.
    std::string choice;
    for (uint32_t i = 0; i < r.parsed.n * r.parsed.prompts; ++i)
      choice += (i ? "," : "") +
                (r.chat ? fmt::format(R"({{"index":{},"message":{{"role":"assistant","content":"{}"}},"logprobs":null,"finish_reason":"length"}})",
                                      i, json_escape(r.text))
                        : fmt::format(R"({{"index":{},"text":"{}","logprobs":null,"finish_reason":"length"}})", i,
                                      json_escape(r.text)));
    co_return co_await respond(s, r.version, r.keep, http::status::ok,
                               fmt::format(R"({{"id":"{}","object":"{}","created":{},"model":"{}","choices":[{}],"usage":{}{}}})",
                                           r.rid, r.chat ? "chat.completion" : "text_completion", r.created, r.model,
                                           choice, r.usage_json(), r.extra));
  }
  if (!co_await r.write_chunk(s, r.chunk_json("", "length"))) co_return false;
  if (r.gen.include_usage &&
      !co_await r.write_chunk(s, fmt::format(R"({{"id":"{}","object":"{}","created":{},"model":"{}","choices":[],"usage":{}}})",
                                             r.rid, r.chat ? "chat.completion.chunk" : "text_completion", r.created,
                                             r.model, r.usage_json())))
    co_return false;
  if (!co_await r.write_chunk(s, "[DONE]")) co_return false;
  co_await asio::async_write(s, http::make_chunk_last(), nothrow(r.ec));
  co_return !r.ec && r.keep;
}

awaitable<bool> MockerServer::Impl::generate(beast::tcp_stream& s, const http::request<http::string_body>& req,
                                             ApiKind kind) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  const auto received = std::chrono::steady_clock::now();  // the request read whole (x-mocker-ttft-ms)
  ++requests_total;
  ParsedRequest parsed;
  std::string chat_body;
  GenParams gen;
  bool lora = false;
  auto reject = parse_generation(req, kind, parsed, chat_body, gen, lora);
  {
    // Classified even when refused already: a refused decode leg still frees its transfer (below).
    auto pd_reject = classify_pd(req, gen);
    if (!reject) reject = std::move(pd_reject);
  }
  if (!reject && hang) {
    // Test hook: accept and never answer; return when the client gives up.
    char b;
    beast::error_code ec;
    s.expires_never();
    co_await s.socket().async_receive(asio::buffer(&b, 1), nothrow(ec));
    co_return false;
  }
  Engine* engine = nullptr;
  Prepared prep;
  uint64_t id = 0;
  bool pulled = false;  // a decode leg reached the prefill worker's side channel (it freed or refused the transfer)
  if (!reject) reject = prepare_generation(req, parsed, gen, lora, prep);
  // A disaggregated leg meets its other half before the engine sees it.
  if (!reject && gen.leg == PdLeg::NixlDecode) reject = co_await nixl_pull(gen, prep, pulled);
  if (!reject && gen.leg == PdLeg::MooncakeDecode) reject = co_await mooncake_pull(gen, prep, pulled);
  if (!reject && gen.leg == PdLeg::SglDecode) reject = co_await sgl_take(gen, prep);
  bool in_room = false;  // an SGLang prefill leg met its decode leg: its room is open until the hand-over
  if (!reject && gen.leg == PdLeg::SglPrefill) {
    reject = co_await sgl_wait_decode(gen, s.socket());
    in_room = !reject;
  }
  if (!reject && gen.leg == PdLeg::None) co_await offload_load(prep);  // offload mode: host tier, shared pool
  double arrival_ms = 0;
  if (!reject) {
    id = next_id++;
    arrival_ms = now_ms();
    reject = admit_generation(prep, gen, id, engine, arrival_ms);
  }
  if (reject) {
    ++rejected_total;
    pd_leg_refused(gen, pulled, in_room);
    // Bodies are built before co_await: GCC 12 mishandles temporaries in co_await expressions.
    std::string body = api_error_body(kind, reject->error);
    co_return co_await respond(s, v, keep, reject->status, std::move(body));
  }
  auto p = std::make_shared<Pending>(ioc.get_executor());
  p->arrival_ms = arrival_ms;
  pending[id] = p;
  schedule();
  watch_departure(s.socket(), [p] {  // the client left: cancel the request
    if (p->client_gone) return;
    p->client_gone = true;
    p->wake.cancel();
  });

  // A PD-role worker names its answer after X-Request-Id as vLLM does (cmpl-{X-Request-Id}), so
  // a test can tell that both legs of a request carried one id.
  Reply r(parsed, gen, id, opts.worker_id, kind, keep, v,
          static_cast<uint32_t>(prep.tokens.size()), gen.request_id_header);
  r.received = received;
  const bool finished = co_await relay_tokens(s, *p, r);
  pending.erase(id);
  {
    beast::error_code ignored;
    s.socket().cancel(ignored);  // stop the client watch
  }
  if (!finished) {
    // Client went away (or a write failed): stop generating, free the blocks
    // (an aborted prefill leg holds nothing, as vLLM's request_finished()).
    engine->cancel(id);
    schedule();
    ++cancels_total;
    if (in_room) sgl_close_room(gen.room);
    co_return false;
  }
  if (gen.leg == PdLeg::NixlPrefill) {
    // Streams carry no kv_transfer_params (vLLM's completion_stream_generator
    // never emits them): the blocks are held until the lease ends.
    std::string params = nixl_hold(gen, prep, r.rid, id);
    if (!r.parsed.stream && !params.empty()) r.extra = ",\"kv_transfer_params\":" + params;
  }
  // Mooncake: held whether streamed or not (request_finished() looks at the
  // finish reason only), and nothing returned.
  if (gen.leg == PdLeg::MooncakePrefill) mooncake_hold(gen, prep, id);
  if (gen.leg == PdLeg::NixlPrefill || gen.leg == PdLeg::MooncakePrefill) co_await hold_answer();
  if (gen.leg == PdLeg::SglPrefill) {
    auto failed = co_await sgl_hand_over(gen, prep, id, s.socket());
    if (failed && !r.parsed.stream) {
      std::string body = error_body(failed->error);
      co_return co_await respond(s, v, keep, failed->status, std::move(body));
    }
  }
  co_return co_await finish_reply(s, r);
}

}  // namespace kvroute::mocker
