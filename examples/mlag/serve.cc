// mlag serve: the OpenAI HTTP API over one engine (runtime/engine/async_engine.h),
// or a world of expert-parallel host thread ranks (--ep N); concurrent
// clients batched by the engine's continuous batching.
//
//   mlag serve --model M [--host 127.0.0.1] [--port 8000] [--max-pending N] [--ep N]
//              [--request-timeout S] [--shutdown-timeout S] [engine flags]
//
// Endpoints: GET /health, GET /v1/models, GET /metrics (Prometheus text),
// POST /v1/completions and POST /v1/chat/completions, with "stream": true as
// server-sent events ending in "data: [DONE]". A bad request gets a 400 with
// an OpenAI-style error body naming the field (error.param); past
// --max-pending requests in flight (queued or running, whatever the number
// of connections) a request gets a 429 with Retry-After at once. A client
// that closes its connection aborts its request. The HTTP layer
// (http_server.h) is event-driven: slow or idle clients hold no thread, and
// SIGTERM ends the server within --shutdown-timeout.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/mlag/cli.h"
#include "examples/mlag/http_server.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"
#include "runtime/engine/async_engine.h"

namespace mlag::cli {
namespace {

using Json = nlohmann::json;
namespace net = boost::asio;

struct ServeFlags {
  CLI::App* app = nullptr;
  EngineFlags engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  int max_pending = 256;
  double request_timeout = 10;   // seconds to read a whole request
  double shutdown_timeout = 10;  // seconds pending replies get on SIGTERM
  int ep = 0;                    // expert-parallel host thread ranks; 0: off
};

// Keys of the JSON this server writes are ASCII; text may hold invalid UTF-8
// only through token bytes, replaced rather than thrown on.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// An OpenAI-style error: "code" is a string or null, as OpenAI's, and
// "param" names the request field at fault, or is null.
struct ApiError {
  ApiError(int status, std::string msg, std::string error_type = "invalid_request_error",
           std::string field = "")
      : http_status(status),
        message(std::move(msg)),
        type(std::move(error_type)),
        param(std::move(field)) {}
  int http_status;
  std::string message;
  std::string type;
  std::string param;
  std::string code;
};

Json ErrorBody(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  return {{"error", err}};
}

ApiError FromStatus(const absl::Status& s, const std::string& param = "") {
  ApiError e{400, std::string(s.message()), "invalid_request_error", param};
  if (absl::IsResourceExhausted(s)) {
    e.http_status = 429, e.type = "rate_limit_error", e.code = "rate_limit_exceeded";
  } else if (absl::IsNotFound(s)) {
    e.http_status = 404, e.code = "model_not_found";
  } else if (absl::IsOutOfRange(s)) {
    e.code = "context_length_exceeded";  // a 400, as OpenAI's
  } else if (absl::IsUnavailable(s) || absl::IsFailedPrecondition(s)) {
    e.http_status = 503, e.type = "server_error";
  } else if (absl::IsInternal(s) || absl::IsUnknown(s)) {
    e.http_status = 500, e.type = "server_error";
  }
  return e;
}

// The parsed fields of a completion or chat request.
struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  RequestSpec spec;
  std::vector<std::string> stops;
  int top_logprobs = 0;   // completions: "logprobs"; chat: "top_logprobs"
  bool logprobs = false;  // chat: "logprobs"
  // Completions' "echo": the reply starts with the prompt (and, with
  // logprobs, the prompt tokens' log-probabilities).
  bool echo = false;
  std::string prompt_text;
  // "return_tokens_as_token_ids" (as vLLM names it): logprob entries name
  // tokens as "token_id:N", which survives tokens that are not whole text.
  bool tokens_as_ids = false;
};

// Reads an optional number field, range-checked; an error naming it
// otherwise (also in *param).
template <typename T>
absl::Status ReadNumber(const Json& body, const char* key, double lo, double hi, T* out,
                        std::string* param) {
  if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
  *param = key;
  const Json& v = body[key];
  if (!v.is_number())
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a number"));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is %.15g; it must be in [%.15g, %.15g]", key, d, lo, hi));
  }
  if (std::is_integral<T>::value && d != std::floor(d)) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be an integer"));
  }
  *out = static_cast<T>(d);
  param->clear();
  return absl::OkStatus();
}

