// The C API (runtime/mlagraph.h) over mlag::Engine.
//
// Every entry point runs its body inside Guard(): absl::Status errors become
// an mlag_status plus a thread-local message, and any exception is caught
// here, so nothing but a status code crosses the boundary.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "mlag_config.h"
#include "mlagraph/mlagraph.h"
#include "runtime/engine/engine.h"

namespace {

// "1.2.3" -> 10203, at compile time, to tie the header's version macros to
// meson.build's project version.
constexpr int ParseVersionCode(const char* s) {
  int parts[3] = {0, 0, 0};
  int i = 0;
  for (; *s != '\0' && i < 3; ++s) {
    if (*s == '.') {
      ++i;
    } else {
      parts[i] = parts[i] * 10 + (*s - '0');
    }
  }
  return parts[0] * 10000 + parts[1] * 100 + parts[2];
}
static_assert(ParseVersionCode(MLAG_VERSION_STRING) == MLAG_VERSION_CODE,
              "runtime/mlagraph.h's MLAG_VERSION_* differ from meson.build's project version");

// Sizes of the first version of each versioned struct: a caller's struct_size
// must be at least this.
constexpr size_t kEngineOptionsV1Size =
    offsetof(mlag_engine_options, seed) + sizeof(mlag_engine_options::seed);
constexpr size_t kEngineOptionsWeightDtypeSize =
    offsetof(mlag_engine_options, weight_dtype) + sizeof(mlag_engine_options::weight_dtype);
constexpr size_t kEngineOptionsMemoryUtilizationSize =
    offsetof(mlag_engine_options, memory_utilization) +
    sizeof(mlag_engine_options::memory_utilization);
constexpr size_t kSamplingParamsV1Size =
    offsetof(mlag_sampling_params, logprobs) + sizeof(mlag_sampling_params::logprobs);
constexpr size_t kEngineStatsV1Size =
    offsetof(mlag_engine_stats, preemptions) + sizeof(mlag_engine_stats::preemptions);

// The integer a C caller stored in an enum. C allows any int there, while in
// C++ loading a value outside the enumerators' range is undefined, so enum
// arguments are read through their bytes before they are checked.
template <typename Enum>
std::underlying_type_t<Enum> RawValue(const Enum& e) {
  std::underlying_type_t<Enum> value;
  static_assert(sizeof(value) == sizeof(e), "enum and its underlying type differ in size");
  std::memcpy(&value, &e, sizeof(value));
  return value;
}

// The last call's message. error_ptr is what mlag_last_error returns: it
// points into error_text, or at a static string when recording the message
// itself ran out of memory.
thread_local std::string error_text;
thread_local const char* error_ptr = "";

void SetError(const char* function, absl::string_view message) noexcept {
  try {
    error_text.assign(function);
    error_text.append(": ");
    error_text.append(message.data(), message.size());
    error_ptr = error_text.c_str();
  } catch (...) {
    error_ptr = "out of memory while recording an error message";
  }
}

mlag_status Ok() noexcept {
  error_text.clear();
  error_ptr = "";
  return MLAG_OK;
}

mlag_status CodeOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return MLAG_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return MLAG_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return MLAG_NOT_FOUND;
    case absl::StatusCode::kResourceExhausted:
      return MLAG_OUT_OF_MEMORY;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
      return MLAG_UNAVAILABLE;
    default:
      return MLAG_INTERNAL;
  }
}

// An error result of `function`. Callers must not build `message` in a way
// that throws after an exception was caught; Guard passes plain strings.
mlag_status Fail(const char* function, mlag_status code, absl::string_view message) noexcept {
  SetError(function, message);
  return code;
}

mlag_status FromStatus(const char* function, const absl::Status& status) noexcept {
  if (status.ok()) return Ok();
  return Fail(function, CodeOf(status.code()), status.message());
}

