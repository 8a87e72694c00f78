// mlag serve: the OpenAI HTTP API over one engine (runtime/engine/async_engine.h),
// or a world of expert-parallel host thread ranks (--ep N); concurrent
// clients batched by the engine's continuous batching.
//
//   mlag serve --model M [--host 127.0.0.1] [--port 8000] [--max-pending N] [--ep N]
//              [engine flags]
//
// Endpoints: GET /health, GET /v1/models, GET /metrics (Prometheus text),
// POST /v1/completions and POST /v1/chat/completions, with "stream": true as
// server-sent events ending in "data: [DONE]". A bad request gets a 400 with
// an OpenAI-style error body; more than --max-pending requests in flight get
// a 429. A streaming client that disconnects aborts its request; so does one
// waiting for a whole response (its connection is probed with whitespace,
// which JSON allows before the body, every half second).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/mlag/cli.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"
#include "runtime/engine/async_engine.h"

namespace mlag::cli {
namespace {

using Json = nlohmann::json;

struct ServeFlags {
  CLI::App* app = nullptr;
  EngineFlags engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  int max_pending = 256;
  int threads = 0;  // HTTP worker threads; 0: max_pending + 8
  int ep = 0;       // expert-parallel host thread ranks; 0: off
};

// Keys of the JSON this server writes are ASCII; text may hold invalid UTF-8
// only through token bytes, replaced rather than thrown on.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// An OpenAI-style error.
struct ApiError {
  int http_status;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
};

Json ErrorBody(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"code", e.http_status}};
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  return {{"error", err}};
}

ApiError FromStatus(const absl::Status& s, const std::string& param = "") {
  int http = 400;
  std::string type = "invalid_request_error";
  if (absl::IsResourceExhausted(s)) http = 429, type = "rate_limit_error";
  if (absl::IsNotFound(s)) http = 404;
  if (absl::IsUnavailable(s) || absl::IsFailedPrecondition(s)) http = 503, type = "server_error";
  if (absl::IsInternal(s) || absl::IsUnknown(s)) http = 500, type = "server_error";
  return {http, std::string(s.message()), type, param};
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(Dump(ErrorBody(e)), "application/json");
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
};