// The text of a chat message's content: a string, or an array of parts of
// which the "text" ones count.
absl::StatusOr<std::string> ContentText(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (content.is_array()) {
    std::string text;
    for (const Json& part : content) {
      if (!part.is_object() || !part.contains("type") || part["type"] != Json("text") ||
          !part.contains("text") || !part["text"].is_string()) {
        return absl::InvalidArgumentError("only text content parts are supported");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  return absl::InvalidArgumentError("a message's content must be a string or text parts");
}

// NotFound when the body names a model other than `model_id`; OutOfRange
// when the prompt leaves no room. On an error, *param names the field.
absl::StatusOr<ApiRequest> ParseRequest(const std::string& body_text, bool chat,
                                        const AsyncEngine& engine, const std::string& model_id,
                                        uint64_t default_seed, std::string* param) {
  // An error about one field, named in *param.
  auto bad = [param](const char* field, const std::string& message) {
    *param = field;
    return absl::InvalidArgumentError(message);
  };
  Json body = Json::parse(body_text, nullptr, false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  if (body.contains("model") && body["model"].is_string() &&
      body["model"].get<std::string>() != model_id) {
    *param = "model";
    return absl::NotFoundError(absl::StrCat("model '", body["model"].get<std::string>(),
                                            "' is not served here; this server serves '", model_id,
                                            "'"));
  }
  ApiRequest r;
  r.chat = chat;
  if (body.contains("stream")) {
    if (!body["stream"].is_boolean()) return bad("stream", "'stream' must be a boolean");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object() &&
      body["stream_options"].contains("include_usage")) {
    const Json& usage = body["stream_options"]["include_usage"];
    if (!usage.is_boolean()) {
      return bad("stream_options", "'stream_options.include_usage' must be a boolean");
    }
    r.include_usage = usage.get<bool>();
  }
  int n = 1;
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "n", 1, 1, &n, param));
  // OpenAI parameters this server does not implement are refused, not
  // ignored: an answer without them would be silently wrong.
  auto given = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  if (given("best_of") && body["best_of"] != Json(1)) {
    return bad("best_of", "'best_of' is not supported (one completion per request)");
  }
  if (given("suffix") && body["suffix"] != Json("")) {
    return bad("suffix", "'suffix' is not supported");
  }
  if (given("echo")) {
    if (!body["echo"].is_boolean()) return bad("echo", "'echo' must be a boolean");
    r.echo = body["echo"].get<bool>();
    if (r.echo && chat) return bad("echo", "'echo' applies to completions, not chat");
  }
  if (given("return_tokens_as_token_ids")) {
    if (!body["return_tokens_as_token_ids"].is_boolean()) {
      return bad("return_tokens_as_token_ids", "'return_tokens_as_token_ids' must be a boolean");
    }
    r.tokens_as_ids = body["return_tokens_as_token_ids"].get<bool>();
  }
  SamplingParams& sp = r.spec.sampling;
  if (given("logit_bias")) {
    const Json& bias = body["logit_bias"];
    if (!bias.is_object()) {
      return bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    }
    if (bias.size() > static_cast<size_t>(kMaxLogitBias)) {
      return bad("logit_bias", absl::StrCat("'logit_bias' has ", bias.size(), " entries; at most ",
                                            kMaxLogitBias));
    }
    for (const auto& [key, value] : bias.items()) {
      int64_t id = -1;
      if (!absl::SimpleAtoi(key, &id) || id < 0 || id >= engine.config().vocab_size) {
        return bad("logit_bias",
                   absl::StrCat("'logit_bias' key '", key, "' is not a token id in [0, ",
                                engine.config().vocab_size, ")"));
      }
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
        return bad("logit_bias",
                   absl::StrCat("'logit_bias' of token ", key, " must be a number in [-100, 100]"));
      }
      sp.logit_bias.push_back({static_cast<int32_t>(id), value.get<float>()});
    }
    std::sort(sp.logit_bias.begin(), sp.logit_bias.end(),
              [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.token < b.token; });
    for (size_t i = 1; i < sp.logit_bias.size(); ++i) {
      if (sp.logit_bias[i].token == sp.logit_bias[i - 1].token) {
        return bad("logit_bias",
                   absl::StrCat("'logit_bias' names token ", sp.logit_bias[i].token, " twice"));
      }
    }
  }
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "presence_penalty", -2, 2, &sp.presence_penalty, param));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "frequency_penalty", -2, 2, &sp.frequency_penalty, param));
  absl::StatusOr<const Tokenizer*> tok = engine.tokenizer();

  // The prompt.
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
      return bad("messages", "'messages' must be a non-empty array");
    }
    if (!tok.ok()) return tok.status();
    std::vector<ChatMessage> messages;
    for (const Json& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return bad("messages", "every message needs a string 'role'");
      }
      *param = "messages";
      MLAG_ASSIGN_OR_RETURN(std::string content, ContentText(m.value("content", Json())));
      param->clear();
      messages.push_back({m["role"].get<std::string>(), std::move(content)});
    }
    MLAG_ASSIGN_OR_RETURN(std::string prompt, (*tok)->FormatChat(messages, true));
    MLAG_ASSIGN_OR_RETURN(r.spec.prompt, (*tok)->Encode(prompt, /*add_bos=*/false));
  } else {
    if (!body.contains("prompt")) return bad("prompt", "'prompt' is required");
    Json prompt = body["prompt"];
    if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) prompt = prompt[0];
    if (prompt.is_string()) {
      if (!tok.ok()) return tok.status();
      if (r.echo) r.prompt_text = prompt.get<std::string>();
      MLAG_ASSIGN_OR_RETURN(r.spec.prompt,
                            (*tok)->Encode(prompt.get<std::string>(), (*tok)->add_bos()));
    } else if (prompt.is_array() && !prompt.empty()) {
      for (const Json& t : prompt) {
        if (!t.is_number_integer()) {
          return bad("prompt",
                     "'prompt' must be a string or an array of token ids (one prompt per request)");
        }
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= engine.config().vocab_size) {
          return bad("prompt", absl::StrCat("prompt token ", id, " is outside the vocabulary [0, ",
                                            engine.config().vocab_size, ")"));
        }
        r.spec.prompt.push_back(static_cast<int32_t>(id));
      }
      if (r.echo && tok.ok()) {
        r.prompt_text = (*tok)->Decode(r.spec.prompt, /*skip_special=*/false);
      }
    } else {
      return bad("prompt", "'prompt' must be a string or an array of token ids");
    }
  }
  const char* prompt_field = chat ? "messages" : "prompt";
  if (r.spec.prompt.empty()) return bad(prompt_field, "the prompt is empty");
  const int prompt_len = static_cast<int>(r.spec.prompt.size());
  if (prompt_len >= engine.max_model_len()) {
    *param = prompt_field;
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt has ", prompt_len, " tokens; this model's limit (max_model_len) is ",
        engine.max_model_len(), " tokens, prompt and completion together"));
  }

  // Lengths and sampling.
  const int room = engine.max_model_len() - prompt_len;
  r.spec.max_tokens = chat ? room : std::min(16, room);  // OpenAI's defaults
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "max_tokens", 1, 1 << 30, &r.spec.max_tokens, param));
  MLAG_RETURN_IF_ERROR(
      ReadNumber(body, "max_completion_tokens", 1, 1 << 30, &r.spec.max_tokens, param));
  sp.temperature = 1.0f;  // OpenAI's default
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "temperature", 0, 100, &sp.temperature, param));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_p", 1e-9, 1, &sp.top_p, param));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_k", -1, 1 << 30, &sp.top_k, param));
  if (sp.top_k < 0) sp.top_k = 0;
  sp.seed = default_seed;
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "seed", 0, 1.8e19, &sp.seed, param));
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) {
        return bad("logprobs", "'logprobs' must be a boolean for chat");
      }
      r.logprobs = body["logprobs"].get<bool>();
    }
    MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_logprobs", 0, 20, &r.top_logprobs, param));
    if (r.top_logprobs > 0 && !r.logprobs) {
      return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    sp.logprobs = r.logprobs ? std::max(1, r.top_logprobs) : 0;
  } else {
    MLAG_RETURN_IF_ERROR(ReadNumber(body, "logprobs", 0, 20, &r.top_logprobs, param));
    sp.logprobs = r.top_logprobs;
    if (r.echo && sp.logprobs > 0) sp.prompt_logprobs = sp.logprobs;
  }
  // Stops: strings, and the end-of-sentence token unless ignore_eos.
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      r.stops.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16) {
      for (const Json& e : s) {
        if (!e.is_string()) return bad("stop", "'stop' must hold strings");
        r.stops.push_back(e.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or up to 16 strings");
    }
    if (!r.stops.empty() && !tok.ok()) return tok.status();
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_boolean()) {
    return bad("ignore_eos", "'ignore_eos' must be a boolean");
  }
  if (tok.ok() && (*tok)->eos_id() && !body.value("ignore_eos", false)) {
    r.spec.stop_token_ids.push_back(*(*tok)->eos_id());
  }
  return r;
}