// Runs `body` (returning mlag_status), turning every exception into an error.
template <typename Body>
mlag_status Guard(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(function, MLAG_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    SetError(function, "unexpected exception: ");
    try {
      error_text.append(e.what());
      error_ptr = error_text.c_str();
    } catch (...) {
    }
    return MLAG_INTERNAL;
  } catch (...) {
    return Fail(function, MLAG_INTERNAL, "unexpected exception of unknown type");
  }
}

// Shared checks of a pointer argument.
#define MLAG_CAPI_REQUIRE(ptr, fn)                                                   \
  do {                                                                               \
    if ((ptr) == nullptr) return Fail((fn), MLAG_INVALID_ARGUMENT, #ptr " is NULL"); \
  } while (0)

}  // namespace

// The handle: the engine plus what the C API adds to it.
struct mlag_engine {
  std::unique_ptr<mlag::Engine> engine;
  uint64_t default_seed = 0;  // seed of requests whose sampling seed is 0
};

namespace {

// The request `id` of `engine`, or an error naming it.
mlag_status FindRequest(const char* function, const mlag_engine* engine, int64_t id,
                        const mlag::Request** out) {
  *out = engine->engine->request(id);
  if (*out == nullptr) {
    return Fail(function, MLAG_NOT_FOUND, absl::StrCat("no request with id ", id));
  }
  return MLAG_OK;
}

mlag_status CheckEngine(const char* function, const mlag_engine* engine) noexcept {
  if (engine == nullptr) return Fail(function, MLAG_INVALID_ARGUMENT, "engine is NULL");
  if (engine->engine == nullptr) return Fail(function, MLAG_INTERNAL, "engine is not initialized");
  return MLAG_OK;
}

}  // namespace

