// mlag bench-serve: a serving benchmark like the ones engines are compared
// with: N streaming completion requests, C at a time, against any OpenAI
// server (mlag serve, or another engine), each a random prompt of exactly I
// token ids asking for exactly O tokens (ignore_eos).
//
//   mlag bench-serve --url http://127.0.0.1:8000 --num-prompts 256 --concurrency 32
//                    --input-len 128 --output-len 64 [--seed 0] [--json]
//
// Per request it records the time to the first token (TTFT: to the first
// event that carries text), the gaps between events that carry text (ITL:
// a token that completes no character yet arrives with the next one) and
// the time per output token after the first (TPOT: (latency - TTFT) /
// (tokens - 1), the tokens counted by the usage the stream ends with); it reports request and token
// throughput over the whole run, their means, p50 and p99, and failures (an HTTP error, a broken
// stream, or a completion of other than O tokens), in text or JSON.
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/mlag/cli.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"

namespace mlag::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct BenchServeFlags {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // "model" of each request; default: the server's first
  int num_prompts = 64;
  int concurrency = 8;
  int input_len = 128;
  int output_len = 64;
  uint64_t seed = 0;
  bool json = false;
};

struct Target {
  std::string host, port;
};

absl::StatusOr<Target> ParseUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "http://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--url must start with http:// (got '", url, "')"));
  }
  std::string rest = url.substr(kScheme.size());
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  Target t{rest, "80"};
  if (colon != std::string::npos) t = {rest.substr(0, colon), rest.substr(colon + 1)};
  if (t.host.empty() || t.port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--url has no host: '", url, "'"));
  }
  return t;
}

// One request's outcome.
struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, latency = 0;  // seconds
  int output_tokens = 0;
  std::vector<double> itl;  // seconds between token-carrying events
};

// A keep-alive connection to the server, reopened after a failure.
class Client {
 public:
  explicit Client(Target target) : target_(std::move(target)) {}

  // GET `path`: status and body.
  absl::StatusOr<std::pair<int, std::string>> Get(const std::string& path) {
    MLAG_RETURN_IF_ERROR(Connect());
    http::request<http::empty_body> req{http::verb::get, path, 11};
    req.set(http::field::host, target_.host);
    beast::error_code ec;
    http::write(*socket_, req, ec);
    http::response<http::string_body> res;
    if (!ec) http::read(*socket_, buffer_, res, ec);
    if (ec) {
      socket_.reset();
      return absl::UnavailableError(absl::StrCat("GET ", path, ": ", ec.message()));
    }
    return std::make_pair(static_cast<int>(res.result_int()), res.body());
  }

