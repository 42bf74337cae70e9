// The mocker's Beast server: MockerServer's public API, the accept loop and
// the HTTP session (routes), NATS resync answers. See server_impl.h.
#include "mocker/server_impl.h"

namespace kvroute::mocker {

// `side`: the PD side channel / SGLang bootstrap port, which serves only its own routes.
awaitable<void> MockerServer::Impl::accept_loop(tcp::acceptor& a, bool side) {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await a.async_accept(nothrow(ec));
    if (ec) {
      if (!a.is_open()) co_return;
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(ioc, session(std::move(socket), side), asio::detached);
  }
}

awaitable<bool> MockerServer::Impl::respond(beast::tcp_stream& s, unsigned version, bool keep, http::status st,
                                            std::string body, std::string_view type) {
  http::response<http::string_body> res{st, version};
  res.set(http::field::server, "kvroute-mocker");
  res.set(http::field::content_type, beast::string_view(type.data(), type.size()));
  res.keep_alive(keep);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  co_await http::async_write(s, res, nothrow(ec));
  co_return !ec && keep;
}

// vLLM's /v1/embeddings, simulated: one small deterministic vector per input,
// from its first prompt's tokens.
awaitable<bool> MockerServer::Impl::embeddings(beast::tcp_stream& stream, const http::request<http::string_body>& req) {
  ParsedRequest parsed;
  ApiError err;
  std::string body;
  if (!parse_openai_request(ApiKind::Embeddings, req.body(), parsed, err)) {
    body = error_body(err);
  } else {
    TokenizerFallback fallback;
    TokenSource source;
    std::vector<TokenId> buffer;
    const auto tokens = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, nullptr);
    std::string data;
    for (uint32_t i = 0; i < parsed.prompts; ++i)
      data += fmt::format(R"({}{{"object":"embedding","index":{},"embedding":[{},0.5,-0.25,0.125]}})", i ? "," : "",
                          i, static_cast<double>(tokens.size() % 97) / 97.0);
    body = fmt::format(R"({{"object":"list","data":[{}],"model":"{}","usage":{{"prompt_tokens":{},"total_tokens":{}}}}})",
                       data, json_escape(opts.model), tokens.size(), tokens.size());
  }
  co_return co_await respond(stream, req.version(), req.keep_alive(),
                             err.message.empty() ? http::status::ok : http::status::bad_request, std::move(body));
}

bool MockerServer::Impl::authorized(const http::request<http::string_body>& req) {
  const auto auth = req.find(http::field::authorization);
  const auto api_key = req.find("x-api-key");
  if (auth != req.end()) {
    ++with_authorization;
    last_authorization = std::string(auth->value());
  }
  if (api_key != req.end()) {
    ++with_x_api_key;
    last_x_api_key = std::string(api_key->value());
  }
  // vLLM checks /v1 paths only, and never OPTIONS.
  if (opts.api_key.empty() || req.method() == http::verb::options || !req.target().starts_with("/v1")) return true;
  if (auth != req.end() && auth->value() == "Bearer " + opts.api_key) return true;
  ++unauthorized_total;
  return false;
}

// The test hooks (mocker/README.md "Test hooks"); false: not one of their routes.
awaitable<bool> MockerServer::Impl::test_hook(beast::tcp_stream& stream, const http::request<http::string_body>& req,
                                              bool& again) {
  const std::string_view target(req.target().data(), req.target().size());
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  if (target == "/mocker/drop_events" && req.method() == http::verb::post) {
    simdjson::dom::parser p;
    uint64_t n = 0;
    auto doc = p.parse(req.body());
    if (!doc.error() && !doc.value_unsafe()["count"].get_uint64().get(n)) {
      if (vllm) vllm->drop_next_live(n);  // vLLM mode: n batches skip the PUB socket (replay has them)
      else drop_remaining += n;
      again = co_await respond(stream, v, keep, http::status::ok, fmt::format(R"({{"dropping":{}}})", drop_remaining));
    } else {
      again = co_await respond(stream, v, keep, http::status::bad_request,
                               R"({"error":{"message":"body must be {\"count\": N}","type":"invalid_request_error","param":"count","code":null}})");
    }
  } else if ((target == "/mocker/hang" || target == "/mocker/pd/hold_answers") && req.method() == http::verb::post) {
    // The test hooks switched by {"enabled": bool}.
    const bool hold = target == "/mocker/pd/hold_answers";
    simdjson::dom::parser p;
    bool on = false;
    auto doc = p.parse(req.body());
    if (!doc.error() && !doc.value_unsafe()["enabled"].get_bool().get(on)) {
      (hold ? hold_answers : hang) = on;
      if (hold && !on) answers_gate.cancel();  // the held answers go now
      again = co_await respond(stream, v, keep, http::status::ok,
                               fmt::format(R"({{"{}":{}}})", hold ? "hold_answers" : "hang", on));
    } else {
      again = co_await respond(stream, v, keep, http::status::bad_request,
                               R"({"error":{"message":"body must be {\"enabled\": true|false}","type":"invalid_request_error","param":"enabled","code":null}})");
    }
  } else {
    co_return false;
  }
  co_return true;
}