extern "C" {

int mlag_version(void) { return MLAG_VERSION_CODE; }

const char* mlag_status_string(mlag_status status) {
  switch (RawValue(status)) {
    case MLAG_OK:
      return "MLAG_OK";
    case MLAG_INVALID_ARGUMENT:
      return "MLAG_INVALID_ARGUMENT";
    case MLAG_NOT_FOUND:
      return "MLAG_NOT_FOUND";
    case MLAG_OUT_OF_MEMORY:
      return "MLAG_OUT_OF_MEMORY";
    case MLAG_UNAVAILABLE:
      return "MLAG_UNAVAILABLE";
    case MLAG_INTERNAL:
      return "MLAG_INTERNAL";
    default:
      break;
  }
  return "MLAG_UNKNOWN_STATUS";
}

const char* mlag_last_error(void) { return error_ptr; }

mlag_status mlag_engine_options_default(mlag_engine_options* options) {
  static const char* const fn = "mlag_engine_options_default";
  return Guard(fn, [&] {
    MLAG_CAPI_REQUIRE(options, fn);
    const mlag::EngineOptions d;
    std::memset(options, 0, sizeof(*options));
    options->struct_size = sizeof(*options);
    options->model = "tiny-v3";
    options->device = "auto";
    options->kv_cache_bytes = d.kv_cache_bytes;
    options->max_num_seqs = d.max_num_seqs;
    options->max_num_batched_tokens = d.max_num_batched_tokens;
    options->block_size = d.block_size;
    options->max_model_len = d.max_model_len;
    options->capture_sizes = nullptr;
    options->num_capture_sizes = 0;
    options->graph_mode = MLAG_GRAPH_FULL_DECODE;
    options->enable_prefix_caching = d.enable_prefix_caching ? 1 : 0;
    options->seed = 0;
    options->weight_dtype = "auto";
    options->memory_utilization = d.memory_utilization;
    return Ok();
  });
}

mlag_status mlag_sampling_params_default(mlag_sampling_params* params) {
  static const char* const fn = "mlag_sampling_params_default";
  return Guard(fn, [&] {
    MLAG_CAPI_REQUIRE(params, fn);
    const mlag::SamplingParams d;
    std::memset(params, 0, sizeof(*params));
    params->struct_size = sizeof(*params);
    params->temperature = d.temperature;
    params->top_k = d.top_k;
    params->top_p = d.top_p;
    params->seed = d.seed;
    params->logprobs = d.logprobs;
    return Ok();
  });
}

mlag_status mlag_engine_create(const mlag_engine_options* options, mlag_engine** out) {
  static const char* const fn = "mlag_engine_create";
  return Guard(fn, [&] {
    MLAG_CAPI_REQUIRE(out, fn);
    *out = nullptr;
    MLAG_CAPI_REQUIRE(options, fn);
    if (options->struct_size < kEngineOptionsV1Size) {
      return Fail(
          fn, MLAG_INVALID_ARGUMENT,
          absl::StrCat("options->struct_size is ", options->struct_size, "; it must be at least ",
                       kEngineOptionsV1Size, " (call mlag_engine_options_default first)"));
    }
    if (options->model == nullptr) return Fail(fn, MLAG_INVALID_ARGUMENT, "options->model is NULL");
    if (options->device == nullptr) {
      return Fail(fn, MLAG_INVALID_ARGUMENT, "options->device is NULL");
    }
    if (options->capture_sizes == nullptr && options->num_capture_sizes > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("options->capture_sizes is NULL but num_capture_sizes is ",
                               options->num_capture_sizes));
    }
    mlag::EngineOptions o;
    o.model = options->model;
    o.device = options->device;
    o.kv_cache_bytes = options->kv_cache_bytes;
    o.max_num_seqs = options->max_num_seqs;
    o.max_num_batched_tokens = options->max_num_batched_tokens;
    o.block_size = options->block_size;
    o.max_model_len = options->max_model_len;
    if (options->max_model_len < 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("options->max_model_len is ", options->max_model_len,
                               "; it must be >= 0 (0: the model's limit)"));
    }
    const auto graph_mode = RawValue(options->graph_mode);
    switch (graph_mode) {
      case MLAG_GRAPH_FULL_DECODE:
        o.graph_mode = mlag::GraphMode::kFullDecode;
        break;
      case MLAG_GRAPH_NONE:
        o.graph_mode = mlag::GraphMode::kNone;
        break;
      default:
        return Fail(fn, MLAG_INVALID_ARGUMENT,
                    absl::StrCat("unknown graph mode ", static_cast<int64_t>(graph_mode),
                                 " (expected MLAG_GRAPH_FULL_DECODE or MLAG_GRAPH_NONE)"));
    }
    if (options->num_capture_sizes > 0) {
      o.capture_sizes.assign(options->capture_sizes,
                             options->capture_sizes + options->num_capture_sizes);
    }
    o.enable_prefix_caching = options->enable_prefix_caching != 0;
    if (options->struct_size >= kEngineOptionsMemoryUtilizationSize &&
        options->memory_utilization != 0.0) {
      o.memory_utilization = options->memory_utilization;
    }
    if (options->struct_size >= kEngineOptionsWeightDtypeSize && options->weight_dtype != nullptr) {
      o.weight_dtype = options->weight_dtype;
    }
    auto engine = mlag::Engine::Create(o);
    if (!engine.ok()) return FromStatus(fn, engine.status());
    auto handle = std::make_unique<mlag_engine>();
    handle->engine = std::move(engine).value();
    handle->default_seed = options->seed;
    *out = handle.release();
    return Ok();
  });
}

mlag_status mlag_engine_destroy(mlag_engine* engine) {
  return Guard("mlag_engine_destroy", [&] {
    delete engine;
    return Ok();
  });
}

mlag_status mlag_get_model_limits(const mlag_engine* engine, int* out_vocab_size,
                                  int* out_max_model_len) {
  static const char* const fn = "mlag_get_model_limits";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_vocab_size, fn);
    MLAG_CAPI_REQUIRE(out_max_model_len, fn);
    *out_vocab_size = engine->engine->config().vocab_size;
    *out_max_model_len = engine->engine->max_model_len();
    return Ok();
  });
}

