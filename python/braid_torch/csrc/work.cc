#include "work.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/core/StreamGuard.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "tensors.h"

namespace braid::torch_backend {

c10::intrusive_ptr<c10d::Work> WorkBraid::start(int rank, c10d::OpType type, braid::Work work, std::vector<at::Tensor> outputs,
                                                std::vector<at::Tensor> keep, std::function<void()> after) {
  auto w = deferred(rank, type, std::move(outputs), std::move(keep), std::move(after), {});
  if (w->onDevice() && w->after_) {  // stream-ordered behind the call (above)
    w->after_();
    w->after_ = nullptr;
  }
  attach(w, std::move(work));
  return w;
}

c10::intrusive_ptr<WorkBraid> WorkBraid::deferred(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                                                  std::vector<at::Tensor> keep, std::function<void()> after,
                                                  std::function<void()> flush) {
  auto w = c10::make_intrusive<WorkBraid>(rank, type, std::move(outputs));
  w->keep_ = std::move(keep);
  w->after_ = std::move(after);
  w->flush_ = std::move(flush);
  return w;
}

void WorkBraid::attach(const c10::intrusive_ptr<WorkBraid>& self, braid::Work work) {
  {
    std::lock_guard<std::mutex> g(self->flushMu_);
    self->flush_ = nullptr;
  }
  self->work_ = std::move(work);
  self->work_.onDone([self](const braid::Status& s) { self->complete(s); });
}

void WorkBraid::fail(const c10::intrusive_ptr<WorkBraid>& self, const braid::Status& error) {
  {
    std::lock_guard<std::mutex> g(self->flushMu_);
    self->flush_ = nullptr;
  }
  self->complete(error);
}

void WorkBraid::before(std::function<void()> f) {
  std::function<void()> then = std::move(after_);
  after_ = [f = std::move(f), then = std::move(then)] {
    f();
    if (then) then();
  };
}

namespace {
std::optional<c10::Stream> streamOfOutputs(const std::vector<at::Tensor>& outputs) {
  return outputs.empty() ? std::nullopt : currentStream(outputs[0]);
}
}  // namespace

WorkBraid::WorkBraid(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)), stream_(streamOfOutputs(outputs_)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          stream_ ? std::vector<c10::Device>{stream_->device()} : std::vector<c10::Device>{})) {}

c10::intrusive_ptr<c10::ivalue::Future> WorkBraid::getFuture() {
  kick();
  return future_;
}

bool WorkBraid::isCompleted() {
  kick();
  return c10d::Work::isCompleted();
}

bool WorkBraid::wait(std::chrono::milliseconds timeout) {
  kick();
  // A call that has not started runs here, on the waiting thread (braid::Work::wait): a
  // blocking collective then costs no hand-off to the worker thread and back. (An empty work_:
  // one that fail() ended, which has no call.)
  (void)work_.wait(timeout.count() > 0 ? static_cast<double>(timeout.count()) / 1000.0 : -1);  // (its status: complete() has it)
  const bool done = c10d::Work::wait(timeout);
  if (done && onDevice()) future_->wait();  // the waiter's current stream waits for the call's
  return done;
}

void WorkBraid::kick() {
  std::function<void()> flush;
  {
    std::lock_guard<std::mutex> g(flushMu_);
    flush = flush_;
  }
  if (flush) flush();
}

void WorkBraid::complete(const braid::Status& s) {
  // On a device, `after` (a receive's copy in: collectives ran theirs at the call) and the future's
  // completion go on the caller's stream, in that order (this runs on Braid's threads, whose
  // current stream is another).
  std::optional<c10::StreamGuard> onCallersStream;
  if (onDevice()) onCallersStream.emplace(*stream_);
  std::exception_ptr error;
  if (s.ok() && after_) {
    try {
      after_();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(std::string("braid: copying the result out failed: ") + e.what()));
    }
  }
  if (!s.ok()) error = std::make_exception_ptr(std::runtime_error("braid: " + s.toString()));
  keep_.clear();
  finish(error);
  if (error) future_->setError(error);
  else future_->markCompleted(c10::IValue(outputs_));
}

#if BRAID_TORCH_COALESCING
c10::intrusive_ptr<c10d::Work> WorkAll::over(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts) {
  return c10::make_intrusive<WorkAll>(rank, std::move(parts));
}

WorkAll::WorkAll(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts)
    : c10d::Work(rank, c10d::OpType::COALESCED), parts_(std::move(parts)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
  struct Left {
    std::mutex mu;
    std::size_t count = 0;
    std::exception_ptr error;  // the first part's that failed
  };
  auto left = std::make_shared<Left>();
  left->count = parts_.size();
  const std::vector<at::Tensor> all = result();
  if (parts_.empty()) future_->markCompleted(c10::IValue(all));
  for (auto& part : parts_)
    part->getFuture()->addCallback([left, all, future = future_](c10::ivalue::Future& f) {
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> g(left->mu);
        if (f.hasError() && !left->error) left->error = f.exception_ptr();
        if (--left->count > 0) return;
        error = left->error;
      }
      if (error) future->setError(error);
      else future->markCompleted(c10::IValue(all));
    });
}

bool WorkAll::isCompleted() {
  for (auto& part : parts_)
    if (!part->isCompleted()) return false;
  return true;
}

bool WorkAll::wait(std::chrono::milliseconds timeout) {
  for (auto& part : parts_)  // (each raises its error, as c10d's Works do)
    if (!part->wait(timeout)) return false;
  return true;
}

std::exception_ptr WorkAll::exception() const {
  for (const auto& part : parts_)
    if (auto e = part->exception()) return e;
  return nullptr;
}

std::vector<at::Tensor> WorkAll::result() {
  std::vector<at::Tensor> all;
  for (auto& part : parts_)
    for (const at::Tensor& t : part->result()) all.push_back(t);
  return all;
}

#endif

}  // namespace braid::torch_backend
