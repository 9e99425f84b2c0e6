// The reactor both watch streams (WatchMeasurements, WatchAlerts) run on:
// one gRPC callback-API server stream that writes the events of a
// subscription, one write at a time.
#ifndef RVD_SERVER_WATCH_REACTOR_H_
#define RVD_SERVER_WATCH_REACTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "rvd/v1/rvd.pb.h"
#include "server/event_bus.h"

namespace rvd {

// A gap marker on the wire (both streams report missed entries alike).
inline void GapToProto(const GapMarker& g, rvd::v1::Gap* gap) {
  gap->set_first_sequence(g.first_sequence);
  gap->set_last_sequence(g.last_sequence);
  gap->set_missed(g.missed);
  gap->set_reason(g.reason == GapMarker::Reason::kSlowConsumer
                      ? rvd::v1::GAP_REASON_SLOW_CONSUMER
                      : rvd::v1::GAP_REASON_NOT_RETAINED);
}

// Writes the events of a Sub (a subscription: Watch, AlertWatch) to one
// stream of Proto. Sub has closed() (shutdown: the stream should end),
// cursor() (what a client resumes after) and Detach() (no notify runs once
// it returns); `fill` writes Sub's next event into the Proto (true), says
// none is available now (false: Notify comes when one is), or fails the
// stream.
//
// Pump, which writes the next event whenever no write is in flight, runs on
// gRPC's threads (start, write done, cancel) and on the publishing thread
// (Notify), serialized by mu_. StartWrite and Finish are called with mu_
// released, so that a reaction gRPC ran inline could not deadlock on it.
//
// Lifetime: gRPC calls OnDone once, after Finish and every write; OnDone
// detaches the subscription (waiting out a notify in progress) before
// deleting the reactor, so that no callback reaches a deleted reactor.
template <typename Proto, typename Sub>
class WatchReactor final : public grpc::ServerWriteReactor<Proto> {
 public:
  using Fill = std::function<absl::StatusOr<bool>(Sub& sub, Proto* out)>;
  // What a closed subscription's stream does: end at once (a measurement
  // watch, whose Next could go on replaying the log), or first deliver
  // what is already there (alerts, held in memory).
  enum class OnClose { kEndNow, kDrainFirst };
  // `finish` counts a failed stream in /metrics and converts its status;
  // `what` names the stream in its CANCELLED message.
  WatchReactor(Fill fill, OnClose on_close, std::string what,
               std::function<grpc::Status(const absl::Status&)> finish)
      : fill_(std::move(fill)),
        on_close_(on_close),
        what_(std::move(what)),
        finish_(std::move(finish)) {}

  // Starts the stream over `sub` (an error: ends it with that status).
  void Start(absl::StatusOr<std::unique_ptr<Sub>> sub) {
    if (!sub.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      this->Finish(finish_(sub.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      sub_ = *std::move(sub);
    }
    // The client learns the stream is open before the first event.
    this->StartSendInitialMetadata();
    Pump();
  }

  // The publisher's notify: an event is there, or the subscription closed.
  void Notify() { Pump(); }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) gone_ = true;  // the client went away or the call ended
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
    }
    Pump();
  }

  void OnDone() override {
    if (sub_ != nullptr) sub_->Detach();
    delete this;
  }

 private:
  void Pump() {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || sub_ == nullptr) return;
      if (gone_) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED,
                              absl::StrCat("the ", what_, " was cancelled"));
      } else if (on_close_ == OnClose::kEndNow && sub_->closed()) {
        finish = Closed();
      } else {
        absl::StatusOr<bool> wrote = fill_(*sub_, &event_);
        if (!wrote.ok()) {
          finish = finish_(wrote.status());
        } else if (*wrote) {
          writing_ = true;
        } else if (sub_->closed()) {
          finish = Closed();
        } else {
          return;  // nothing now: the publisher notifies
        }
      }
      if (finish.has_value()) finished_ = true;
    }
    if (finish.has_value()) {
      this->Finish(*std::move(finish));
    } else {
      this->StartWrite(&event_);
    }
  }

  grpc::Status Closed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("rvd is shutting down; resume with after_sequence ",
                     sub_->cursor()));
  }

  const Fill fill_;
  const OnClose on_close_;
  const std::string what_;
  const std::function<grpc::Status(const absl::Status&)> finish_;
  absl::Mutex mu_;
  // Set once in Start, before any other thread can reach it; read by Pump
  // under mu_ and by OnDone after every other reaction.
  std::unique_ptr<Sub> sub_;
  Proto event_;                                 // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // a StartWrite is in flight
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called or due
  bool gone_ ABSL_GUARDED_BY(mu_) = false;      // cancelled or a write failed
};

}  // namespace rvd

#endif  // RVD_SERVER_WATCH_REACTOR_H_