mlag_status mlag_add_request(mlag_engine* engine, const int32_t* prompt, size_t prompt_len,
                             int max_tokens, const int32_t* stop_ids, size_t num_stop_ids,
                             const mlag_sampling_params* params, int64_t* out_request_id) {
  static const char* const fn = "mlag_add_request";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_request_id, fn);
    if (prompt == nullptr && prompt_len > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("prompt is NULL but prompt_len is ", prompt_len));
    }
    if (stop_ids == nullptr && num_stop_ids > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("stop_ids is NULL but num_stop_ids is ", num_stop_ids));
    }
    mlag::RequestSpec spec;
    if (prompt_len > 0) spec.prompt.assign(prompt, prompt + prompt_len);
    spec.max_tokens = max_tokens;
    if (num_stop_ids > 0) spec.stop_token_ids.assign(stop_ids, stop_ids + num_stop_ids);
    if (params != nullptr) {
      if (params->struct_size < kSamplingParamsV1Size) {
        return Fail(
            fn, MLAG_INVALID_ARGUMENT,
            absl::StrCat("params->struct_size is ", params->struct_size, "; it must be at least ",
                         kSamplingParamsV1Size, " (call mlag_sampling_params_default first)"));
      }
      spec.sampling.temperature = params->temperature;
      spec.sampling.top_k = params->top_k;
      spec.sampling.top_p = params->top_p;
      spec.sampling.seed = params->seed;
      spec.sampling.logprobs = params->logprobs;
    }
    if (spec.sampling.seed == 0) spec.sampling.seed = engine->default_seed;
    auto id = engine->engine->AddRequest(spec);
    if (!id.ok()) return FromStatus(fn, id.status());
    *out_request_id = *id;
    return Ok();
  });
}

mlag_status mlag_step(mlag_engine* engine, int* out_num_new_tokens) {
  static const char* const fn = "mlag_step";
  return Guard(fn, [&] {
    if (out_num_new_tokens != nullptr) *out_num_new_tokens = 0;
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    auto step = engine->engine->Step();
    if (!step.ok()) return FromStatus(fn, step.status());
    if (out_num_new_tokens != nullptr) {
      *out_num_new_tokens = static_cast<int>(step->new_tokens.size());
    }
    return Ok();
  });
}

mlag_status mlag_has_unfinished(const mlag_engine* engine, int* out) {
  static const char* const fn = "mlag_has_unfinished";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out, fn);
    *out = engine->engine->HasUnfinished() ? 1 : 0;
    return Ok();
  });
}

mlag_status mlag_get_output(mlag_engine* engine, int64_t request_id, int32_t* tokens,
                            size_t capacity, size_t* out_num_tokens, int* out_finished,
                            mlag_finish_reason* out_reason) {
  static const char* const fn = "mlag_get_output";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_num_tokens, fn);
    if (tokens == nullptr && capacity > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("tokens is NULL but capacity is ", capacity));
    }
    const mlag::Request* r = nullptr;
    if (mlag_status s = FindRequest(fn, engine, request_id, &r); s != MLAG_OK) return s;
    const size_t n = static_cast<size_t>(r->num_output_tokens());
    const size_t copied = n < capacity ? n : capacity;
    if (copied > 0) {
      std::memcpy(tokens, r->tokens.data() + r->num_prompt_tokens, copied * sizeof(int32_t));
    }
    *out_num_tokens = n;
    if (out_finished != nullptr) *out_finished = r->finished() ? 1 : 0;
    if (out_reason != nullptr) {
      switch (r->finish_reason) {
        case mlag::FinishReason::kNone:
          *out_reason = MLAG_FINISH_NONE;
          break;
        case mlag::FinishReason::kLength:
          *out_reason = MLAG_FINISH_LENGTH;
          break;
        case mlag::FinishReason::kStop:
          *out_reason = MLAG_FINISH_STOP;
          break;
        case mlag::FinishReason::kAbort:
          *out_reason = MLAG_FINISH_ABORT;
          break;
      }
    }
    return Ok();
  });
}