// ParseRequest, with a JSON type error (a field of another type than the
// one read) as InvalidArgument rather than an exception: it runs on a
// worker thread, where an exception would end the process.
absl::StatusOr<ApiRequest> ParseRequestOrError(const std::string& body_text, bool chat,
                                               const AsyncEngine& engine,
                                               const std::string& model_id, uint64_t default_seed,
                                               std::string* param) {
  try {
    return ParseRequest(body_text, chat, engine, model_id, default_seed, param);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a field has the wrong type: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the request could not be read: ", e.what()));
  }
}

// OpenAI's finish_reason: "stop", "length" (and "abort", which no client of
// an aborted request sees).
std::string FinishName(FinishReason reason) { return std::string(FinishReasonName(reason)); }

// The API over the engine: routes, request state and replies. Every method
// runs on the HTTP server's thread, but for the parsing Complete hands to a
// worker (which reads only the engine's fixed facts); the engine thread
// only posts wake-ups.
class ApiServer {
 public:
  ApiServer(std::unique_ptr<AsyncEngine> engine, std::string model_id)
      : engine_(std::move(engine)), model_id_(std::move(model_id)) {}

  // The server to post wake-ups to; set before the first request.
  void set_http(HttpServer* http) { http_ = http; }
  // Stops the parsing workers and the engine (joining their threads, so no
  // wake-up is posted after).
  void StopEngine() {
    workers_.join();
    engine_.reset();
  }

