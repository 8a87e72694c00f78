/* mlagraph C API: serve a DeepSeek-style model (MLA + MoE) from C.
 *
 * Example (error checks shortened; see examples/embed.c for the full form):
 *
 *   mlag_engine_options opts;
 *   mlag_engine_options_default(&opts);
 *   opts.model = "tiny-v3";
 *   mlag_engine* engine = NULL;
 *   if (mlag_engine_create(&opts, &engine) != MLAG_OK) {
 *     fprintf(stderr, "%s\n", mlag_last_error());
 *   }
 *   const int32_t prompt[] = {1, 2, 3};
 *   int64_t id;
 *   mlag_add_request(engine, prompt, 3, 8, NULL, 0, NULL, &id);
 *   int busy = 1;
 *   while (mlag_has_unfinished(engine, &busy) == MLAG_OK && busy) mlag_step(engine, NULL);
 *   int32_t out[8];
 *   size_t n;
 *   mlag_get_output(engine, id, out, 8, &n, NULL, NULL);
 *   mlag_engine_destroy(engine);
 *
 * Errors: every function that returns mlag_status returns MLAG_OK or an error
 * code, and never aborts or lets an exception out. It also sets this thread's
 * last-error message: "" on MLAG_OK, a sentence naming the problem otherwise
 * (read it with mlag_last_error()).
 *
 * Threads: different engines may be used from different threads at once. One
 * engine must not be used from two threads at once (the caller serializes;
 * read-only calls included). mlag_last_error() is per thread. mlag_version()
 * and mlag_status_string() are always safe.
 *
 * Versioned structs: the option, sampling and stats structs begin with
 * `size_t struct_size`; set it to sizeof(the struct) (the *_default functions
 * do). A library accepts any size at least that of the first version of the
 * struct, and reads or writes only the fields it and the caller both know.
 */
#ifndef MLAGRAPH_H_
#define MLAGRAPH_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions: libmlagraph.so is built with hidden
 * visibility, so these are the only symbols it exports. */
#if defined(__GNUC__) || defined(__clang__)
#define MLAG_API __attribute__((visibility("default")))
#else
#define MLAG_API
#endif

#define MLAG_VERSION_MAJOR 0
#define MLAG_VERSION_MINOR 1
#define MLAG_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch: 100 for 0.1.0. */
#define MLAG_VERSION_CODE \
  (MLAG_VERSION_MAJOR * 10000 + MLAG_VERSION_MINOR * 100 + MLAG_VERSION_PATCH)

/* Results. MLAG_NUM_STATUS is a count, not a result. */
typedef enum mlag_status {
  MLAG_OK = 0,
  MLAG_INVALID_ARGUMENT = 1, /* a bad argument, option or request */
  MLAG_NOT_FOUND = 2,        /* no such model, file or request id */
  MLAG_OUT_OF_MEMORY = 3,    /* a host or device allocation failed */
  MLAG_UNAVAILABLE = 4,      /* e.g. a CUDA device was asked for and none is usable */
  MLAG_INTERNAL = 5,         /* a bug or an unexpected failure inside the library */
  MLAG_NUM_STATUS
} mlag_status;

/* How the model runs decode steps. */
typedef enum mlag_graph_mode {
  MLAG_GRAPH_FULL_DECODE = 0, /* replay one captured full-model graph per batch size */
  MLAG_GRAPH_NONE = 1,        /* run every step eagerly */
  MLAG_NUM_GRAPH_MODES
} mlag_graph_mode;

/* Why a request finished. */
typedef enum mlag_finish_reason {
  MLAG_FINISH_NONE = 0,   /* still running */
  MLAG_FINISH_LENGTH = 1, /* generated max_tokens tokens, or reached max_model_len */
  MLAG_FINISH_STOP = 2,   /* generated one of its stop ids (included in the output) */
  MLAG_FINISH_ABORT = 3,  /* mlag_abort() */
  MLAG_NUM_FINISH_REASONS
} mlag_finish_reason;

/* An engine: model, KV cache, scheduler and captured graphs. */
typedef struct mlag_engine mlag_engine;

