// The communicator's queue of asynchronous calls (braid::Work): one worker thread per communicator
// runs them in call order; a wait() on one not started, while the worker is idle, runs it (and
// those queued before it) on the waiting thread instead (runQueuedThrough). Blocking calls run or
// wait for the queue first (waitForQueuedCalls).
//
// The worker leaves a call to the thread that queued it for kLeaveToWaiterUs: most calls are
// waited on at once (torch makes every blocking collective as an asynchronous one and waits on it),
// and that thread then runs it itself instead of sleeping while the worker runs it. How the worker
// learns of a call depends on the host:
// - Spare cores: the queue wakes it (when it sleeps), and it yields through the window before it
//   takes the call. A timer instead costs more than the wake: arming one is a VM exit here (two
//   per call, armed and disarmed, made an 8 B all-reduce through torch 31 us against 4.4).
// - Oversubscribed (the host's ranks outnumber its CPUs): no wake per call. A worker woken to
//   yield through the window takes the core from the ranks sharing it: 34 us of a 55 us 8 B
//   all-reduce through torch at 4 ranks on 2 cores. The queue arms the worker's alarm to ring
//   within kLazyWakeUs unless it is armed already (one timer per kLazyWakeUs of calls, however
//   many), and a later call queued behind one its caller left wakes the worker at once.
//   A call nobody waits on thus starts within kLazyWakeUs, or at the next call.
#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>

#include "base/deadline.h"
#include "comm/communicator.h"

namespace braid {

// The caller's window: long enough for a thread that waits at once to claim its call.
constexpr std::int64_t kLeaveToWaiterUs = 50;
// Oversubscribed: how late the worker may learn of a call nobody waits on (one timer per this much
// of calls costs under 1% of a core here).
constexpr std::int64_t kLazyWakeUs = 2000;

namespace {
// How deep this thread is in Work callbacks that runQueued runs: a callback may make calls on the
// communicator and wait for them, so it must not wait for callbacks (its own among them) to end.
thread_local int tlsCallbackDepth = 0;
// Set when a communicator ends on its own worker thread (its last handle dropped there): the
// worker, detached, must leave without touching it.
thread_local bool tlsEndedOnWorker = false;
}  // namespace

void WorkState::finish(Status s) {
  std::vector<std::function<void(const Status&)>> callbacks;
  {
    std::lock_guard<std::mutex> g(mu);
    status = std::move(s);
    done = true;
    callbacks.swap(onDone);
    cv.notify_all();
  }
  for (auto& f : callbacks) f(status);  // status no longer changes: read without the lock
}

void WorkState::whenDone(std::function<void(const Status&)> f) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!done) {
      onDone.push_back(std::move(f));
      return;
    }
  }
  f(status);
}

void Comm::waitForQueuedCalls() {
  if (asyncPending_.load(std::memory_order_acquire) > 0) {
    // Calls run in call order: queued asynchronous work first, run here while the worker is not
    // running one (it would be woken for them otherwise), then waited for. (A thread's own earlier
    // submit() is always seen here; without one, the common case, no lock is taken.)
    runQueuedThrough(nullptr, true);
    std::unique_lock<std::mutex> g(qMu_);
    drainedCv_.wait(g, [&] { return queue_.empty() && !workerBusy_ && (callbacksRunning_ == 0 || tlsCallbackDepth > 0); });
  }
}

// A call made from a Work callback runs at once, on the callback's thread, with the calls queued
// before it: the callback may wait for it without a Braid wait (a torch future completed by this
// call's own callback, as a DDP comm hook chains them), and the worker that would run it may be
// the thread running the callback.
void Comm::runIfInCallback(const std::shared_ptr<WorkState>& w) {
  if (tlsCallbackDepth > 0) runQueuedThrough(w, true);
}

std::shared_ptr<WorkState> Comm::submit(const CollArgs& a) {
  Caller caller(*this, a);
  if (!caller.status().ok()) return WorkState::finished(caller.status());
  auto w = enqueue({{a}, false, nullptr});
  runIfInCallback(w);
  return w;
}

std::shared_ptr<WorkState> Comm::submitGroup(std::vector<CollArgs> calls) {
  Caller caller(*this, calls.empty() ? CollArgs{} : calls.front());
  if (!caller.status().ok()) return WorkState::finished(caller.status());
  auto w = enqueue({std::move(calls), true, nullptr});
  runIfInCallback(w);
  return w;
}

