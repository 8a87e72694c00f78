// The HTTP/1.1 server under mlag serve: event-driven, on Boost.Beast's
// parser over Asio, so that no client can hold a thread. One thread runs
// every connection; the handler is called on it and must not block (mlag
// serve hands requests to the engine thread and is told of their tokens
// through Post).
//
// What a client gets:
// - A request must arrive whole (headers and body) within request_timeout of
//   its connection becoming idle; a slow or idle connection is then closed,
//   however often it trickles a byte. A write that does not drain within
//   write_timeout closes the connection too.
// - HTTP/1.0 is answered as 1.0, with a Content-Length (a streamed reply
//   ends by closing the connection); keep-alive follows the request.
//   Pipelined requests are answered in order, one at a time.
// - A body over max_body_bytes gets 413, a malformed request 400 and
//   headers over max_header_bytes 431, each as JSON from `error_body`, and
//   then the connection closes.
// - While a reply is pending, a client that closes its connection is
//   noticed at once (the exchange's abandon callback runs).
// - SIGINT or SIGTERM: the server stops accepting, closes every connection
//   with no reply pending, lets pending replies end (their connections then
//   close), and after shutdown_timeout closes the rest, abandoning their
//   replies. A second signal closes everything at once. Run then returns.
//
//   MLAG_ASSIGN_OR_RETURN(auto server, HttpServer::Listen(options, handler, error_body));
//   server->Run();  // until shut down
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mlag::cli {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  // The listen backlog; the kernel caps it at net.core.somaxconn (4096 on
  // current kernels). A burst of connects beyond it waits for a SYN retry
  // (a second or more).
  int backlog = 4096;
  absl::Duration request_timeout = absl::Seconds(10);
  absl::Duration write_timeout = absl::Seconds(30);
  absl::Duration shutdown_timeout = absl::Seconds(10);
  size_t max_body_bytes = size_t{64} << 20;
  size_t max_header_bytes = size_t{64} << 10;
};

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string path;    // the target without its query
  std::string body;
  int version = 11;  // 10 or 11
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

class HttpConnection;

// One request's reply. Every method runs on the server's thread only (from
// the handler, or from a function given to HttpServer::Post). A reply is
// either whole (Reply) or streamed (BeginStream, Write..., End); calls after
// it ended, or after the client went away, do nothing.
class HttpExchange {
 public:
  explicit HttpExchange(std::weak_ptr<HttpConnection> connection)
      : connection_(std::move(connection)) {}

  // A whole reply, with a Content-Length.
  void Reply(int status, const std::string& content_type, const std::string& body,
             const HttpHeaders& headers = {});
  // The head of a streamed reply: chunked on HTTP/1.1; on HTTP/1.0 the body
  // runs until the connection closes.
  void BeginStream(int status, const std::string& content_type, const HttpHeaders& headers = {});
  void Write(const std::string& data);
  void End();

  // `f` runs once, on the server's thread, if the reply cannot end: the
  // client closed its connection, a write timed out, or the server shut
  // down. It is dropped when the reply ends, with whatever it holds.
  void OnAbandon(std::function<void()> f) { on_abandon_ = std::move(f); }
  bool ended() const { return ended_; }

 private:
  friend class HttpConnection;
  void Abandon();

  std::weak_ptr<HttpConnection> connection_;
  std::function<void()> on_abandon_;
  bool streaming_ = false;
  bool ended_ = false;
};

class HttpServer {
 public:
  // Called on the server's thread for every whole request; it (or what it
  // posts later) must end or abandon the exchange.
  using Handler = std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;
  // The JSON body of the server's own error replies (400, 404-style
  // protocol errors, 413, 431): status and message in.
  using ErrorBody = std::function<std::string(int status, const std::string& message)>;

  // Binds and listens (Unavailable naming the address when it cannot), and
  // raises the open-file limit to its hard maximum, one descriptor per
  // connection.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Listen(const HttpServerOptions& options,
                                                            Handler handler, ErrorBody error_body);
  ~HttpServer();

  // Serves on the calling thread until the shutdown (above) is done.
  void Run();
  // Runs `f` on the server's thread, soon. Safe from any thread, also after
  // Run returned (then `f` never runs).
  void Post(std::function<void()> f);
  // The port listened on (the one asked for, or the kernel's choice for 0).
  int port() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlag::cli