typedef struct mlag_engine_options {
  size_t struct_size;    /* sizeof(mlag_engine_options) */
  const char* model;     /* built-in name ("tiny-v3", "tiny-v2", "small") or checkpoint directory */
  const char* device;    /* "auto", "host", "cuda" or "cuda:N" */
  size_t kv_cache_bytes; /* KV pool size; bounds how many tokens can be in flight. 0: what the
                            engine's memory plan leaves of the usable memory (the default) */
  int max_num_seqs;      /* most sequences in one step */
  int max_num_batched_tokens; /* most tokens in one step */
  int block_size;             /* tokens per KV block */
  int max_model_len;          /* prompt + output limit; 0: the model's max_position_embeddings */
  const int* capture_sizes;   /* batch sizes to capture graphs for; NULL: the default list */
  size_t num_capture_sizes;   /* entries of capture_sizes */
  mlag_graph_mode graph_mode; /* MLAG_GRAPH_FULL_DECODE by default */
  int enable_prefix_caching;  /* non-zero: reuse KV blocks of shared prompt prefixes */
  uint64_t seed;              /* sampling seed of requests whose own seed is 0 */
  /* Added in 0.2 (read only when struct_size covers it): how projection
     weights are held: "auto" (as the checkpoint stores them: bf16 and fp8
     kept, anything else f32), "f32", "bf16" or "fp8" (e4m3 with 128 x 128
     block scales). NULL: "auto". Anything else is MLAG_INVALID_ARGUMENT. */
  const char* weight_dtype;
  /* Added in 0.3 (read only when struct_size covers it): the fraction of
     the memory the device has available that the engine's memory plan may
     use, in (0, 1]. 0: 0.9. The plan sizes the KV cache (kv_cache_bytes 0)
     and refuses, before allocating, a model that does not fit
     (MLAG_OUT_OF_MEMORY, naming the largest items and a fix). */
  double memory_utilization;
} mlag_engine_options;

/* Sampling of one request. Greedy when temperature <= 0. A request whose
 * parameters are out of range (a non-finite temperature, top_p outside
 * (0, 1], logprobs outside [0, vocab_size]) is refused with
 * MLAG_INVALID_ARGUMENT naming the field, as are prompt ids outside the
 * vocabulary and a prompt plus max_tokens beyond the engine's max_model_len. */
typedef struct mlag_sampling_params {
  size_t struct_size; /* sizeof(mlag_sampling_params) */
  float temperature;  /* finite; <= 0: greedy */
  int top_k;          /* <= 0: no top-k cut */
  float top_p;        /* in (0, 1]; 1: no top-p cut */
  uint64_t seed;      /* per-request RNG seed; 0: the engine's seed */
  int logprobs; /* top-K log-probabilities to keep per generated token, in [0, vocab]; 0: none */
} mlag_sampling_params;

typedef struct mlag_engine_stats {
  size_t struct_size;              /* sizeof(mlag_engine_stats) */
  int64_t steps;                   /* scheduling steps that ran a batch */
  int64_t eager_steps;             /* steps run eagerly (prefill, large or graphless batches) */
  int64_t graph_replays;           /* steps run as a graph replay, all sizes together */
  int64_t dummy_steps;             /* dummy runs (warm-up and capture included) */
  int num_graphs;                  /* captured graphs */
  double prefix_cache_hit_rate;    /* prompt tokens served from the prefix cache / prompt tokens */
  int64_t prefix_cache_hit_tokens; /* prompt tokens served from the prefix cache */
  int kv_blocks_total;             /* usable KV blocks */
  int kv_blocks_used;
  int kv_blocks_free;
  int kv_block_size; /* tokens per KV block */
  size_t kv_bytes_per_token;
  double capture_seconds; /* time of the last graph capture */
  int64_t preemptions;    /* requests evicted to free KV blocks (recomputed later) */
} mlag_engine_stats;

/* MLAG_VERSION_CODE of the library linked at run time. */
MLAG_API int mlag_version(void);

/* A static name for `status` ("MLAG_OK", ...); "MLAG_UNKNOWN_STATUS" when out of range. */
MLAG_API const char* mlag_status_string(mlag_status status);

/* The message of this thread's last call that returned mlag_status: "" after
 * a success. Valid until that thread's next such call. */
MLAG_API const char* mlag_last_error(void);

/* Fills `options` with the defaults: tiny-v3, device "auto", 256 MiB of KV,
 * 64 sequences, 512 batched tokens, blocks of 64, full-decode graphs, prefix
 * caching on, seed 0. */
MLAG_API mlag_status mlag_engine_options_default(mlag_engine_options* options);

/* Fills `params` with greedy sampling: temperature 0, no top-k/top-p cut, no logprobs. */
MLAG_API mlag_status mlag_sampling_params_default(mlag_sampling_params* params);

/* Opens the model, sizes the KV pool and captures the graphs; *out receives
 * the engine (NULL on failure). NOT_FOUND for an unknown model, UNAVAILABLE
 * when "cuda" was asked for and no device is usable. */
MLAG_API mlag_status mlag_engine_create(const mlag_engine_options* options, mlag_engine** out);

/* Frees the engine and every request in it. NULL is a no-op. */
MLAG_API mlag_status mlag_engine_destroy(mlag_engine* engine);

/* The model's vocabulary size and the engine's prompt + output limit in tokens. */
MLAG_API mlag_status mlag_get_model_limits(const mlag_engine* engine, int* out_vocab_size,
                                           int* out_max_model_len);

