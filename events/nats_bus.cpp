#include "events/nats_bus.h"

#include <nats/nats.h>

#include <mutex>
#include <thread>
#include <vector>

namespace kvroute {

struct NatsBus::Impl {
  natsConnection* conn = nullptr;
  natsOptions* opts = nullptr;
  struct Sub {
    NatsBus::Handler handler;
    natsSubscription* sub = nullptr;
  };
  std::mutex mu;
  std::vector<std::unique_ptr<Sub>> subs;  // stable addresses: closures point into them
  NatsBus* owner = nullptr;
  std::function<void()> reconnected;  // set before traffic (on_reconnected)

  static void on_msg(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto* sub = static_cast<Sub*>(closure);
    const char* reply = natsMsg_GetReply(msg);
    NatsMessage m{natsMsg_GetSubject(msg),
                  std::string_view(natsMsg_GetData(msg), static_cast<size_t>(natsMsg_GetDataLength(msg))),
                  reply ? std::string_view(reply) : std::string_view()};
    sub->handler(m);
    natsMsg_Destroy(msg);
  }
  static void on_reconnected(natsConnection*, void* closure) {
    auto* impl = static_cast<Impl*>(closure);
    impl->owner->reconnects_.fetch_add(1, std::memory_order_relaxed);
    if (impl->reconnected) impl->reconnected();
  }
};

NatsBus::NatsBus(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->owner = this; }

NatsBus::~NatsBus() {
  if (!impl_) return;
  for (auto& s : impl_->subs) {
    if (s->sub) {
      natsSubscription_Unsubscribe(s->sub);
      natsSubscription_Destroy(s->sub);
    }
  }
  if (impl_->conn) {
    natsConnection_Close(impl_->conn);
    natsConnection_Destroy(impl_->conn);
  }
  if (impl_->opts) natsOptions_Destroy(impl_->opts);
}

std::unique_ptr<NatsBus> NatsBus::connect(const std::string& url, const std::string& client_name,
                                          std::chrono::milliseconds connect_timeout, std::string* error) {
  return connect(url, client_name, connect_timeout, NatsSecurity{}, error);
}

namespace {

// Applies authentication and TLS options; the first failure is returned.
natsStatus apply_security(natsOptions* o, const std::string& url, const NatsSecurity& sec, const char** what) {
  natsStatus s = NATS_OK;
  auto step = [&](natsStatus r, const char* name) {
    if (s == NATS_OK && r != NATS_OK) s = r, *what = name;
  };
  if (!sec.user.empty()) step(natsOptions_SetUserInfo(o, sec.user.c_str(), sec.password.c_str()), "events.nats_user");
  if (!sec.token.empty()) step(natsOptions_SetToken(o, sec.token.c_str()), "events.nats_token");
  if (!sec.creds_file.empty())
    step(natsOptions_SetUserCredentialsFromFiles(o, sec.creds_file.c_str(), nullptr), "events.nats_creds_file");
  if (!sec.nkey_seed_file.empty())
    step(natsOptions_SetNKeyFromSeed(o, nullptr, sec.nkey_seed_file.c_str()), "events.nats_nkey_seed_file");
  const bool tls = sec.tls || url.rfind("tls://", 0) == 0 || !sec.tls_ca_file.empty();
  if (tls) step(natsOptions_SetSecure(o, true), "events.nats_tls");
  if (!sec.tls_ca_file.empty())
    step(natsOptions_LoadCATrustedCertificates(o, sec.tls_ca_file.c_str()), "events.nats_tls_ca_file");
  if (!sec.tls_cert_file.empty())
    step(natsOptions_LoadCertificatesChain(o, sec.tls_cert_file.c_str(), sec.tls_key_file.c_str()),
         "events.nats_tls_cert_file");
  return s;
}

// Refusals that retrying cannot cure.
bool permanent(natsStatus s) {
  return s == NATS_NOT_PERMITTED || s == NATS_CONNECTION_AUTH_FAILED || s == NATS_SSL_ERROR || s == NATS_SECURE_CONNECTION_REQUIRED ||
         s == NATS_SECURE_CONNECTION_WANTED;
}

}  // namespace

std::unique_ptr<NatsBus> NatsBus::connect(const std::string& url, const std::string& client_name,
                                          std::chrono::milliseconds connect_timeout, const NatsSecurity& security,
                                          std::string* error) {
  auto impl = std::make_unique<Impl>();
  auto fail = [&](natsStatus s, const char* what) {
    if (error) *error = std::string(what) + ": " + natsStatus_GetText(s);
    if (impl->opts) natsOptions_Destroy(impl->opts);
    impl->opts = nullptr;
    return nullptr;
  };
  natsStatus s = natsOptions_Create(&impl->opts);
  if (s != NATS_OK) return fail(s, "nats options");
  natsOptions_SetURL(impl->opts, url.c_str());
  natsOptions_SetName(impl->opts, client_name.c_str());
  natsOptions_SetMaxReconnect(impl->opts, -1);  // reconnect forever
  natsOptions_SetReconnectWait(impl->opts, 250);
  natsOptions_SetReconnectBufSize(impl->opts, 64 << 20);
  natsOptions_SetTimeout(impl->opts, 1000);
  natsOptions_SetReconnectedCB(impl->opts, &Impl::on_reconnected, impl.get());
  const char* what = "";
  if (s = apply_security(impl->opts, url, security, &what); s != NATS_OK) return fail(s, what);

  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  for (;;) {
    s = natsConnection_Connect(&impl->conn, impl->opts);
    if (s == NATS_OK) break;
    impl->conn = nullptr;
    if (permanent(s) || std::chrono::steady_clock::now() >= deadline) {
      std::string why = "cannot connect to " + url;
      if (const char* last = nats_GetLastError(nullptr); last && *last) why += std::string(" (") + last + ")";
      return fail(s, why.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::unique_ptr<NatsBus>(new NatsBus(std::move(impl)));
}

bool NatsBus::subscribe(const std::string& subject, Handler handler, std::string* error) {
  auto sub = std::make_unique<Impl::Sub>();
  sub->handler = std::move(handler);
  natsStatus s = natsConnection_Subscribe(&sub->sub, impl_->conn, subject.c_str(), &Impl::on_msg, sub.get());
  if (s != NATS_OK) {
    if (error) *error = "subscribe " + subject + ": " + natsStatus_GetText(s);
    return false;
  }
  // Unbounded pending would hide a stuck consumer; a bounded one drops (and
  // the sequencer then sees an event_id gap and resyncs).
  natsSubscription_SetPendingLimits(sub->sub, 1 << 20, 1 << 30);
  std::lock_guard lk(impl_->mu);
  impl_->subs.push_back(std::move(sub));
  return true;
}

bool NatsBus::publish(std::string_view subject, std::string_view data) {
  std::string subj(subject);
  return natsConnection_Publish(impl_->conn, subj.c_str(), data.data(), static_cast<int>(data.size())) == NATS_OK;
}

std::optional<std::string> NatsBus::request(std::string_view subject, std::string_view data,
                                            std::chrono::milliseconds timeout) {
  std::string subj(subject);
  natsMsg* reply = nullptr;
  natsStatus s = natsConnection_Request(&reply, impl_->conn, subj.c_str(), data.data(),
                                        static_cast<int>(data.size()), timeout.count());
  if (s != NATS_OK || reply == nullptr) return std::nullopt;
  std::string out(natsMsg_GetData(reply), static_cast<size_t>(natsMsg_GetDataLength(reply)));
  natsMsg_Destroy(reply);
  return out;
}

bool NatsBus::flush(std::chrono::milliseconds timeout) {
  return natsConnection_FlushTimeout(impl_->conn, timeout.count()) == NATS_OK;
}

size_t NatsBus::max_payload() const {
  const int64_t n = natsConnection_GetMaxPayload(impl_->conn);
  return n > 0 ? static_cast<size_t>(n) : size_t{1} << 20;
}

void NatsBus::on_reconnected(std::function<void()> f) { impl_->reconnected = std::move(f); }

bool NatsBus::connected() const { return natsConnection_Status(impl_->conn) == NATS_CONN_STATUS_CONNECTED; }

}  // namespace kvroute