awaitable<void> MockerServer::Impl::session(tcp::socket socket, bool side) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(side ? (4 << 20) : (64 << 20));
    beast::error_code ec;
    co_await http::async_read(stream, buffer, parser, nothrow(ec));
    if (ec) break;
    auto req = parser.release();
    std::string_view target(req.target().data(), req.target().size());
    const bool keep = req.keep_alive();
    const unsigned v = req.version();
    bool again = false;
    if (!side && !authorized(req)) {
      again = co_await respond(stream, v, keep, http::status::unauthorized, R"({"error":"Unauthorized"})");
    } else if (side) {
      if (!co_await side_channel(stream, req, again))
        again = co_await respond(stream, v, keep, http::status::not_found,
                                 R"({"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}})");
    } else if (req.method() == http::verb::post && target == "/v1/completions") {
      again = co_await generate(stream, req, ApiKind::Completions);
    } else if (req.method() == http::verb::post && target == "/v1/chat/completions") {
      again = co_await generate(stream, req, ApiKind::ChatCompletions);
    } else if (req.method() == http::verb::post && target == "/v1/responses") {
      again = co_await generate(stream, req, ApiKind::Responses);
    } else if (req.method() == http::verb::get && target.starts_with("/v1/responses/")) {
      // vLLM's retrieve (responses/serving.py retrieve_responses): the stored
      // response object, or 404 as for an unknown previous_response_id.
      const std::string_view id = target.substr(14, target.find('?') == std::string_view::npos
                                                        ? std::string_view::npos
                                                        : target.find('?') - 14);
      if (const std::string* body = stored_response(id))
        again = co_await respond(stream, v, keep, http::status::ok, *body);
      else
        again = co_await respond(stream, v, keep, http::status::not_found,
                                 error_body(ApiError{404, fmt::format("Response with id '{}' not found.", id),
                                                     "invalid_request_error", "", ""}));
    } else if (req.method() == http::verb::post && target == "/v1/messages") {
      again = co_await generate(stream, req, ApiKind::Messages);
    } else if (req.method() == http::verb::post && target == "/v1/embeddings") {
      again = co_await embeddings(stream, req);
    } else if (req.method() == http::verb::post && target == "/tokenize") {
      again = co_await tokenize(stream, req);
    } else if (const auto api = api_of_path(target); api && is_passthrough(*api) && *api != ApiKind::Tokenize &&
                                                      req.method() == http::verb::post) {
      again = co_await passthrough(stream, req, *api);
    } else if (target == "/mocker/tokenize" && req.method() == http::verb::post) {
      simdjson::dom::parser p;
      std::string_view mode;
      auto doc = p.parse(req.body());
      if (!doc.error() && !doc.value_unsafe()["mode"].get_string().get(mode) &&
          (mode == "ok" || mode == "reject" || mode == "error" || mode == "hang")) {
        tokenize_mode = std::string(mode);
        again = co_await respond(stream, v, keep, http::status::ok, fmt::format(R"({{"mode":"{}"}})", tokenize_mode));
      } else {
        again = co_await respond(stream, v, keep, http::status::bad_request,
                                 R"({"error":{"message":"body must be {\"mode\": \"ok\"|\"reject\"|\"error\"|\"hang\"}","type":"invalid_request_error","param":"mode","code":null}})");
      }
    } else if (target == "/health") {
      again = co_await respond(stream, v, keep, http::status::ok, R"({"status":"ok"})");
    } else if (target == "/v1/models") {
      again = co_await respond(
          stream, v, keep, http::status::ok,
          fmt::format(R"({{"object":"list","data":[{{"id":"{}","object":"model","created":0,"owned_by":"kvroute-mocker"}}]}})",
                      json_escape(opts.model)));
    } else if (target == "/metrics") {
      again = co_await respond(stream, v, keep, http::status::ok, metrics_text(), "text/plain; version=0.0.4");
    } else if (target == "/mocker/stats") {
      again = co_await respond(stream, v, keep, http::status::ok, stats_json());
    } else if (co_await test_hook(stream, req, again)) {
    } else {
      again = co_await respond(stream, v, keep, http::status::not_found,
                               R"({"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}})");
    }
    if (!again) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

void MockerServer::Impl::answer_resync(const std::string& reply, const std::string& body) {
  if (bus->publish(reply, body)) return;  // checked: the router asks for the chunk again
  ++resync_publish_failed;
  spdlog::warn("kvroute-mocker: resync reply of {} bytes not published ({} so far)", body.size(),
               resync_publish_failed);
}

MockerServer::MockerServer(MockerOptions opts, NatsBus* bus, VllmPublisher* vllm)
    : MockerServer(std::move(opts), bus, vllm ? std::vector<VllmPublisher*>{vllm} : std::vector<VllmPublisher*>{}) {}
