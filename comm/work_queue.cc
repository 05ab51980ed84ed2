// The communicator's queue of asynchronous calls (braid::Work): one worker thread per communicator
// runs them in call order; a wait() on the next one, while the worker is idle, runs it on the
// waiting thread instead (runIfNext). Blocking calls wait for the queue first (waitForQueuedCalls).
#include <memory>
#include <mutex>
#include <thread>

#include "comm/base/deadline.h"
#include "comm/communicator.h"

namespace braid {

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
    // Calls run in call order: wait for queued asynchronous work first. (A thread's own earlier
    // submit() is always seen here; without one, the common case, no lock is taken.)
    std::unique_lock<std::mutex> g(qMu_);
    drainedCv_.wait(g, [&] { return queue_.empty() && !workerBusy_; });
  }
}

std::shared_ptr<WorkState> Comm::submit(const CollArgs& a) { return enqueue({{a}, false, nullptr}); }

std::shared_ptr<WorkState> Comm::submitGroup(std::vector<CollArgs> calls) {
  return enqueue({std::move(calls), true, nullptr});
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
  workerCv_.notify_one();
  return w;
}

void Comm::runQueued(Queued& item) {
  Status s;
  {
    std::lock_guard<std::mutex> g(execMu_);
    if (closed_) {
      s = Status::Aborted("the communicator was aborted");
    } else if (item.group) {
      s = executeGroup(item.calls);
    } else {
      s = execute(item.calls[0]);
      trace_.end(s);
    }
  }
  setLastError(s);
  item.work->finish(s);
  std::lock_guard<std::mutex> g(qMu_);
  workerBusy_ = false;
  asyncPending_.fetch_sub(1, std::memory_order_release);
  if (queue_.empty()) {
    drainedCv_.notify_all();  // no syscall when nobody waits
  } else {
    workerCv_.notify_one();  // the worker may wait behind this call for the next
  }
}

// How long the worker leaves a call it was just woken for to the thread that queued it. Most calls
// are waited on at once (torch makes every blocking collective as an asynchronous one and waits on
// it): that thread then runs it itself (runIfNext) instead of sleeping while the worker runs it,
// which saves two thread wake-ups on the call's path (at 8 B through torch, 45 us a call became
// 4 us here). Meanwhile the worker yields; it does not sleep on a timer, which cost as much as the
// wake-ups on this VM (a timerfd variant took 40 us a call). A call nobody waits on starts this
// much later, and the worker spends up to this long yielding for it.
constexpr std::int64_t kLeaveToWaiterUs = 50;

void Comm::workerLoop() {
  for (;;) {
    Queued item;
    {
      std::unique_lock<std::mutex> g(qMu_);
      // (not while runIfNext's thread runs one: the calls run in the order they were queued)
      workerCv_.wait(g, [&] { return (stopWorker_ && queue_.empty()) || (!queue_.empty() && !workerBusy_); });
      if (queue_.empty()) return;
      const std::uint64_t number = queue_.front().number;
      const std::int64_t due = queue_.front().queuedUs + kLeaveToWaiterUs;
      bool taken = false;
      while (!stopWorker_ && !taken && nowUs() < due) {
        g.unlock();
        std::this_thread::yield();
        g.lock();
        taken = workerBusy_ || queue_.empty() || queue_.front().number != number;
      }
      if (taken || workerBusy_ || queue_.empty()) continue;  // its caller runs it (or: stop, see the wait)
      item = std::move(queue_.front());
      queue_.pop_front();
      workerBusy_ = true;
    }
    runQueued(item);
  }
}

bool Comm::runIfNext(const std::shared_ptr<WorkState>& w) {
  Queued item;
  {
    std::lock_guard<std::mutex> g(qMu_);
    if (workerBusy_ || queue_.empty() || queue_.front().work != w) return false;
    item = std::move(queue_.front());
    queue_.pop_front();
    workerBusy_ = true;
  }
  runQueued(item);
  return true;
}

}  // namespace braid
