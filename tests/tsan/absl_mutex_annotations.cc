// Makes Debian's absl::Mutex, CondVar and Notification visible to
// ThreadSanitizer, for the TSan build of rvd's concurrency tests (make tsan).
//
// Why: libabsl_synchronization is built without -fsanitize=thread, so TSan
// sees neither its atomics nor its futex waits, and reports every access
// guarded by an absl::Mutex as a race. This file, linked into a test binary
// only when RVD_SANITIZE contains "thread", interposes the library's entry
// points: each one calls the real function (found with dlsym(RTLD_NEXT)) and
// tells TSan the happens-before edge it creates, with __tsan_acquire after
// a lock is taken and __tsan_release before it is given up (Await and
// CondVar::Wait give it up and take it again inside). Data races in our own
// code stay visible: only the lock's own edges are added.
//
// The mangled names carry absl's inline namespace (ABSL_OPTION_INLINE_
// NAMESPACE_NAME, "debian3" on Debian 12); a missing symbol stops the test
// at its first lock rather than running it unannotated.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define RVD_STR2(x) #x
#define RVD_STR(x) RVD_STR2(x)

// "_ZN[K]4absl<len><ns>" + rest: the mangled name of absl::<ns>::<rest>
// (K: a const member function).
std::string Mangled(const char* rest, bool is_const) {
  const std::string ns = RVD_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string(is_const ? "_ZNK" : "_ZN") + "4absl" +
         std::to_string(ns.size()) + ns + rest;
}

template <typename F>
F Real(const char* rest, bool is_const = false) {
  const std::string name = Mangled(rest, is_const);
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    __builtin_printf("absl_mutex_annotations: %s not found\n", name.c_str());
    std::abort();
  }
  F f;
  static_assert(sizeof(f) == sizeof(p));
  std::memcpy(&f, &p, sizeof(p));
  return f;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool ok = real(this, cond, timeout);
  __tsan_acquire(this);  // held on return either way
  return ok;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool ok = real(this, cond, deadline);
  __tsan_acquire(this);
  return ok;
}

void Mutex::Await(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool ok = real(this, cond, timeout);
  __tsan_acquire(this);
  return ok;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool ok = real(this, cond, deadline);
  __tsan_acquire(this);
  return ok;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>(
      "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  static auto real =
      Real<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>(
      "12Notification19WaitForNotificationEv", true);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool ok = real(this, timeout);
  if (ok) __tsan_acquire(const_cast<Notification*>(this));
  return ok;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool ok = real(this, deadline);
  if (ok) __tsan_acquire(const_cast<Notification*>(this));
  return ok;
}

ABSL_NAMESPACE_END
}  // namespace absl
