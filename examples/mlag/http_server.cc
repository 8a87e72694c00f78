#include "examples/mlag/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace mlag::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(d));
}

// The status line and headers of a reply. `content_length` < 0: none (a
// chunked body on HTTP/1.1, or one that ends with the connection on 1.0).
std::string Head(int version, int status, const std::string& content_type,
                 const HttpHeaders& headers, bool keep_alive, int64_t content_length) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  std::string h = absl::StrCat(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ", status, " ",
                               std::string(reason.data(), reason.size()), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&h, "Content-Type: ", content_type, "\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&h, name, ": ", value, "\r\n");
  if (content_length >= 0) {
    absl::StrAppend(&h, "Content-Length: ", content_length, "\r\n");
  } else if (version != 10) {
    absl::StrAppend(&h, "Transfer-Encoding: chunked\r\n");
  }
  // HTTP/1.1 keeps connections by default and 1.0 closes them: say which.
  absl::StrAppend(&h, "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n\r\n");
  return h;
}

bool IsHttpParseError(const ErrorCode& ec) {
  return &ec.category() == &http::make_error_code(http::error::bad_method).category();
}

}  // namespace

struct HttpServer::Impl {
  // Declared before the io_context, so that connections its destructor
  // frees can still remove themselves.
  HttpServerOptions options;
  Handler handler;
  ErrorBody error_body;
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> connections;
  bool shutting_down = false;
  bool destroying = false;
  bool reported_accept_error = false;
  int port = 0;

  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::signal_set signals{ioc, SIGINT, SIGTERM};
  net::steady_timer accept_retry{ioc};
  net::steady_timer shutdown_timer{ioc};

  void Accept();
  void WaitForSignal();
  void Shutdown();
  void CloseAll();
  void Forget(HttpConnection* c);
  std::vector<std::shared_ptr<HttpConnection>> Live() const {
    std::vector<std::shared_ptr<HttpConnection>> live;
    for (const auto& [raw, weak] : connections) {
      if (std::shared_ptr<HttpConnection> c = weak.lock()) live.push_back(std::move(c));
    }
    return live;
  }
};

