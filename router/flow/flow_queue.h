// The admission queue's bookkeeping: who waits for a worker, in which order
// they are offered a freed slot, and whom to shed when the queue is full.
// Pure (no I/O, no timers, no clock): the HTTP side (router/http/
// admission_queue.h) owns each waiter's timer and turns a wake-up into a
// posted handler on the waiter's io thread.
//
// Order, per model:
//   1. bands: band 0 (the highest priority) first; a lower band is offered a
//      slot only when no higher band of the model waits;
//   2. tenants within a band: start-time fair queuing by weight (each tenant
//      has a virtual time advanced by 1/weight per admission; the waiting
//      tenant with the least virtual time goes first; a tenant that starts
//      waiting catches up to the queue's virtual clock, so idling banks no
//      credit). This follows llm-d's flow control, whose dispatch is the
//      same three tiers (band, then flow by a fairness policy, then item:
//      llm-d-inference-scheduler pkg/epp/framework/plugins/flowcontrol/
//      fairness/README.md) and which displaces lower-priority queued items
//      to make room for higher ones (pkg/epp/flowcontrol/README.md), and
//      Dynamo's SchedulerQueue, which parks requests while every worker is
//      over its threshold and schedules them in priority order when capacity
//      frees up (lib/kv-router/src/scheduling/queue.rs, policy classes in
//      policy_queue.rs). kvroute keeps bands strict and tenants weighted.
//   3. first come, first served within a tenant.
//
// Event-driven: nobody polls. notify() (a request ended, a load report, a
// worker joined or came back) offers the head waiter of every model a trial:
// its wake() is called (it posts to the waiter's thread), the waiter routes
// again and reports trial_done(). One trial per model at a time; an
// admitted trial chains to the next head (more slots may be free), a failed
// one ends the chain unless another event came meanwhile.
//
// Handover: a waiter's take() may instead accept the trial for the thread
// that raised the event (the io thread whose request just freed the slot):
// that thread runs the waiter's trial once its locks are released and
// reports handover_done(), which says what to tell the waiter. While such a
// trial runs (state Handed) the waiter is neither shed nor stopped, and its
// leave() only marks it as given up: the waiter's own thread does not touch
// the request until it is told the outcome.
//
// Bounds: count (all bands), bytes of the waiting bodies, and an optional
// count per band. A request that does not fit sheds a waiter of a lower
// band, or of its own band from a tenant holding more than its weighted
// share, newest first; otherwise it is refused (the caller answers 429).
//
// Threading: every method is thread-safe (one mutex). wake() is called with
// that mutex held and must only post (never call back into the queue).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::flow {

// Why a waiter is woken.
enum class Wake : uint8_t {
  Try,   ///< a slot may be free: route again, then trial_done()
  Shed,  ///< pushed out by a request of a higher band or a fairer share (429)
  Stop,  ///< the router is shutting down
  Admitted,  ///< a trial handed over to another thread routed it (handover_done())
  Left,      ///< it gave up (leave()) while a handed-over trial failed: it left the queue
};

// One waiting request. Owned by the request (shared with the queue while
// queued); the queue fills the fields below `wake`.
struct Waiter {
  std::string model;
  uint32_t band = 0;    // 0 = highest
  uint32_t tenant = 0;  // index into the tenant table (bounded by config)
  uint32_t weight = 1;  // the tenant's weight, >= 1
  uint64_t bytes = 0;   // request body bytes held while waiting
  // When it entered, in the caller's clock (any monotonic count, e.g. steady
  // nanoseconds): the queue only stores and compares it (oldest_entry()), so
  // the queue itself stays clock-free.
  int64_t entered = 0;
  // Called with the queue's mutex held: post, never re-enter the queue.
  std::function<void(Wake)> wake;
  // Optional, called with the queue's mutex held before a trial's wake(Try):
  // true if the calling thread takes the trial (it must then run it outside
  // every lock and report handover_done(); wake(Try) is not called).
  std::function<bool()> take;

  enum class State : uint8_t { Idle, Queued, Trying, Handed, Gone };
  State state = State::Idle;  // guarded by the queue's mutex
  uint64_t seq = 0;           // arrival order
  // While Handed: leave() or stop_all() came meanwhile (guarded by the mutex).
  bool gave_up = false;
  bool stop_pending = false;
};

struct QueueLimits {
  uint64_t max_count = 0;              // all bands; 0 = no queue
  uint64_t max_bytes = 0;              // bodies of waiting requests; 0 = no limit
  std::vector<uint64_t> band_max;      // per band (index); absent or 0 = only max_count
};