// Reads an optional number field, range-checked; ApiError naming it otherwise.
template <typename T>
absl::Status ReadNumber(const Json& body, const char* key, double lo, double hi, T* out) {
  if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
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
      if (!part.is_object() || part.value("type", std::string()) != "text" ||
          !part.contains("text") || !part["text"].is_string()) {
        return absl::InvalidArgumentError("only text content parts are supported");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  return absl::InvalidArgumentError("a message's content must be a string or text parts");
}

// NotFound when the body names a model other than `model_id`.
absl::StatusOr<ApiRequest> ParseRequest(const std::string& body_text, bool chat,
                                        const AsyncEngine& engine, const std::string& model_id,
                                        uint64_t default_seed) {
  Json body = Json::parse(body_text, nullptr, false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  if (body.contains("model") && body["model"].is_string() &&
      body["model"].get<std::string>() != model_id) {
    return absl::NotFoundError(absl::StrCat("model '", body["model"].get<std::string>(),
                                            "' is not served here; this server serves '", model_id,
                                            "'"));
  }
  ApiRequest r;
  r.chat = chat;
  if (body.contains("stream")) {
    if (!body["stream"].is_boolean())
      return absl::InvalidArgumentError("'stream' must be a boolean");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    r.include_usage = body["stream_options"].value("include_usage", false);
  }
  int n = 1;
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "n", 1, 1, &n));
  absl::StatusOr<const Tokenizer*> tok = engine.tokenizer();

  // The prompt.
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
      return absl::InvalidArgumentError("'messages' must be a non-empty array");
    }
    if (!tok.ok()) return tok.status();
    std::vector<ChatMessage> messages;
    for (const Json& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return absl::InvalidArgumentError("every message needs a string 'role'");
      }
      MLAG_ASSIGN_OR_RETURN(std::string content, ContentText(m.value("content", Json())));
      messages.push_back({m["role"].get<std::string>(), std::move(content)});
    }
    MLAG_ASSIGN_OR_RETURN(std::string prompt, (*tok)->FormatChat(messages, true));
    MLAG_ASSIGN_OR_RETURN(r.spec.prompt, (*tok)->Encode(prompt, /*add_bos=*/false));
  } else {
    if (!body.contains("prompt")) return absl::InvalidArgumentError("'prompt' is required");
    Json prompt = body["prompt"];
    if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) prompt = prompt[0];
    if (prompt.is_string()) {
      if (!tok.ok()) return tok.status();
      MLAG_ASSIGN_OR_RETURN(r.spec.prompt,
                            (*tok)->Encode(prompt.get<std::string>(), (*tok)->add_bos()));
    } else if (prompt.is_array() && !prompt.empty()) {
      for (const Json& t : prompt) {
        if (!t.is_number_integer()) {
          return absl::InvalidArgumentError(
              "'prompt' must be a string or an array of token ids (one prompt per request)");
        }
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= engine.config().vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("prompt token ", id,
                                                         " is outside the vocabulary [0, ",
                                                         engine.config().vocab_size, ")"));
        }
        r.spec.prompt.push_back(static_cast<int32_t>(id));
      }
    } else {
      return absl::InvalidArgumentError("'prompt' must be a string or an array of token ids");
    }
  }
  if (r.spec.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int prompt_len = static_cast<int>(r.spec.prompt.size());
  if (prompt_len >= engine.max_model_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt_len, " tokens; this model's limit (max_model_len) is ",
        engine.max_model_len(), " tokens, prompt and completion together"));
  }

  // Lengths and sampling.
  const int room = engine.max_model_len() - prompt_len;
  r.spec.max_tokens = chat ? room : std::min(16, room);  // OpenAI's defaults
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "max_tokens", 1, 1 << 30, &r.spec.max_tokens));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "max_completion_tokens", 1, 1 << 30, &r.spec.max_tokens));
  SamplingParams& sp = r.spec.sampling;
  sp.temperature = 1.0f;  // OpenAI's default
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "temperature", 0, 100, &sp.temperature));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_p", 1e-9, 1, &sp.top_p));
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_k", -1, 1 << 30, &sp.top_k));
  if (sp.top_k < 0) sp.top_k = 0;
  sp.seed = default_seed;
  MLAG_RETURN_IF_ERROR(ReadNumber(body, "seed", 0, 1.8e19, &sp.seed));
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) {
        return absl::InvalidArgumentError("'logprobs' must be a boolean for chat");
      }
      r.logprobs = body["logprobs"].get<bool>();
    }
    MLAG_RETURN_IF_ERROR(ReadNumber(body, "top_logprobs", 0, 20, &r.top_logprobs));
    if (r.top_logprobs > 0 && !r.logprobs) {
      return absl::InvalidArgumentError("'top_logprobs' needs 'logprobs': true");
    }
    sp.logprobs = r.logprobs ? std::max(1, r.top_logprobs) : 0;
  } else {
    MLAG_RETURN_IF_ERROR(ReadNumber(body, "logprobs", 0, 20, &r.top_logprobs));
    sp.logprobs = r.top_logprobs;
  }
  // Stops: strings, and the end-of-sentence token unless ignore_eos.
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      r.stops.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16) {
      for (const Json& e : s) {
        if (!e.is_string()) return absl::InvalidArgumentError("'stop' must hold strings");
        r.stops.push_back(e.get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError("'stop' must be a string or up to 16 strings");
    }
    if (!r.stops.empty() && !tok.ok()) return tok.status();
  }
  if (tok.ok() && (*tok)->eos_id() && !body.value("ignore_eos", false)) {
    r.spec.stop_token_ids.push_back(*(*tok)->eos_id());
  }
  return r;
}

// OpenAI's finish_reason: "stop", "length" (and "abort", which no client of
// an aborted request sees).
std::string FinishName(FinishReason reason) { return std::string(FinishReasonName(reason)); }