/* Queues a request of `prompt_len` tokens generating up to `max_tokens`;
 * stop_ids (may be NULL when num_stop_ids is 0) end it early; params NULL:
 * greedy. *out_request_id receives its id. INVALID_ARGUMENT rejects this
 * request alone (empty prompt, token outside the vocabulary, max_tokens < 1,
 * prompt_len + max_tokens > max_model_len, more KV than the pool holds). */
MLAG_API mlag_status mlag_add_request(mlag_engine* engine, const int32_t* prompt, size_t prompt_len,
                                      int max_tokens, const int32_t* stop_ids, size_t num_stop_ids,
                                      const mlag_sampling_params* params, int64_t* out_request_id);

/* Runs one scheduling step; *out_num_new_tokens (may be NULL) receives the
 * number of tokens generated in it, over all requests. */
MLAG_API mlag_status mlag_step(mlag_engine* engine, int* out_num_new_tokens);

/* *out = 1 while some request is waiting or running, else 0. */
MLAG_API mlag_status mlag_has_unfinished(const mlag_engine* engine, int* out);

/* The generated tokens of a request (prompt excluded): copies
 * min(capacity, n) of them to `tokens` (NULL when capacity is 0) and sets
 * *out_num_tokens = n, the full count. out_finished (1 when finished) and
 * out_reason may be NULL. NOT_FOUND for an unknown id. */
MLAG_API mlag_status mlag_get_output(mlag_engine* engine, int64_t request_id, int32_t* tokens,
                                     size_t capacity, size_t* out_num_tokens, int* out_finished,
                                     mlag_finish_reason* out_reason);

/* The top-K alternatives of generated token `token_index` of a request that
 * asked for K logprobs, most likely first: copies min(capacity, K) token ids
 * and natural-log probabilities (either array may be NULL when capacity is 0)
 * and sets *out_count = K. INVALID_ARGUMENT when the request asked for none or
 * token_index is not yet generated; NOT_FOUND for an unknown id. */
MLAG_API mlag_status mlag_get_logprobs(mlag_engine* engine, int64_t request_id, size_t token_index,
                                       int32_t* tokens, float* logprobs, size_t capacity,
                                       size_t* out_count);

/* Finishes a request with MLAG_FINISH_ABORT and frees its KV blocks; a no-op
 * for a finished request. NOT_FOUND for an unknown id. */
MLAG_API mlag_status mlag_abort(mlag_engine* engine, int64_t request_id);

/* Fills `stats` (whose struct_size the caller sets) with the engine's counters. */
MLAG_API mlag_status mlag_get_stats(const mlag_engine* engine, mlag_engine_stats* stats);

/* ---- Text, through the model's tokenizer.json ------------------------------
 * A checkpoint directory's own tokenizer.json (+ tokenizer_config.json), or
 * the built-in models' byte-level BPE. MLAG_UNAVAILABLE when the model has no
 * tokenizer.json; the first call loads it. */

/* The token ids of `text` (text_len bytes of UTF-8; INVALID_ARGUMENT
 * otherwise), with the bos token first when add_bos is nonzero and the
 * tokenizer has one. Copies min(capacity, n) ids to `tokens` (NULL when
 * capacity is 0) and sets *out_num_tokens = n: call with capacity 0 to size. */
MLAG_API mlag_status mlag_tokenize(const mlag_engine* engine, const char* text, size_t text_len,
                                   int add_bos, int32_t* tokens, size_t capacity,
                                   size_t* out_num_tokens);

/* The text of `tokens` (invalid UTF-8 replaced by U+FFFD; special tokens left
 * out when skip_special is nonzero). Writes min(capacity - 1, len) bytes and a
 * NUL to `text` when capacity > 0, and sets *out_len = len (NUL excluded). */
MLAG_API mlag_status mlag_detokenize(const mlag_engine* engine, const int32_t* tokens,
                                     size_t num_tokens, int skip_special, char* text,
                                     size_t capacity, size_t* out_len);

/* Incremental detokenization for streams: push each generated token, get the
 * text it completes (whole UTF-8 characters only; a character split across
 * tokens appears with its last byte). The concatenation of every push and the
 * finish equals mlag_detokenize of all the tokens. The text pointer stays
 * valid until the next call on this detokenizer. It refers to its engine,
 * which must outlive it. */
typedef struct mlag_detokenizer mlag_detokenizer;
MLAG_API mlag_status mlag_detokenizer_create(const mlag_engine* engine, int skip_special,
                                             mlag_detokenizer** out);
MLAG_API mlag_status mlag_detokenizer_push(mlag_detokenizer* detokenizer, int32_t token,
                                           const char** out_text, size_t* out_len);
/* What is still held back (an unfinished character, as U+FFFD); resets. */
MLAG_API mlag_status mlag_detokenizer_finish(mlag_detokenizer* detokenizer, const char** out_text,
                                             size_t* out_len);
MLAG_API mlag_status mlag_detokenizer_destroy(mlag_detokenizer* detokenizer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLAGRAPH_H_ */