enum class Enter : uint8_t { Queued, Full };

// What the status page, explain and the gauges show.
struct QueueSnapshot {
  uint64_t count = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> by_band;                // index = band
  std::map<uint32_t, uint64_t> by_tenant;       // tenant index -> waiting
  // The earliest `entered` of a band's (index) and a tenant's waiters, every
  // model; absent when none waits.
  std::vector<std::optional<int64_t>> oldest_by_band;
  std::map<uint32_t, int64_t> oldest_by_tenant;
};

class FlowQueue {
 public:
  // Queues `w` (its state becomes Queued), shedding lower or over-share
  // waiters if needed; Full (nothing changed) if it cannot fit. `position`
  // (may be null): waiters of the same model ahead of it by band at entry.
  Enter enter(const std::shared_ptr<Waiter>& w, const QueueLimits& limits, uint64_t* position = nullptr);
  // The waiter's trial ended: admitted (it leaves the queue and the next head
  // of its model gets a trial) or still busy (it keeps its place).
  void trial_done(Waiter& w, bool admitted);
  // A trial that take() handed to another thread ended there. Admitted: the
  // waiter leaves the queue (the next head gets a trial) and is told
  // Admitted. Not admitted: it keeps its place and is told nothing, unless
  // it gave up meanwhile (it leaves: Left) or the queue stopped (Stop).
  // nullopt: nothing to tell.
  std::optional<Wake> handover_done(Waiter& w, bool admitted);
  // The waiter gives up (its deadline): true if it was still queued (it is
  // removed now; a trial it had counts as failed), false if it was shed or
  // stopped meanwhile (its wake() was called) or a handed-over trial runs
  // (it will be told that trial's outcome: Admitted or Left).
  bool leave(Waiter& w);
  // Capacity may have been freed (any model): every model with waiters and
  // no trial in progress gets one; a model with a trial notes the event.
  void notify();
  // The same for one model.
  void notify(std::string_view model);
  // Wakes every waiter with Stop; later enter() calls are Full.
  void stop_all();
  bool empty() const;
  // Requests of `model` waiting in `band` or a higher one: how many a new
  // request of that band would wait behind (explain).
  uint64_t ahead(std::string_view model, uint32_t band) const;
  // The earliest `entered` of those requests (explain: how long the head has
  // waited); nullopt when none waits.
  std::optional<int64_t> oldest_entry(std::string_view model, uint32_t band) const;
  // Requests waiting now (lock-free).
  uint64_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  QueueSnapshot snapshot() const;

 private:
  struct Band {
    // tenant -> its waiters by arrival (seq)
    std::map<uint32_t, std::map<uint64_t, std::shared_ptr<Waiter>>> tenants;
    uint64_t count = 0;
  };
  struct Model {
    std::map<uint32_t, Band> bands;  // by band, highest first
    bool trying = false;             // a trial is in progress
    bool again = false;              // an event came during the trial
    uint64_t count = 0;
  };

  void insert(const std::shared_ptr<Waiter>& w);
  void remove(Waiter& w);
  // The next waiter of `m` to offer a slot (null: none idle).
  Waiter* head(Model& m);
  // Offers `m`'s head a trial unless one is in progress.
  void start_trial(Model& m);
  // An admitted trial's bookkeeping: its tenant's virtual time, out of the
  // queue, the next head's trial.
  void admitted(Waiter& w);
  // A waiter to shed for `w`: lowest band first, then the tenant most over
  // its weighted share, newest first. Null: nobody may be shed for it.
  Waiter* victim(const Waiter& w, uint32_t only_band, bool any_band, const std::vector<Waiter*>& taken);
  uint64_t tenant_count(uint32_t band, uint32_t tenant) const;
  double& vtime(uint32_t tenant);

  mutable std::mutex mu_;
  std::map<std::string, Model, std::less<>> models_;
  std::vector<uint64_t> band_count_;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> band_tenant_count_;  // (band, tenant) -> waiting
  std::map<uint32_t, uint64_t> tenant_count_;                             // tenant -> waiting (all bands)
  std::vector<double> vtime_;  // per tenant
  double vclock_ = 0;          // start tag of the last admission
  uint64_t count_ = 0;
  std::atomic<uint64_t> waiting_{0};  // count_, read without the lock by notify()
  uint64_t bytes_ = 0;
  uint64_t seq_ = 0;
  bool stopped_ = false;
};

}  // namespace kvroute::flow