// One client connection: reads a request, hands it to the handler, writes
// its reply, and reads the next (keep-alive and pipelining) or closes.
// Reads go through Beast's tcp_stream with the request deadline; writes go
// straight to the socket with a timer of their own, so that the two never
// share an expiry.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(HttpServer::Impl& server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), write_timer_(server.ioc) {}
  ~HttpConnection() {
    // (A pending reply holds the connection, so none is left here; if one
    // were, its request must not run on unseen.)
    if (exchange_ != nullptr && !exchange_->ended()) exchange_->Abandon();
    server_.Forget(this);
  }

  void Start() { ReadRequest(); }

  // Closes now; a pending reply is abandoned.
  void Close() {
    if (closed_) return;
    closed_ = true;
    ErrorCode ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    write_timer_.cancel();
    outbox_.clear();
    std::shared_ptr<HttpExchange> exchange = std::move(exchange_);
    if (exchange != nullptr && !exchange->ended()) exchange->Abandon();
    hold_.reset();  // last: this may be the final reference
  }

  // Shutting down: closes now when waiting for a request, else once the
  // reply pending (or being written, or lingering) ends.
  void CloseWhenIdle() {
    keep_alive_ = false;
    if (exchange_ == nullptr && !writing_ && !reply_ended_) Close();
  }

  // For HttpExchange.
  int version() const { return version_; }
  bool keep_alive() const { return keep_alive_; }
  bool head() const { return head_; }  // a HEAD request: headers only
  void SetKeepAlive(bool keep) { keep_alive_ = keep_alive_ && keep; }
  void Send(std::string data) {
    if (closed_) return;
    outbox_.push_back(std::move(data));
    if (!writing_) WriteNext();
  }
  void ReplyEnded() {
    reply_ended_ = true;
    if (!writing_) WriteNext();
  }

 private:
  void ReadRequest() {
    exchange_.reset();
    reply_ended_ = false;
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    stream_.expires_after(ToChrono(server_.options.request_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](ErrorCode ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(ErrorCode ec) {
    if (ec) return OnReadError(ec);
    const auto& msg = parser_->get();
    if (msg.version() == 11 && beast::iequals(msg[http::field::expect], "100-continue")) {
      Send("HTTP/1.1 100 Continue\r\n\r\n");
    }
    if (parser_->is_done()) return OnRequest();
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](ErrorCode ec, size_t) {
      if (ec) return self->OnReadError(ec);
      self->OnRequest();
    });
  }

  void OnReadError(ErrorCode ec) {
    if (closed_) return;
    if (ec == http::error::body_limit) {
      return ErrorReply(413, absl::StrCat("the request body is over the limit of ",
                                          server_.options.max_body_bytes, " bytes"));
    }
    if (ec == http::error::header_limit) {
      return ErrorReply(431, absl::StrCat("the request headers are over the limit of ",
                                          server_.options.max_header_bytes, " bytes"));
    }
    if (IsHttpParseError(ec) && ec != http::error::end_of_stream &&
        ec != http::error::partial_message) {
      return ErrorReply(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    }
    // The client closed, reset or timed out: nothing to answer.
    Close();
  }

  // Answers a request that could not be read, then closes.
  void ErrorReply(int status, const std::string& message) {
    stream_.expires_never();
    keep_alive_ = false;
    version_ = parser_->is_header_done() && parser_->get().version() == 10 ? 10 : 11;
    const std::string body = server_.error_body(status, message);
    exchange_ = nullptr;
    reply_ended_ = true;
    Send(Head(version_, status, "application/json", {}, false, static_cast<int64_t>(body.size())) +
         body);
  }

  void OnRequest() {
    stream_.expires_never();
    auto& msg = parser_->get();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    const beast::string_view target = msg.target();
    request.path = std::string(target.substr(0, target.find('?')));
    request.body = std::move(msg.body());
    request.version = msg.version() == 10 ? 10 : 11;
    version_ = request.version;
    keep_alive_ = msg.keep_alive() && !server_.shutting_down;
    ++generation_;
    head_ = request.method == "HEAD";
    exchange_ = std::make_shared<HttpExchange>(weak_from_this());
    // While the reply is pending no read holds the connection (the hang-up
    // watch stops once the client sends more): it holds itself until the
    // reply ends or it closes.
    hold_ = shared_from_this();
    WatchForHangUp();
    std::shared_ptr<HttpExchange> exchange = exchange_;
    server_.handler(std::move(request), std::move(exchange));
  }

  // While a reply is pending the socket is not read; it becoming readable
  // then means the client closed it (nothing to read) or pipelined its next
  // request (left for after this reply).
  void WatchForHangUp() {
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), gen = generation_](ErrorCode ec) {
          if (ec || self->closed_ || gen != self->generation_ || self->exchange_ == nullptr ||
              self->exchange_->ended()) {
            return;
          }
          char c;
          const ssize_t n =
              ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) self->Close();
        });
  }

  void WriteNext() {
    if (closed_) return;
    if (outbox_.empty()) {
      writing_ = false;
      if (reply_ended_) AfterReply();
      return;
    }
    writing_ = true;
    std::vector<net::const_buffer> buffers;
    for (const std::string& s : outbox_) buffers.push_back(net::buffer(s));
    const size_t count = outbox_.size();
    const uint64_t seq = ++write_seq_;
    write_timer_.expires_after(ToChrono(server_.options.write_timeout));
    write_timer_.async_wait([self = shared_from_this(), seq](ErrorCode ec) {
      if (!ec && self->writing_ && self->write_seq_ == seq) self->Close();  // a stalled reader
    });
    net::async_write(stream_.socket(), buffers,
                     [self = shared_from_this(), count](ErrorCode ec, size_t) {
                       self->write_timer_.cancel();
                       if (ec) return self->Close();
                       for (size_t i = 0; i < count && !self->outbox_.empty(); ++i) {
                         self->outbox_.pop_front();
                       }
                       self->WriteNext();
                     });
  }

  // The reply is written: the next request, or a graceful close.
  void AfterReply() {
    exchange_.reset();
    std::shared_ptr<HttpConnection> self = std::move(hold_);  // alive to the end of this call
    if (keep_alive_ && !server_.shutting_down) return ReadRequest();
    // Half-close, then drain what the client still sends (an unread body,
    // say) for a moment, so that closing does not reset the connection
    // before the client has read the reply.
    ErrorCode ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(1));
    Drain();
  }

  void Drain() {
    stream_.async_read_some(net::buffer(drain_), [self = shared_from_this()](ErrorCode ec, size_t) {
      if (ec) return self->Close();
      self->Drain();
    });
  }

  HttpServer::Impl& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpExchange> exchange_;  // the reply pending, if any
  std::shared_ptr<HttpConnection> hold_;    // itself, while exchange_ is pending
  std::deque<std::string> outbox_;
  net::steady_timer write_timer_;
  uint64_t write_seq_ = 0;
  uint64_t generation_ = 0;  // requests read, so stale hang-up watches are told apart
  char drain_[4096];
  int version_ = 11;
  bool keep_alive_ = true;
  bool writing_ = false;
  bool reply_ended_ = false;
  bool closed_ = false;
  bool head_ = false;
};