  // POSTs a streaming completion and reads its server-sent events.
  Outcome Stream(const std::string& body, int expected_tokens) {
    Outcome o;
    const absl::Status connected = Connect();
    if (!connected.ok()) {
      o.error = std::string(connected.message());
      return o;
    }
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, target_.host);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    const Clock::time_point start = Clock::now();
    Clock::time_point last{};
    bool done = false;
    std::string pending;  // bytes of an event not yet whole
    int usage_tokens = -1;
    int events = 0;  // events that carried tokens
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    // Each "data:" line. An event carries tokens when its text is not empty
    // (or its logprobs list tokens); how many tokens came is the usage's
    // count at the end.
    auto on_event = [&](absl::string_view line) {
      if (!absl::StartsWith(line, "data: ")) return;
      line.remove_prefix(6);
      if (line == "[DONE]") {
        done = true;
        return;
      }
      Json event = Json::parse(line, nullptr, false);
      if (event.is_discarded()) return;
      if (event.contains("error")) {
        o.error = event["error"].value("message", std::string("an error event"));
        return;
      }
      if (event.contains("usage") && event["usage"].is_object()) {
        usage_tokens = event["usage"].value("completion_tokens", -1);
      }
      if (!event.contains("choices") || event["choices"].empty()) return;
      const Json& choice = event["choices"][0];
      const bool tokens = !choice.value("text", std::string()).empty() ||
                          (choice.contains("logprobs") && choice["logprobs"].is_object() &&
                           !choice["logprobs"].value("tokens", Json::array()).empty());
      if (!tokens) return;
      const Clock::time_point now = Clock::now();
      if (events == 0) {
        o.ttft = seconds(now - start);
      } else {
        o.itl.push_back(seconds(now - last));
      }
      last = now;
      ++events;
    };
    http::response_parser<http::empty_body> parser;
    // (Not boost::none: Boost 1.74 then refuses every Content-Length.)
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code&) {
      pending.append(data.data(), data.size());
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        for (absl::string_view line : absl::StrSplit(pending.substr(0, end), '\n')) on_event(line);
        pending.erase(0, end + 2);
      }
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    beast::error_code ec;
    http::write(*socket_, req, ec);
    if (!ec) http::read_header(*socket_, buffer_, parser, ec);
    if (!ec && parser.get().result_int() != 200) {
      http::response_parser<http::string_body> error_parser(std::move(parser));
      http::read(*socket_, buffer_, error_parser, ec);
      o.error = absl::StrCat("HTTP ", error_parser.get().result_int(), ": ",
                             error_parser.get().body().substr(0, 200));
      socket_.reset();
      return o;
    }
    while (!ec && !parser.is_done()) http::read_some(*socket_, buffer_, parser, ec);
    o.latency = seconds(Clock::now() - start);
    if (ec) {
      o.error = absl::StrCat("the stream broke: ", ec.message());
      socket_.reset();
      return o;
    }
    if (!parser.get().keep_alive()) socket_.reset();
    if (!o.error.empty()) return o;
    o.output_tokens = usage_tokens;
    if (!done) {
      o.error = "the stream ended without data: [DONE]";
    } else if (usage_tokens != expected_tokens) {
      o.error = absl::StrCat("asked for ", expected_tokens, " tokens, got ", usage_tokens,
                             " (the usage's count)");
    } else if (events == 0) {
      o.error = "no event carried a token";
    } else {
      o.ok = true;
    }
    return o;
  }

 private:
  absl::Status Connect() {
    if (socket_ != nullptr) return absl::OkStatus();
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto found = resolver.resolve(target_.host, target_.port, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", target_.host, ": ", ec.message()));
    }
    socket_ = std::make_unique<beast::tcp_stream>(ioc_);
    socket_->connect(found, ec);
    if (ec) {
      socket_.reset();
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", target_.host, ":", target_.port, ": ", ec.message()));
    }
    socket_->socket().set_option(tcp::no_delay(true), ec);
    buffer_.clear();
    return absl::OkStatus();
  }

  Target target_;
  net::io_context ioc_;
  std::unique_ptr<beast::tcp_stream> socket_;
  beast::flat_buffer buffer_;
};

Json Stats(const std::vector<double>& seconds) {
  double sum = 0;
  for (double s : seconds) sum += s;
  return {{"mean_ms", seconds.empty() ? 0.0 : 1e3 * sum / static_cast<double>(seconds.size())},
          {"p50_ms", 1e3 * Percentile(seconds, 0.5)},
          {"p99_ms", 1e3 * Percentile(seconds, 0.99)}};
}