  void Handle(HttpRequest req, const std::shared_ptr<HttpExchange>& ex) {
    struct Route {
      const char* path;
      const char* method;
    };
    static constexpr Route kRoutes[] = {{"/health", "GET"},
                                        {"/v1/models", "GET"},
                                        {"/metrics", "GET"},
                                        {"/v1/completions", "POST"},
                                        {"/v1/chat/completions", "POST"}};
    const Route* route = nullptr;
    for (const Route& r : kRoutes) {
      if (req.path == r.path) route = &r;
    }
    if (route == nullptr) {
      return SendError(*ex, {404, absl::StrCat("no route ", req.path), "invalid_request_error"});
    }
    // HEAD is GET without the body (the HTTP layer leaves it out).
    const std::string method = req.method == "HEAD" ? "GET" : req.method;
    if (method != route->method) {
      ApiError e{405, absl::StrCat(req.path, " takes ", route->method, ", not ", req.method),
                 "invalid_request_error"};
      return SendError(*ex, e, {{"Allow", route->method}});
    }
    if (req.path == "/health") {
      return ex->Reply(200, "application/json", "{\"status\":\"ok\"}");
    }
    if (req.path == "/v1/models") {
      Json model = {{"id", model_id_},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "mlagraph"},
                    {"max_model_len", engine_->max_model_len()},
                    {"vocab_size", engine_->config().vocab_size}};
      return ex->Reply(200, "application/json",
                       Dump({{"object", "list"}, {"data", Json::array({model})}}));
    }
    if (req.path == "/metrics") return ex->Reply(200, "text/plain; version=0.0.4", Metrics());
    const bool chat = req.path == "/v1/chat/completions";
    Complete(std::move(req), ex, chat);
  }

  static std::string ErrorJson(int status, const std::string& message) {
    return Dump(
        ErrorBody({status, message, status >= 500 ? "server_error" : "invalid_request_error"}));
  }

 private:
  // One request in the engine and what its reply has been sent so far.
  struct Pending {
    std::shared_ptr<ApiRequest> r;
    std::shared_ptr<RequestStream> stream;
    std::shared_ptr<HttpExchange> ex;
    std::string id;
    bool first = true;  // no chunk sent yet
    // A whole reply, collected.
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<std::vector<TokenLogprob>> logprobs;
    std::vector<PromptLogprob> prompt_logprobs;
  };

  static void SendError(HttpExchange& ex, const ApiError& e, HttpHeaders headers = {}) {
    if (e.http_status == 429) headers.push_back({"Retry-After", "1"});
    ex.Reply(e.http_status, "application/json", Dump(ErrorBody(e)), headers);
  }

  std::string Metrics() const {
    const AsyncEngineMetrics m = engine_->metrics();
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help,
                      const std::vector<std::pair<std::string, double>>& samples) {
      absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
      for (const auto& [labels, value] : samples) {
        absl::StrAppend(&out, name, labels, " ", absl::StrFormat("%.17g", value), "\n");
      }
    };
    metric("mlag_requests_total", "counter", "Requests by how they ended.",
           {{"{outcome=\"finished\"}", static_cast<double>(m.requests_finished)},
            {"{outcome=\"aborted\"}", static_cast<double>(m.requests_aborted)},
            {"{outcome=\"failed\"}", static_cast<double>(m.requests_failed)},
            {"{outcome=\"rejected\"}", static_cast<double>(m.requests_rejected)},
            {"{outcome=\"bad_request\"}", static_cast<double>(bad_requests_)}});
    metric("mlag_requests_running", "gauge", "Requests in the engine.",
           {{"", static_cast<double>(m.running)}});
    metric("mlag_requests_pending", "gauge", "Requests queued for the engine.",
           {{"", static_cast<double>(m.pending)}});
    metric("mlag_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           {{"", static_cast<double>(m.prompt_tokens)}});
    metric("mlag_generation_tokens_total", "counter", "Tokens generated.",
           {{"", static_cast<double>(m.generation_tokens)}});
    metric("mlag_step_seconds", "summary", "Engine step latency.",
           {{"_sum", m.step_seconds_sum}, {"_count", static_cast<double>(m.steps)}});
    const double replays = static_cast<double>(m.graph_replays);
    metric("mlag_graph_replays_total", "counter", "Decode steps run as a graph replay.",
           {{"", replays}});
    metric("mlag_kv_blocks", "gauge", "KV cache blocks.",
           {{"{state=\"used\"}", static_cast<double>(m.kv_blocks_used)},
            {"{state=\"total\"}", static_cast<double>(m.kv_blocks_total)}});
    metric("mlag_kv_usage_ratio", "gauge", "Fraction of KV blocks in use.",
           {{"", m.kv_blocks_total > 0 ? static_cast<double>(m.kv_blocks_used) / m.kv_blocks_total
                                       : 0.0}});
    metric("mlag_memory_bytes", "gauge",
           "The memory plan: its usable memory, the bytes planned, and the bytes the planned "
           "items hold.",
           {{"{kind=\"usable\"}", static_cast<double>(m.memory_usable_bytes)},
            {"{kind=\"planned\"}", static_cast<double>(m.memory_planned_bytes)},
            {"{kind=\"allocated\"}", static_cast<double>(m.memory_allocated_bytes)}});
    metric("mlag_prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache.",
           {{"", m.prefix_queried_tokens > 0
                     ? static_cast<double>(m.prefix_hit_tokens) / m.prefix_queried_tokens
                     : 0.0}});
    return out;
  }

  // A token's logprob entries. Chat's "token" is the token's text, "" when
  // its bytes are not whole UTF-8 characters (one byte of a character, say);
  // "bytes" always holds them, as integers 0-255.
  // `prompt` (completions with echo): the prompt tokens' entries go first.
  Json LogprobsJson(const ApiRequest& r, const std::vector<int32_t>& tokens,
                    const std::vector<std::vector<TokenLogprob>>& lps,
                    const std::vector<PromptLogprob>* prompt = nullptr) const {
    const Tokenizer* tok = engine_->tokenizer().ok() ? *engine_->tokenizer() : nullptr;
    auto bytes_of = [&](int32_t id) {
      return tok != nullptr ? tok->TokenBytes(id) : std::to_string(id);
    };
    // A completion's name of a token: its bytes, or "token_id:N".
    auto name_of = [&](int32_t id) {
      return r.tokens_as_ids ? absl::StrCat("token_id:", id) : bytes_of(id);
    };
    auto chosen = [&](size_t i) -> Json {
      for (const TokenLogprob& t : lps[i]) {
        if (t.token == tokens[i]) return t.logprob;
      }
      return nullptr;  // outside the top K
    };
    if (r.chat) {
      auto entry = [&](int32_t id) {
        const std::string b = bytes_of(id);
        return Json{{"token", r.tokens_as_ids        ? absl::StrCat("token_id:", id)
                              : SanitizeUtf8(b) == b ? b
                                                     : std::string()},
                    {"bytes", std::vector<int>(
                                  reinterpret_cast<const unsigned char*>(b.data()),
                                  reinterpret_cast<const unsigned char*>(b.data()) + b.size())}};
      };
      Json content = Json::array();
      for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
        Json top = Json::array();
        for (int k = 0; k < r.top_logprobs && k < static_cast<int>(lps[i].size()); ++k) {
          Json t = entry(lps[i][k].token);
          t["logprob"] = lps[i][k].logprob;
          top.push_back(t);
        }
        Json e = entry(tokens[i]);
        e["logprob"] = chosen(i);
        e["top_logprobs"] = top;
        content.push_back(e);
      }
      return {{"content", content}};
    }
    Json toks = Json::array(), lp = Json::array(), top = Json::array();
    if (prompt != nullptr) {
      // echo: the prompt's tokens first; the first has no log-probability.
      const std::vector<int32_t>& ids = r.spec.prompt;
      for (size_t i = 0; i < ids.size(); ++i) {
        toks.push_back(name_of(ids[i]));
        if (i == 0 || i - 1 >= prompt->size()) {
          lp.push_back(nullptr);
          top.push_back(nullptr);
          continue;
        }
        const PromptLogprob& e = (*prompt)[i - 1];
        lp.push_back(e.logprob);
        Json alt = Json::object();
        for (const TokenLogprob& t : e.top) alt[name_of(t.token)] = t.logprob;
        top.push_back(alt);
      }
    }
    for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
      toks.push_back(name_of(tokens[i]));
      lp.push_back(chosen(i));
      Json alt = Json::object();
      for (const TokenLogprob& t : lps[i]) alt[name_of(t.token)] = t.logprob;
      top.push_back(alt);
    }
    return {{"tokens", toks}, {"token_logprobs", lp}, {"top_logprobs", top}};
  }

  Json Usage(int prompt, int completion) const {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }

  // One chunk (stream) or the whole choice.
  Json Choice(const ApiRequest& r, const std::string& text, const Json& logprobs,
              const char* finish, bool chunk, bool first) const {
    Json c = {{"index", 0}, {"logprobs", logprobs}};
    c["finish_reason"] = finish != nullptr ? Json(finish) : Json(nullptr);
    if (!r.chat) {
      c["text"] = text;
    } else if (chunk) {
      Json delta = Json::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first || !logprobs.is_null()) delta["content"] = text;
      c["delta"] = delta;
    } else {
      c["message"] = {{"role", "assistant"}, {"content", text}};
    }
    return c;
  }

  Json Envelope(const ApiRequest& r, const std::string& id, bool chunk) const {
    return {{"id", id},
            {"object",
             r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", model_id_}};
  }

  // Parsing (which tokenizes the prompt) runs on a worker thread, so that
  // a long prompt does not hold the HTTP thread; the request then enters
  // the engine back on the HTTP thread.
  void Complete(HttpRequest req, const std::shared_ptr<HttpExchange>& ex, bool chat) {
    const uint64_t n = next_id_++;
    net::post(workers_, [this, body = std::move(req.body), ex, chat, n] {
      auto param = std::make_shared<std::string>();
      auto parsed = std::make_shared<absl::StatusOr<ApiRequest>>(
          ParseRequestOrError(body, chat, *engine_, model_id_, n, param.get()));
      http_->Post([this, ex, chat, n, parsed, param] { Admit(ex, chat, n, *parsed, *param); });
    });
  }

  void Admit(const std::shared_ptr<HttpExchange>& ex, bool chat, uint64_t n,
             const absl::StatusOr<ApiRequest>& parsed, const std::string& param) {
    if (ex->ended()) return;  // the client went away meanwhile
    if (!parsed.ok()) {
      ++bad_requests_;
      return SendError(*ex, FromStatus(parsed.status(), param));
    }
    auto p = std::make_shared<Pending>();
    p->r = std::make_shared<ApiRequest>(*parsed);
    absl::StatusOr<std::shared_ptr<RequestStream>> submitted =
        engine_->Submit(p->r->spec, p->r->stops);
    if (!submitted.ok()) {
      if (!absl::IsResourceExhausted(submitted.status())) ++bad_requests_;
      return SendError(*ex, FromStatus(submitted.status()));
    }
    p->stream = *submitted;
    p->ex = ex;
    p->id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", n);
    if (p->r->stream) {
      ex->BeginStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    }
    // The exchange holds the request until its reply ends; a client that
    // goes away aborts it.
    ex->OnAbandon([p] { p->stream->Cancel(); });
    std::weak_ptr<Pending> weak = p;
    HttpServer* http = http_;
    p->stream->SetListener([this, http, weak] {
      http->Post([this, weak] {
        if (std::shared_ptr<Pending> q = weak.lock()) Pump(*q);
      });
    });
    Pump(*p);  // what arrived before the listener
  }

  // Sends what the engine produced since the last call.
  void Pump(Pending& p) {
    if (p.ex->ended()) return;
    RequestStream::Update u;
    if (!p.stream->Wait(&u, absl::ZeroDuration())) return;
    const ApiRequest& r = *p.r;
    if (r.stream) return PumpStream(p, u);
    p.text += u.text;
    p.tokens.insert(p.tokens.end(), u.tokens.begin(), u.tokens.end());
    p.logprobs.insert(p.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    if (!u.prompt_logprobs.empty()) p.prompt_logprobs = u.prompt_logprobs;
    if (!u.finished) return;
    if (!u.error.ok()) return SendError(*p.ex, FromStatus(u.error));
    Json body = Envelope(r, p.id, false);
    Json lp = r.spec.sampling.logprobs > 0
                  ? LogprobsJson(r, p.tokens, p.logprobs, r.echo ? &p.prompt_logprobs : nullptr)
                  : Json();
    const std::string text = r.echo ? r.prompt_text + p.text : p.text;
    body["choices"] =
        Json::array({Choice(r, text, lp, FinishName(u.reason).c_str(), false, false)});
    body["usage"] = Usage(u.prompt_tokens, u.completion_tokens);
    p.ex->Reply(200, "application/json", Dump(body));
  }

  // Server-sent events: a chunk for new text, or for new tokens when their
  // logprobs were asked for (every token has its entry, text or not).
  void PumpStream(Pending& p, const RequestStream::Update& u) {
    const ApiRequest& r = *p.r;
    auto send = [&](const std::string& data) { p.ex->Write(absl::StrCat("data: ", data, "\n\n")); };
    if (u.finished && !u.error.ok()) {
      send(Dump(ErrorBody(FromStatus(u.error))));
      return p.ex->End();
    }
    const bool with_logprobs = r.spec.sampling.logprobs > 0 && !u.tokens.empty();
    if (!u.text.empty() || p.first || u.finished || with_logprobs) {
      Json chunk = Envelope(r, p.id, true);
      // echo: the first chunk starts with the prompt (its log-probabilities
      // arrive with the first token, which the first chunk carries).
      const bool echo = r.echo && p.first;
      Json lp = with_logprobs
                    ? LogprobsJson(r, u.tokens, u.logprobs, echo ? &u.prompt_logprobs : nullptr)
                    : Json();
      chunk["choices"] =
          Json::array({Choice(r, echo ? r.prompt_text + u.text : u.text, lp,
                              u.finished ? FinishName(u.reason).c_str() : nullptr, true, p.first)});
      p.first = false;
      send(Dump(chunk));
    }
    if (!u.finished) return;
    if (r.include_usage) {
      Json usage = Envelope(r, p.id, true);
      usage["choices"] = Json::array();
      usage["usage"] = Usage(u.prompt_tokens, u.completion_tokens);
      send(Dump(usage));
    }
    send("[DONE]");
    p.ex->End();
  }

  std::unique_ptr<AsyncEngine> engine_;
  std::string model_id_;
  HttpServer* http_ = nullptr;
  net::thread_pool workers_{2};  // parse and tokenize requests
  const int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  uint64_t next_id_ = 1;
  int64_t bad_requests_ = 0;
};

int Serve(const ServeFlags& f) {
  absl::StatusOr<EngineOptions> options = f.engine.ToOptions();
  if (!options.ok()) return Fail(options.status());
  // A batch as large as the number of clients served at once.
  absl::StatusOr<std::unique_ptr<AsyncEngine>> engine =
      AsyncEngine::Create(*options, f.max_pending, f.ep);
  if (!engine.ok()) return Fail(engine.status());
  std::fprintf(stderr, "mlag serve: %s on %s, max_model_len %d\n",
               (*engine)->model_description().c_str(), (*engine)->device_name().c_str(),
               (*engine)->max_model_len());
  std::fprintf(stderr, "memory plan%s:\n", f.ep > 1 ? " (each rank)" : "");
  for (const std::string& line : (*engine)->memory_plan().Lines()) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  ApiServer api(*std::move(engine), options->model);
  HttpServerOptions http_options;
  http_options.host = f.host;
  http_options.port = f.port;
  http_options.request_timeout = absl::Seconds(f.request_timeout);
  http_options.shutdown_timeout = absl::Seconds(f.shutdown_timeout);
  absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Listen(
      http_options,
      [&api](HttpRequest req, std::shared_ptr<HttpExchange> ex) { api.Handle(std::move(req), ex); },
      &ApiServer::ErrorJson);
  if (!http.ok()) return Fail(http.status());
  api.set_http(http->get());
  signal(SIGPIPE, SIG_IGN);  // a closed connection is an error return, not a signal
  std::fprintf(stderr, "mlag serve: listening on http://%s:%d\n", f.host.c_str(), (*http)->port());
  std::fflush(stderr);
  (*http)->Run();
  // Aborted requests end in the engine; its threads stop before the server
  // they post to goes.
  api.StopEngine();
  std::fprintf(stderr, "mlag serve: stopped\n");
  return 0;
}

}  // namespace

Command AddServeCommand(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* serve = app.add_subcommand("serve", "serve the OpenAI HTTP API");
  f->engine.Register(serve);
  serve->add_option("--host", f->host, "address to listen on (default 127.0.0.1)");
  serve->add_option("--port", f->port, "port to listen on (default 8000)")
      ->check(CLI::Range(1, 65535));
  serve
      ->add_option("--max-pending", f->max_pending,
                   "requests in flight (queued or running) before new ones get a 429")
      ->check(CLI::Range(1, 1 << 16));
  serve
      ->add_option("--request-timeout", f->request_timeout,
                   "seconds a connection has to send a whole request (headers and body) once "
                   "idle, after which it is closed (default 10)")
      ->check(CLI::Range(0.01, 3600.0));
  serve
      ->add_option("--shutdown-timeout", f->shutdown_timeout,
                   "seconds in-flight requests get to finish after SIGTERM or SIGINT before "
                   "they are aborted (default 10)")
      ->check(CLI::Range(0.0, 3600.0));
  serve
      ->add_option("--ep", f->ep,
                   "expert-parallel ranks, as host threads in this process (0: off); "
                   "requests go to the ranks in turn")
      ->check(CLI::Range(0, 1024));
  f->app = serve;
  return {serve, [f] { return Serve(*f); }};
}

}  // namespace mlag::cli
