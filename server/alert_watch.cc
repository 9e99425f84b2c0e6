#include "server/alert_watch.h"

#include <memory>
#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/measure.h"

namespace rvd {
namespace {

// Writes one event at a time, pulled from the AlertWatch whenever no write
// is in flight. Pump runs on gRPC's threads (start, write done, cancel) and
// on the thread that logged an alert event (the watch's notify), serialized
// by mu_; StartWrite and Finish are called with mu_ released, so that a
// reaction gRPC ran inline could not deadlock on it.
//
// Lifetime: gRPC calls OnDone once, after Finish and every write; OnDone
// detaches the watch (waiting out a notify in progress) before deleting the
// reactor, so that no callback reaches a deleted reactor.
class AlertWatchReactor final
    : public grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent> {
 public:
  explicit AlertWatchReactor(
      std::function<grpc::Status(const absl::Status&)> finish)
      : finish_(std::move(finish)) {}

  void Start(absl::StatusOr<std::unique_ptr<AlertWatch>> watch) {
    if (!watch.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(finish_(watch.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      watch_ = *std::move(watch);
    }
    StartSendInitialMetadata();
    Pump();
  }

  void Notify() { Pump(); }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) gone_ = true;
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
    if (watch_ != nullptr) watch_->Detach();
    delete this;
  }

 private:
  void Pump() {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || watch_ == nullptr) return;
      std::optional<AlertStreamEvent> next;
      if (gone_) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED,
                              "the alert watch was cancelled");
      } else if ((next = watch_->Next()).has_value()) {
        ToProto(*next, &event_);
        writing_ = true;
      } else if (watch_->closed()) {
        // Events logged before the close are delivered first.
        finish = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("rvd is shutting down; resume with after_sequence ",
                         watch_->cursor()));
      } else {
        return;  // nothing now: the engine notifies
      }
      if (finish.has_value()) finished_ = true;
    }
    if (finish.has_value()) {
      Finish(*std::move(finish));
    } else {
      StartWrite(&event_);
    }
  }

  static void ToProto(const AlertStreamEvent& e, rvd::v1::AlertWatchEvent* out) {
    out->Clear();
    if (const auto* a = std::get_if<AlertEventPtr>(&e)) {
      *out->mutable_alert() = **a;
      return;
    }
    const GapMarker& g = std::get<GapMarker>(e);
    rvd::v1::Gap* gap = out->mutable_gap();
    gap->set_first_sequence(g.first_sequence);
    gap->set_last_sequence(g.last_sequence);
    gap->set_missed(g.missed);
    gap->set_reason(g.reason == GapMarker::Reason::kSlowConsumer
                        ? rvd::v1::GAP_REASON_SLOW_CONSUMER
                        : rvd::v1::GAP_REASON_NOT_RETAINED);
  }

  const std::function<grpc::Status(const absl::Status&)> finish_;
  absl::Mutex mu_;
  // Set once in Start, before any other thread can reach it; read by Pump
  // under mu_ and by OnDone after every other reaction.
  std::unique_ptr<AlertWatch> watch_;
  rvd::v1::AlertWatchEvent event_;  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent>* StartAlertWatch(
    AlertEngine* engine, const rvd::v1::WatchAlertsRequest& request,
    std::function<grpc::Status(const absl::Status&)> finish) {
  auto* reactor = new AlertWatchReactor(std::move(finish));
  if (engine == nullptr) {
    reactor->Start(absl::UnavailableError("alerts are not served"));
    return reactor;
  }
  if (!request.model_id().empty()) {
    if (absl::Status s = ValidateModelId(request.model_id()); !s.ok()) {
      reactor->Start(s);
      return reactor;
    }
  }
  std::optional<uint64_t> after;
  if (request.has_after_sequence()) after = request.after_sequence();
  reactor->Start(engine->Subscribe(request.model_id(), after,
                                   [reactor] { reactor->Notify(); }));
  return reactor;
}

}  // namespace rvd
