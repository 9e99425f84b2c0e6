#include "self_improve/providers/scripted_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rvd::tune::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::abort();  // test code: a server that cannot listen fails the binary
}

bool WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

}  // namespace

ScriptedHttpServer::ScriptedHttpServer() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Die("bind");
  if (listen(listen_fd_, 16) != 0) Die("listen");
  socklen_t len = sizeof addr;
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("getsockname");
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ScriptedHttpServer::~ScriptedHttpServer() {
  std::vector<std::thread> handlers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    handlers.swap(handlers_);
  }
  for (std::thread& t : handlers) t.join();
  close(listen_fd_);
}

std::string ScriptedHttpServer::BaseUrl() const { return absl::StrCat("http://127.0.0.1:", port_); }

void ScriptedHttpServer::Enqueue(ScriptedReply reply) {
  absl::MutexLock lock(&mu_);
  replies_.push_back(std::move(reply));
}

std::vector<ReceivedRequest> ScriptedHttpServer::Requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

void ScriptedHttpServer::AcceptLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    handlers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void ScriptedHttpServer::Serve(int fd) {
  timeval tv{10, 0};  // a client that never finishes its request
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string in;
  char buf[4096];
  size_t head_end = std::string::npos;
  while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      close(fd);
      return;
    }
    in.append(buf, static_cast<size_t>(n));
  }
  ReceivedRequest req;
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(in).substr(0, head_end), "\r\n");
  std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ');
  if (first.size() >= 2) {
    req.method = std::string(first[0]);
    req.path = std::string(first[1]);
  }
  size_t content_length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "content-length") (void)absl::SimpleAtoi(value, &content_length);
    req.headers[name] = std::move(value);
  }
  std::string body = in.substr(head_end + 4);
  while (body.size() < content_length) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    body.append(buf, static_cast<size_t>(n));
  }
  req.body = std::move(body);

  ScriptedReply reply;
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(std::move(req));
    if (replies_.empty()) {
      reply.status = 599;
      reply.body = "scripted server: no reply left for this request";
      reply.content_type = "text/plain";
    } else {
      reply = std::move(replies_.front());
      replies_.pop_front();
    }
    if (reply.delay > absl::ZeroDuration()) {
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), reply.delay);
    }
  }
  if (!reply.close_without_answer) {
    std::string out =
        absl::StrCat("HTTP/1.1 ", reply.status, " ", Reason(reply.status),
                     "\r\nContent-Type: ", reply.content_type,
                     "\r\nContent-Length: ", reply.body.size(), "\r\nConnection: close\r\n");
    for (const auto& [name, value] : reply.headers)
      absl::StrAppend(&out, name, ": ", value, "\r\n");
    absl::StrAppend(&out, "\r\n", reply.body);
    (void)WriteAll(fd, out);
  }
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

}  // namespace rvd::tune::testing