int BenchServe(const BenchServeFlags& f) {
  absl::StatusOr<Target> target = ParseUrl(f.url);
  if (!target.ok()) return Fail(target.status());
  // The model, and a vocabulary to draw prompt ids from.
  Client probe(*target);
  absl::StatusOr<std::pair<int, std::string>> models = probe.Get("/v1/models");
  if (!models.ok()) return Fail(models.status());
  Json list = Json::parse(models->second, nullptr, false);
  if (models->first != 200 || list.is_discarded() || !list.contains("data") ||
      list["data"].empty()) {
    return Fail(absl::UnavailableError(
        absl::StrCat(f.url, "/v1/models answered ", models->first, " without a model list")));
  }
  const Json& served = list["data"][0];
  const std::string model = f.model.empty() ? served.value("id", std::string()) : f.model;
  // Ids below the vocabulary size the server reports (mlag serve does), else
  // below 1000, which any real vocabulary has.
  const int vocab = std::max(2, served.value("vocab_size", 1000));
  const int max_len = served.value("max_model_len", 0);
  if (max_len > 0 && f.input_len + f.output_len > max_len) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--input-len ", f.input_len, " + --output-len ", f.output_len,
                     " exceed the server's max_model_len ", max_len)));
  }

  // The requests, drawn up front from the seed.
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<int> id(1, vocab - 1);
  std::vector<std::string> bodies(static_cast<size_t>(f.num_prompts));
  for (int i = 0; i < f.num_prompts; ++i) {
    std::vector<int> prompt(static_cast<size_t>(f.input_len));
    for (int& t : prompt) t = id(rng);
    bodies[i] = Json{{"model", model},
                     {"prompt", prompt},
                     {"max_tokens", f.output_len},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"seed", static_cast<uint64_t>(rng() >> 1)},
                     {"stream_options", {{"include_usage", true}}}}
                    .dump();
  }

  std::vector<Outcome> outcomes(static_cast<size_t>(f.num_prompts));
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(f.concurrency, f.num_prompts); ++w) {
    workers.emplace_back([&] {
      Client client(*target);
      for (int i; (i = next.fetch_add(1)) < f.num_prompts;) {
        outcomes[i] = client.Stream(bodies[i], f.output_len);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const double wall = SecondsSince(start);

  std::vector<double> ttft, tpot, itl, latency;
  int completed = 0;
  int64_t output_tokens = 0;
  std::vector<std::string> errors;
  for (const Outcome& o : outcomes) {
    if (!o.ok) {
      if (errors.size() < 5) errors.push_back(o.error);
      continue;
    }
    ++completed;
    output_tokens += o.output_tokens;
    ttft.push_back(o.ttft);
    latency.push_back(o.latency);
    if (o.output_tokens > 1) tpot.push_back((o.latency - o.ttft) / (o.output_tokens - 1));
    itl.insert(itl.end(), o.itl.begin(), o.itl.end());
  }
  const int64_t input_tokens = int64_t{completed} * f.input_len;
  Json report = {
      {"url", f.url},
      {"model", model},
      {"num_prompts", f.num_prompts},
      {"concurrency", f.concurrency},
      {"input_len", f.input_len},
      {"output_len", f.output_len},
      {"completed", completed},
      {"failed", f.num_prompts - completed},
      {"errors", errors},
      {"duration_s", wall},
      {"request_throughput", completed / wall},
      {"output_token_throughput", static_cast<double>(output_tokens) / wall},
      {"total_token_throughput", static_cast<double>(output_tokens + input_tokens) / wall},
      {"ttft", Stats(ttft)},
      {"tpot", Stats(tpot)},
      {"itl", Stats(itl)},
      {"e2e_latency", Stats(latency)}};
  if (f.json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("bench-serve: %s (%s), %d prompts at concurrency %d, %d tokens in, %d out\n",
                f.url.c_str(), model.c_str(), f.num_prompts, f.concurrency, f.input_len,
                f.output_len);
    std::printf("  completed %d, failed %d, in %.2f s\n", completed, f.num_prompts - completed,
                wall);
    for (const std::string& e : errors) std::printf("    failure: %s\n", e.c_str());
    std::printf("  requests/s %.2f, output tokens/s %.1f, total tokens/s %.1f\n", completed / wall,
                static_cast<double>(output_tokens) / wall,
                static_cast<double>(output_tokens + input_tokens) / wall);
    for (const char* name : {"ttft", "tpot", "itl", "e2e_latency"}) {
      const Json& s = report[name];
      std::printf("  %-12s mean %8.2f ms  p50 %8.2f ms  p99 %8.2f ms\n", name,
                  s["mean_ms"].get<double>(), s["p50_ms"].get<double>(), s["p99_ms"].get<double>());
    }
  }
  return completed == f.num_prompts ? 0 : 1;
}

}  // namespace

Command AddBenchServeCommand(CLI::App& app) {
  auto f = std::make_shared<BenchServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench-serve", "benchmark a running OpenAI server with concurrent streaming requests");
  cmd->add_option("--url", f->url, "the server (default http://127.0.0.1:8000)");
  cmd->add_option("--model", f->model, "the model to ask for (default: the server's first)");
  cmd->add_option("--num-prompts", f->num_prompts, "requests in all (default 64)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--concurrency", f->concurrency, "requests in flight at once (default 8)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--input-len", f->input_len, "prompt tokens per request (default 128)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", f->output_len, "tokens generated per request (default 64)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", f->seed, "seed of the prompts and their sampling (default 0)");
  cmd->add_flag("--json", f->json, "print the report as JSON");
  return {cmd, [f] { return BenchServe(*f); }};
}

}  // namespace mlag::cli
