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
    static_cast<Impl*>(closure)->owner->reconnects_.fetch_add(1, std::memory_order_relaxed);
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

  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  for (;;) {
    s = natsConnection_Connect(&impl->conn, impl->opts);
    if (s == NATS_OK) break;
    impl->conn = nullptr;
    if (std::chrono::steady_clock::now() >= deadline) return fail(s, ("cannot connect to " + url).c_str());
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

bool NatsBus::connected() const { return natsConnection_Status(impl_->conn) == NATS_CONN_STATUS_CONNECTED; }

}  // namespace kvroute