MockerServer::MockerServer(MockerOptions opts, NatsBus* bus, std::vector<VllmPublisher*> vllm)
    : impl_(std::make_unique<Impl>(std::move(opts), bus, std::move(vllm))) {}
MockerServer::~MockerServer() = default;

bool MockerServer::listen(std::string* error) {
  if (!impl_->open_offload(error)) return false;
  beast::error_code ec;
  auto addr = asio::ip::make_address(impl_->opts.host, ec);
  if (ec) {
    if (error) *error = fmt::format("--host: '{}' is not an IP address", impl_->opts.host);
    return false;
  }
  tcp::endpoint ep(addr, impl_->opts.port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error) *error = fmt::format("cannot listen on {}:{}: {}", impl_->opts.host, impl_->opts.port, ec.message());
    return false;
  }
  if (impl_->opts.pd.protocol == PdProtocol::None) return true;
  // An SGLang decode worker runs no bootstrap server (only the prefill side does).
  if (impl_->opts.pd.protocol == PdProtocol::Sglang && impl_->opts.pd.role == PdRole::Decode) return true;
  // PD: the side channel (vLLM NIXL's, VLLM_NIXL_SIDE_CHANNEL_PORT) or SGLang's bootstrap server, on the same host.
  tcp::endpoint sep(addr, impl_->opts.pd.side_channel_port);
  auto& sa = impl_->side_acceptor;
  sa.open(sep.protocol(), ec);
  if (!ec) sa.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) sa.bind(sep, ec);
  if (!ec) sa.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error)
      *error = fmt::format("cannot listen on {}:{} ({}): {}", impl_->opts.host, impl_->opts.pd.side_channel_port,
                           impl_->opts.pd.protocol == PdProtocol::Sglang ? "--disaggregation-bootstrap-port"
                                                                         : "--pd-side-channel-port",
                           ec.message());
    return false;
  }
  return true;
}

uint16_t MockerServer::port() const { return impl_->acceptor.local_endpoint().port(); }

uint16_t MockerServer::side_channel_port() const {
  return impl_->side_acceptor.is_open() ? impl_->side_acceptor.local_endpoint().port() : 0;
}

bool MockerServer::start_nats(std::string* error) {
  if (!impl_->bus) return true;
  const std::string subject = fmt::format("{}.kv_resync.{}", impl_->opts.subject_prefix, impl_->opts.worker_id);
  return impl_->bus->subscribe(
      subject,
      [impl = impl_.get()](const NatsMessage& m) {
        if (m.reply.empty()) return;
        // The engine lives on the io thread: take the dump there. Chunked
        // (events/wire.h): chunk 0 of snapshot 0 takes a new snapshot.
        ResyncRequest rq;
        if (decode_resync_request(m.data, rq) != DecodeError::None) return;
        asio::post(impl->ioc, [impl, rq, reply = std::string(m.reply)] {
          const std::vector<std::string>* chunks = nullptr;
          for (const auto& [id, c] : impl->resync_snapshots)
            if (id == rq.snapshot) chunks = &c;
          if (!chunks) {
            if (rq.snapshot != 0 || rq.chunk != 0) {
              impl->answer_resync(reply, encode_resync_gone());
              return;
            }
            ResyncDump d;
            d.owner = CacheOwner{WorkerId{impl->opts.worker_id}, 0};
            d.last_event_id = impl->engine.last_event_id();
            d.instance = impl->instance_id;
            d.events = impl->offload_dump();  // the engine's blocks, and the offload tiers' (offload mode)
            if (rq.max_bytes == 0) {  // a router of the legacy protocol: one message
              impl->answer_resync(reply, encode_resync_dump(d));
              return;
            }
            const size_t cap = std::min<size_t>(rq.max_bytes, impl->bus->max_payload());
            ++impl->resync_snapshot;
            impl->resync_snapshots.emplace_back(impl->resync_snapshot,
                                                encode_resync_chunks(d, impl->resync_snapshot, cap));
            if (impl->resync_snapshots.size() > 4) impl->resync_snapshots.pop_front();
            chunks = &impl->resync_snapshots.back().second;
          }
          if (rq.chunk >= chunks->size()) return;  // nonsense: no answer
          impl->answer_resync(reply, (*chunks)[rq.chunk]);
        });
      },
      error);
}

void MockerServer::run() {
  asio::co_spawn(impl_->ioc, impl_->accept_loop(impl_->acceptor, false), asio::detached);
  if (impl_->side_acceptor.is_open())
    asio::co_spawn(impl_->ioc, impl_->accept_loop(impl_->side_acceptor, true), asio::detached);
  if (impl_->bus) impl_->heartbeat_loop();
  impl_->ioc.run();
}

void MockerServer::stop() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->side_acceptor.close(ec);
    impl->ioc.stop();
  });
}

}  // namespace kvroute::mocker