std::shared_ptr<WorkState> Comm::enqueue(Queued item) {
  auto w = std::make_shared<WorkState>();
  std::lock_guard<std::mutex> g(qMu_);
  if (stopWorker_) {  // destroyed or aborted meanwhile: never restart the worker
    w->finish(Status::InvalidUsage("the communicator was destroyed or aborted"));
    return w;
  }
  if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
  w->owner = self_;
  item.work = w;
  item.number = ++queuedCount_;
  item.queuedUs = nowUs();
  queue_.push_back(std::move(item));
  asyncPending_.fetch_add(1, std::memory_order_release);
  if (!lazyWorkerWake_) {
    if (workerSleeping_) workerAlarm_.wakeNow();
  } else if (!workerBusy_ && workerSleeping_ && nowUs() - queue_.front().queuedUs >= kLeaveToWaiterUs) {
    workerAlarm_.wakeNow();  // its caller left the call in front: no reason to wait for the alarm
  } else {
    workerAlarm_.ringIn(kLazyWakeUs);  // (nothing when armed already)
  }
  return w;
}

void Comm::runQueued(Queued& item, std::shared_ptr<Comm>* keepThroughCallbacks) {
  Status s;
  {
    std::lock_guard<std::mutex> g(execMu_);
    if (closed_) {
      s = Status::Aborted("the communicator was aborted");
    } else if (item.group) {
      s = executeGroup(item.calls);
    } else {
      s = execute(item.calls[0]);
      callEnds(s);
    }
  }
  setLastError(s);
  // The call is over before its callbacks run: a callback may make calls on this communicator and
  // wait for them (torch's DDP comm hooks chain collectives this way), which then run here, or on
  // whichever thread gets to them first, rather than wait behind the call whose callback it is.
  {
    std::lock_guard<std::mutex> g(qMu_);
    workerBusy_ = false;
    ++callbacksRunning_;
    if (!queue_.empty() && workerSleeping_) workerAlarm_.wakeNow();  // the worker may wait behind this call for the next
  }
  if (keepThroughCallbacks) *keepThroughCallbacks = self_.lock();
  ++tlsCallbackDepth;
  item.work->finish(s);
  --tlsCallbackDepth;
  std::lock_guard<std::mutex> g(qMu_);
  --callbacksRunning_;
  asyncPending_.fetch_sub(1, std::memory_order_release);
  if (queue_.empty() && !workerBusy_) drainedCv_.notify_all();  // no syscall when nobody waits
}

void Comm::workerLoop() {
  markInternalThread();  // a Work callback it runs may call this communicator while a user thread is inside one
  for (;;) {
    Queued item;
    {
      std::unique_lock<std::mutex> g(qMu_);
      for (;;) {
        if (stopWorker_ && queue_.empty()) return;
        // (not while runQueuedThrough's thread runs one: the calls run in the order they were queued)
        if (!queue_.empty() && !workerBusy_) {
          const std::int64_t left = queue_.front().queuedUs + kLeaveToWaiterUs - nowUs();
          if (stopWorker_ || left <= 0) break;
          if (!lazyWorkerWake_) {  // the caller's window, yielding (see above)
            g.unlock();
            std::this_thread::yield();
            g.lock();
            continue;
          }
          workerAlarm_.ringIn(left);  // (queued as the alarm rang: it may not be armed for it)
        }
        workerSleeping_ = true;
        g.unlock();
        workerAlarm_.sleep();
        g.lock();
        workerSleeping_ = false;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      workerBusy_ = true;
    }
    // A callback may drop the communicator's last handle (torch frees a process group from a
    // future's callback): runQueued holds a handle through the callbacks, and the communicator
    // may then end here, on this thread (~Comm), which then leaves at once.
    std::shared_ptr<Comm> keep;
    runQueued(item, &keep);
    keep.reset();
    if (tlsEndedOnWorker) {
      tlsEndedOnWorker = false;
      return;  // (this Comm is gone)
    }
  }
}

void Comm::endWorker() {
  std::thread worker;
  {
    std::lock_guard<std::mutex> g(qMu_);
    worker = std::move(worker_);
  }
  if (!worker.joinable()) return;
  if (worker.get_id() == std::this_thread::get_id()) {  // ending on the worker (workerLoop)
    worker.detach();
    tlsEndedOnWorker = true;
    return;
  }
  worker.join();
}

void Comm::runQueuedThrough(const std::shared_ptr<WorkState>& w, bool alsoEarlier) {
  for (;;) {
    Queued item;
    {
      std::lock_guard<std::mutex> g(qMu_);
      if (workerBusy_ || queue_.empty()) return;
      if (w && (alsoEarlier ? std::none_of(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.work == w; })
                            : queue_.front().work != w))
        return;  // the worker has it (or it ran), or, without alsoEarlier, it is not next
      item = std::move(queue_.front());
      queue_.pop_front();
      workerBusy_ = true;
    }
    const bool last = item.work == w;
    runQueued(item);
    if (last) return;
  }
}

}  // namespace braid