mlag_status mlag_get_logprobs(mlag_engine* engine, int64_t request_id, size_t token_index,
                              int32_t* tokens, float* logprobs, size_t capacity,
                              size_t* out_count) {
  static const char* const fn = "mlag_get_logprobs";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_count, fn);
    if ((tokens == nullptr || logprobs == nullptr) && capacity > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("tokens or logprobs is NULL but capacity is ", capacity));
    }
    const mlag::Request* r = nullptr;
    if (mlag_status s = FindRequest(fn, engine, request_id, &r); s != MLAG_OK) return s;
    if (r->spec.sampling.logprobs <= 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("request ", request_id, " did not ask for logprobs"));
    }
    if (token_index >= r->logprobs.size()) {
      return Fail(fn, MLAG_INVALID_ARGUMENT,
                  absl::StrCat("token_index is ", token_index, " but request ", request_id, " has ",
                               r->logprobs.size(), " generated tokens"));
    }
    const std::vector<mlag::TokenLogprob>& entries = r->logprobs[token_index];
    const size_t copied = entries.size() < capacity ? entries.size() : capacity;
    for (size_t i = 0; i < copied; ++i) {
      tokens[i] = entries[i].token;
      logprobs[i] = entries[i].logprob;
    }
    *out_count = entries.size();
    return Ok();
  });
}

mlag_status mlag_abort(mlag_engine* engine, int64_t request_id) {
  static const char* const fn = "mlag_abort";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    return FromStatus(fn, engine->engine->Abort(request_id));
  });
}

mlag_status mlag_get_stats(const mlag_engine* engine, mlag_engine_stats* stats) {
  static const char* const fn = "mlag_get_stats";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(stats, fn);
    if (stats->struct_size < kEngineStatsV1Size) {
      return Fail(
          fn, MLAG_INVALID_ARGUMENT,
          absl::StrCat("stats->struct_size is ", stats->struct_size, "; it must be at least ",
                       kEngineStatsV1Size, " (set it to sizeof(mlag_engine_stats))"));
    }
    const mlag::EngineStats s = engine->engine->Stats();
    mlag_engine_stats full;
    std::memset(&full, 0, sizeof(full));
    full.steps = s.steps;
    full.eager_steps = s.eager_steps;
    for (const auto& [size, count] : s.graph_replays) full.graph_replays += count;
    full.dummy_steps = s.dummy_steps;
    full.num_graphs = s.num_graphs;
    full.prefix_cache_hit_rate = s.prefix_cache_hit_rate;
    full.prefix_cache_hit_tokens = s.prefix_cache_hit_tokens;
    full.kv_blocks_total = s.kv_blocks_total;
    full.kv_blocks_used = s.kv_blocks_used;
    full.kv_blocks_free = s.kv_blocks_free;
    full.kv_block_size = s.kv_block_size;
    full.kv_bytes_per_token = s.kv_bytes_per_token;
    full.capture_seconds = s.capture_seconds;
    full.preemptions = s.preemptions;
    // Write only the fields the caller's struct has; keep its struct_size.
    const size_t caller_size = stats->struct_size;
    const size_t n = caller_size < sizeof(full) ? caller_size : sizeof(full);
    full.struct_size = caller_size;
    std::memcpy(stats, &full, n);
    return Ok();
  });
}

mlag_status mlag_tokenize(const mlag_engine* engine, const char* text, size_t text_len, int add_bos,
                          int32_t* tokens, size_t capacity, size_t* out_num_tokens) {
  static const char* const fn = "mlag_tokenize";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_num_tokens, fn);
    if (text == nullptr && text_len > 0) return Fail(fn, MLAG_INVALID_ARGUMENT, "text is NULL");
    if (tokens == nullptr && capacity > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT, "tokens is NULL with a nonzero capacity");
    }
    absl::StatusOr<const mlag::Tokenizer*> tok = engine->engine->tokenizer();
    if (!tok.ok()) return FromStatus(fn, tok.status());
    absl::StatusOr<std::vector<int32_t>> ids =
        (*tok)->Encode(absl::string_view(text == nullptr ? "" : text, text_len), add_bos != 0);
    if (!ids.ok()) return FromStatus(fn, ids.status());
    const size_t n = std::min(capacity, ids->size());
    if (n > 0) std::memcpy(tokens, ids->data(), n * sizeof(int32_t));
    *out_num_tokens = ids->size();
    return Ok();
  });
}