void HttpExchange::Reply(int status, const std::string& content_type, const std::string& body,
                         const HttpHeaders& headers) {
  if (ended_ || streaming_) return;
  std::shared_ptr<HttpConnection> c = connection_.lock();
  if (c == nullptr) return Abandon();
  ended_ = true;
  std::function<void()> dropped = std::move(on_abandon_);  // freed after the reply is queued
  std::string reply = Head(c->version(), status, content_type, headers, c->keep_alive(),
                           static_cast<int64_t>(body.size()));
  if (!c->head()) reply += body;
  c->Send(std::move(reply));
  c->ReplyEnded();
}

void HttpExchange::BeginStream(int status, const std::string& content_type,
                               const HttpHeaders& headers) {
  if (ended_ || streaming_) return;
  std::shared_ptr<HttpConnection> c = connection_.lock();
  if (c == nullptr) return Abandon();
  streaming_ = true;
  if (c->version() == 10) c->SetKeepAlive(false);  // the body ends with the connection
  c->Send(Head(c->version(), status, content_type, headers, c->keep_alive(), -1));
}

void HttpExchange::Write(const std::string& data) {
  if (ended_ || !streaming_ || data.empty()) return;
  std::shared_ptr<HttpConnection> c = connection_.lock();
  if (c == nullptr) return Abandon();
  if (c->version() == 10) return c->Send(data);
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  c->Send(absl::StrCat(size, data, "\r\n"));
}

void HttpExchange::End() {
  if (ended_ || !streaming_) return;
  std::shared_ptr<HttpConnection> c = connection_.lock();
  if (c == nullptr) return Abandon();
  ended_ = true;
  std::function<void()> dropped = std::move(on_abandon_);
  if (c->version() != 10) c->Send("0\r\n\r\n");
  c->ReplyEnded();
}

void HttpExchange::Abandon() {
  ended_ = true;
  std::function<void()> f = std::move(on_abandon_);
  on_abandon_ = nullptr;
  if (f) f();
}

void HttpServer::Impl::Accept() {
  acceptor.async_accept([this](ErrorCode ec, tcp::socket socket) {
    if (shutting_down || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, say: retry shortly rather than spin.
      if (!reported_accept_error) {
        std::fprintf(stderr, "mlag serve: accept failed (%s); retrying\n", ec.message().c_str());
        reported_accept_error = true;
      }
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](ErrorCode e) {
        if (!e && !shutting_down) Accept();
      });
      return;
    }
    ErrorCode ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // events leave as they are written
    auto c = std::make_shared<HttpConnection>(*this, std::move(socket));
    connections[c.get()] = c;
    c->Start();
    Accept();
  });
}

void HttpServer::Impl::WaitForSignal() {
  signals.async_wait([this](ErrorCode ec, int) {
    if (ec) return;
    if (shutting_down) {
      std::fprintf(stderr, "mlag serve: second signal: closing every connection\n");
      return CloseAll();
    }
    Shutdown();
    WaitForSignal();
  });
}

void HttpServer::Impl::Shutdown() {
  shutting_down = true;
  std::vector<std::shared_ptr<HttpConnection>> live = Live();
  std::fprintf(stderr,
               "mlag serve: shutting down: %zu connection(s) open; pending replies have %.3g s\n",
               live.size(), absl::ToDoubleSeconds(options.shutdown_timeout));
  std::fflush(stderr);
  ErrorCode ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (const auto& c : live) c->CloseWhenIdle();
  shutdown_timer.expires_after(ToChrono(options.shutdown_timeout));
  shutdown_timer.async_wait([this](ErrorCode ec) {
    if (ec) return;
    std::fprintf(stderr, "mlag serve: shutdown timeout: abandoning what is still pending\n");
    CloseAll();
  });
  if (connections.empty()) ioc.stop();
}

void HttpServer::Impl::CloseAll() {
  for (const auto& c : Live()) c->Close();
  ioc.stop();
}

void HttpServer::Impl::Forget(HttpConnection* c) {
  connections.erase(c);
  if (shutting_down && !destroying && connections.empty()) ioc.stop();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { impl_->destroying = true; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Listen(const HttpServerOptions& options,
                                                               Handler handler,
                                                               ErrorBody error_body) {
  // One descriptor per connection: take all the system allows.
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  impl->error_body = std::move(error_body);
  const std::string where = absl::StrCat(options.host, ":", options.port);
  ErrorCode ec;
  tcp::resolver resolver(impl->ioc);
  tcp::resolver::results_type found =
      resolver.resolve(options.host, std::to_string(options.port), ec);
  if (ec || found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the address to listen on, ", where, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = *found.begin();
  tcp::acceptor& a = impl->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(options.backlog, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", where, ": ", ec.message(), " (in use, or not allowed)"));
  }
  impl->port = a.local_endpoint(ec).port();
  impl->Accept();
  impl->WaitForSignal();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Run() { impl_->ioc.run(); }

void HttpServer::Post(std::function<void()> f) { net::post(impl_->ioc, std::move(f)); }

int HttpServer::port() const { return impl_->port; }

}  // namespace mlag::cli
