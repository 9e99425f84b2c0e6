// A small HTTP/1.1 server for the provider tests (test code only): listens on
// 127.0.0.1 at a free port, reads each request whole (Content-Length body),
// records it and answers with the next scripted reply, one connection per
// request ("Connection: close"). A reply can be delayed (a client timeout),
// or the connection closed without an answer (a reset server).
//
// Thread-safety: Enqueue and Requests may be called from any thread while
// the server runs; the destructor stops it (a delayed reply is cut short).
#ifndef RVD_SELF_IMPROVE_PROVIDERS_SCRIPTED_HTTP_SERVER_H_
#define RVD_SELF_IMPROVE_PROVIDERS_SCRIPTED_HTTP_SERVER_H_

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rvd::tune::testing {

struct ScriptedReply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra lines
  absl::Duration delay = absl::ZeroDuration();               // before the answer
  bool close_without_answer = false;                         // read the request, then hang up
};

struct ReceivedRequest {
  std::string method;
  std::string path;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

class ScriptedHttpServer {
 public:
  ScriptedHttpServer();  // CHECK-fails the test binary if it cannot listen
  ~ScriptedHttpServer();
  ScriptedHttpServer(const ScriptedHttpServer&) = delete;
  ScriptedHttpServer& operator=(const ScriptedHttpServer&) = delete;

  // "http://127.0.0.1:PORT".
  std::string BaseUrl() const;
  // Answers in the order enqueued; with none left a request gets a 599
  // whose body says so (a test that under-scripts fails visibly).
  void Enqueue(ScriptedReply reply);
  std::vector<ReceivedRequest> Requests() const;

 private:
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<ScriptedReply> replies_ ABSL_GUARDED_BY(mu_);
  std::vector<ReceivedRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> handlers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rvd::tune::testing

#endif  // RVD_SELF_IMPROVE_PROVIDERS_SCRIPTED_HTTP_SERVER_H_