mlag_status mlag_detokenize(const mlag_engine* engine, const int32_t* tokens, size_t num_tokens,
                            int skip_special, char* text, size_t capacity, size_t* out_len) {
  static const char* const fn = "mlag_detokenize";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out_len, fn);
    if (tokens == nullptr && num_tokens > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT, "tokens is NULL");
    }
    if (text == nullptr && capacity > 0) {
      return Fail(fn, MLAG_INVALID_ARGUMENT, "text is NULL with a nonzero capacity");
    }
    absl::StatusOr<const mlag::Tokenizer*> tok = engine->engine->tokenizer();
    if (!tok.ok()) return FromStatus(fn, tok.status());
    const std::string out =
        (*tok)->Decode(absl::Span<const int32_t>(tokens, num_tokens), skip_special != 0);
    if (capacity > 0) {
      const size_t n = std::min(capacity - 1, out.size());
      std::memcpy(text, out.data(), n);
      text[n] = '\0';
    }
    *out_len = out.size();
    return Ok();
  });
}

}  // extern "C"

struct mlag_detokenizer {
  mlag::IncrementalDetokenizer stream;
  std::string last;  // what the last push or finish returned
};

extern "C" {

mlag_status mlag_detokenizer_create(const mlag_engine* engine, int skip_special,
                                    mlag_detokenizer** out) {
  static const char* const fn = "mlag_detokenizer_create";
  return Guard(fn, [&] {
    if (mlag_status s = CheckEngine(fn, engine); s != MLAG_OK) return s;
    MLAG_CAPI_REQUIRE(out, fn);
    absl::StatusOr<const mlag::Tokenizer*> tok = engine->engine->tokenizer();
    if (!tok.ok()) return FromStatus(fn, tok.status());
    *out = new mlag_detokenizer{mlag::IncrementalDetokenizer(*tok, skip_special != 0), ""};
    return Ok();
  });
}

mlag_status mlag_detokenizer_push(mlag_detokenizer* detokenizer, int32_t token,
                                  const char** out_text, size_t* out_len) {
  static const char* const fn = "mlag_detokenizer_push";
  return Guard(fn, [&] {
    MLAG_CAPI_REQUIRE(detokenizer, fn);
    MLAG_CAPI_REQUIRE(out_text, fn);
    MLAG_CAPI_REQUIRE(out_len, fn);
    detokenizer->last = detokenizer->stream.Push(token);
    *out_text = detokenizer->last.c_str();
    *out_len = detokenizer->last.size();
    return Ok();
  });
}

mlag_status mlag_detokenizer_finish(mlag_detokenizer* detokenizer, const char** out_text,
                                    size_t* out_len) {
  static const char* const fn = "mlag_detokenizer_finish";
  return Guard(fn, [&] {
    MLAG_CAPI_REQUIRE(detokenizer, fn);
    MLAG_CAPI_REQUIRE(out_text, fn);
    MLAG_CAPI_REQUIRE(out_len, fn);
    detokenizer->last = detokenizer->stream.Finish();
    *out_text = detokenizer->last.c_str();
    *out_len = detokenizer->last.size();
    return Ok();
  });
}

mlag_status mlag_detokenizer_destroy(mlag_detokenizer* detokenizer) {
  static const char* const fn = "mlag_detokenizer_destroy";
  return Guard(fn, [&] {
    delete detokenizer;  // NULL is a no-op
    return Ok();
  });
}

}  // extern "C"