// The server: handlers, ids and the engine.
class Server {
 public:
  Server(std::unique_ptr<AsyncEngine> engine, std::string model_id)
      : engine_(std::move(engine)), model_id_(std::move(model_id)) {}

  void Install(httplib::Server& http) {
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      Json model = {{"id", model_id_},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "mlagraph"},
                    {"max_model_len", engine_->max_model_len()}};
      res.set_content(Dump({{"object", "list"}, {"data", Json::array({model})}}),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(Metrics(), "text/plain; version=0.0.4");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, /*chat=*/false);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, /*chat=*/true);
    });
  }

 private:
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
            {"{outcome=\"bad_request\"}", static_cast<double>(bad_requests_.load())}});
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

  Json LogprobsJson(const ApiRequest& r, const std::vector<int32_t>& tokens,
                    const std::vector<std::vector<TokenLogprob>>& lps) const {
    const Tokenizer* tok = engine_->tokenizer().ok() ? *engine_->tokenizer() : nullptr;
    auto text_of = [&](int32_t id) {
      return tok != nullptr ? tok->TokenBytes(id) : std::to_string(id);
    };
    auto chosen = [&](size_t i) -> Json {
      for (const TokenLogprob& t : lps[i]) {
        if (t.token == tokens[i]) return t.logprob;
      }
      return nullptr;  // outside the top K
    };
    if (r.chat) {
      Json content = Json::array();
      for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
        Json top = Json::array();
        for (int k = 0; k < r.top_logprobs && k < static_cast<int>(lps[i].size()); ++k) {
          top.push_back({{"token", text_of(lps[i][k].token)}, {"logprob", lps[i][k].logprob}});
        }
        const std::string t = text_of(tokens[i]);
        content.push_back({{"token", t},
                           {"logprob", chosen(i)},
                           {"bytes", std::vector<int>(t.begin(), t.end())},
                           {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    Json toks = Json::array(), lp = Json::array(), top = Json::array();
    for (size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
      toks.push_back(text_of(tokens[i]));
      lp.push_back(chosen(i));
      Json alt = Json::object();
      for (const TokenLogprob& t : lps[i]) alt[text_of(t.token)] = t.logprob;
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
      if (!text.empty() || first) delta["content"] = text;
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

  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const uint64_t n = next_id_.fetch_add(1);
    absl::StatusOr<ApiRequest> parsed = ParseRequest(req.body, chat, *engine_, model_id_, n);
    if (!parsed.ok()) {
      ++bad_requests_;
      return SendError(res, FromStatus(parsed.status()));
    }
    auto r = std::make_shared<ApiRequest>(*std::move(parsed));
    absl::StatusOr<std::shared_ptr<RequestStream>> submitted = engine_->Submit(r->spec, r->stops);
    if (!submitted.ok()) {
      if (!absl::IsResourceExhausted(submitted.status())) ++bad_requests_;
      return SendError(res, FromStatus(submitted.status()));
    }
    std::shared_ptr<RequestStream> stream = *submitted;
    const std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", n);
    if (r->stream) {
      res.set_header("Cache-Control", "no-cache");
      auto first = std::make_shared<bool>(true);
      auto done = std::make_shared<bool>(false);
      res.set_chunked_content_provider("text/event-stream", [this, r, stream, id, first, done](
                                                                size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& data) {
          const std::string event = absl::StrCat("data: ", data, "\n\n");
          return sink.write(event.data(), event.size());
        };
        if (*done) {
          sink.done();
          return true;
        }
        RequestStream::Update u;
        if (!stream->Wait(&u, absl::Milliseconds(500))) {
          // Nothing yet: a comment line probes the connection.
          if (!sink.write(":\n\n", 3)) {
            stream->Cancel();
            return false;
          }
          return true;
        }
        if (u.finished && !u.error.ok()) {
          send(Dump(ErrorBody(FromStatus(u.error))));
          *done = true;
          return true;
        }
        if (!u.text.empty() || *first || u.finished) {
          Json chunk = Envelope(*r, id, true);
          Json lp = nullptr;
          if (r->spec.sampling.logprobs > 0 && !u.tokens.empty()) {
            lp = LogprobsJson(*r, u.tokens, u.logprobs);
          }
          chunk["choices"] = Json::array({Choice(
              *r, u.text, lp, u.finished ? FinishName(u.reason).c_str() : nullptr, true, *first)});
          *first = false;
          if (!send(Dump(chunk))) {
            stream->Cancel();
            return false;
          }
        }
        if (u.finished) {
          if (r->include_usage) {
            Json usage = Envelope(*r, id, true);
            usage["choices"] = Json::array();
            usage["usage"] = Usage(u.prompt_tokens, u.completion_tokens);
            send(Dump(usage));
          }
          send("[DONE]");
          *done = true;
        }
        return true;
      });
      return;
    }
    // A whole response: collected, with the connection probed meanwhile.
    auto text = std::make_shared<std::string>();
    auto tokens = std::make_shared<std::vector<int32_t>>();
    auto lps = std::make_shared<std::vector<std::vector<TokenLogprob>>>();
    auto done = std::make_shared<bool>(false);
    res.set_chunked_content_provider("application/json", [this, r, stream, id, text, tokens, lps,
                                                          done](size_t, httplib::DataSink& sink) {
      if (*done) {
        sink.done();
        return true;
      }
      RequestStream::Update u;
      const bool news = stream->Wait(&u, absl::Milliseconds(500));
      *text += u.text;
      tokens->insert(tokens->end(), u.tokens.begin(), u.tokens.end());
      lps->insert(lps->end(), u.logprobs.begin(), u.logprobs.end());
      if (!u.finished) {
        // Half a second without news: probe the connection with whitespace,
        // which JSON allows before the body.
        if (!news && !sink.write(" ", 1)) {
          stream->Cancel();
          return false;
        }
        return true;
      }
      Json body;
      if (!u.error.ok()) {
        body = ErrorBody(FromStatus(u.error));
      } else {
        body = Envelope(*r, id, false);
        Json lp = r->spec.sampling.logprobs > 0 ? LogprobsJson(*r, *tokens, *lps) : Json();
        body["choices"] =
            Json::array({Choice(*r, *text, lp, FinishName(u.reason).c_str(), false, false)});
        body["usage"] = Usage(u.prompt_tokens, u.completion_tokens);
      }
      const std::string s = Dump(body);
      sink.write(s.data(), s.size());
      *done = true;
      return true;
    });
  }

  std::unique_ptr<AsyncEngine> engine_;
  std::string model_id_;
  const int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> bad_requests_{0};
};

httplib::Server* g_http = nullptr;

void OnSignal(int) {
  if (g_http != nullptr) g_http->stop();
}

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
  Server server(*std::move(engine), options->model);
  httplib::Server http;
  const int threads = f.threads > 0 ? f.threads : f.max_pending + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(size_t{64} << 20);
  server.Install(http);
  if (!http.bind_to_port(f.host.c_str(), f.port)) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen on ", f.host, ":", f.port, " (in use, or not allowed)")));
  }
  g_http = &http;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);  // a closed connection is an error return, not a signal
  std::fprintf(stderr, "mlag serve: listening on http://%s:%d\n", f.host.c_str(), f.port);
  std::fflush(stderr);
  const bool ok = http.listen_after_bind();
  g_http = nullptr;
  return ok ? 0 : 1;
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
  serve->add_option("--http-threads", f->threads, "HTTP worker threads (default max-pending + 8)")
      ->check(CLI::Range(0, 1 << 16));
  serve
      ->add_option("--ep", f->ep,
                   "expert-parallel ranks, as host threads in this process (0: off); "
                   "requests go to the ranks in turn")
      ->check(CLI::Range(0, 1024));
  f->app = serve;
  return {serve, [f] { return Serve(*f); }};
}

}  // namespace mlag::cli
