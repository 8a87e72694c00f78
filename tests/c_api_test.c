/* The C API end to end, from C99: eight greedy requests on tiny-v3 through
 * mlag_* give the tokens the C++ engine gave (read from the file that
 * tests/c_api_expected.cc wrote, argv[1]) in both graph modes, and every
 * error path reachable from C returns the right code with a message.
 *
 * Usage: c_api_test EXPECTED_FILE. Prints "c_api_test: N passed, M failed";
 * exits non-zero when any check failed. */
/* First, so that this file proves the header compiles alone as C99. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagraph/mlagraph.h"

static int g_passed = 0;
static int g_failed = 0;

static void check(int ok, const char* what, int line) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    fprintf(stderr, "c_api_test.c:%d: FAILED: %s (last error: \"%s\")\n", line, what,
            mlag_last_error());
  }
}
#define CHECK(cond) check((cond) ? 1 : 0, #cond, __LINE__)

/* `got` must equal `want`; the last error must be "" after MLAG_OK and a
 * message otherwise. */
static void check_status(mlag_status got, mlag_status want, const char* call, int line) {
  const char* message = mlag_last_error();
  if (got == want && (want == MLAG_OK) == (message[0] == '\0')) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "c_api_test.c:%d: FAILED: %s returned %s, expected %s (last error: \"%s\")\n",
          line, call, mlag_status_string(got), mlag_status_string(want), message);
}
#define CHECK_STATUS(call, want) check_status((call), (want), #call, __LINE__)

/* The last error names `needle`. */
static void check_error_mentions(const char* needle, int line) {
  const char* message = mlag_last_error();
  if (strstr(message, needle) != NULL) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "c_api_test.c:%d: FAILED: last error \"%s\" does not mention \"%s\"\n", line,
          message, needle);
}
#define CHECK_ERROR_MENTIONS(needle) check_error_mentions((needle), __LINE__)

/* ---- The reference file ------------------------------------------------- */

#define MAX_REQUESTS 16
#define MAX_TOKENS 256

typedef struct reference_request {
  size_t prompt_len;
  int32_t prompt[MAX_TOKENS];
  size_t num_out;
  int32_t out[MAX_TOKENS];
} reference_request;

typedef struct reference {
  char model[256];
  char device[32];
  int block_size;
  int max_num_seqs;
  int max_num_batched_tokens;
  size_t kv_cache_bytes;
  int max_tokens;
  size_t num_requests;
  reference_request requests[MAX_REQUESTS];
} reference;

static int read_tokens(FILE* f, size_t* n, int32_t* tokens) {
  size_t i;
  if (fscanf(f, "%zu", n) != 1 || *n > MAX_TOKENS) return 0;
  for (i = 0; i < *n; ++i) {
    if (fscanf(f, "%d", &tokens[i]) != 1) return 0;
  }
  return 1;
}

/* Returns 1 on success. */
static int read_reference(const char* path, reference* ref) {
  FILE* f = fopen(path, "r");
  size_t i;
  int ok = 1;
  if (f == NULL) {
    perror(path);
    return 0;
  }
  memset(ref, 0, sizeof(*ref));
  ok = fscanf(f, " engine %255s %31s %d %d %d %zu", ref->model, ref->device, &ref->block_size,
              &ref->max_num_seqs, &ref->max_num_batched_tokens, &ref->kv_cache_bytes) == 6 &&
       fscanf(f, " max_tokens %d", &ref->max_tokens) == 1 &&
       fscanf(f, " requests %zu", &ref->num_requests) == 1 && ref->num_requests > 0 &&
       ref->num_requests <= MAX_REQUESTS;
  for (i = 0; ok && i < ref->num_requests; ++i) {
    reference_request* r = &ref->requests[i];
    ok = read_tokens(f, &r->prompt_len, r->prompt) && read_tokens(f, &r->num_out, r->out);
  }
  fclose(f);
  if (!ok) fprintf(stderr, "%s: malformed reference file\n", path);
  return ok;
}

static void options_from_reference(const reference* ref, mlag_graph_mode mode,
                                   mlag_engine_options* o) {
  mlag_engine_options_default(o);
  o->model = ref->model;
  o->device = ref->device;
  o->block_size = ref->block_size;
  o->max_num_seqs = ref->max_num_seqs;
  o->max_num_batched_tokens = ref->max_num_batched_tokens;
  o->kv_cache_bytes = ref->kv_cache_bytes;
  o->graph_mode = mode;
}

/* Steps until nothing is unfinished (at most 10000 steps); 1 on success. */
static int run_to_completion(mlag_engine* engine) {
  int unfinished = 1;
  int steps = 0;
  while (steps < 10000) {
    if (mlag_has_unfinished(engine, &unfinished) != MLAG_OK) return 0;
    if (!unfinished) return 1;
    if (mlag_step(engine, NULL) != MLAG_OK) return 0;
    ++steps;
  }
  return 0;
}

/* ---- Tests ---------------------------------------------------------------- */

static void test_version_and_status_strings(void) {
  int s;
  CHECK(mlag_version() == MLAG_VERSION_CODE);
  CHECK(MLAG_VERSION_CODE ==
        MLAG_VERSION_MAJOR * 10000 + MLAG_VERSION_MINOR * 100 + MLAG_VERSION_PATCH);
  CHECK(MLAG_OK == 0);
  for (s = 0; s < (int)MLAG_NUM_STATUS; ++s) {
    const char* name = mlag_status_string((mlag_status)s);
    int t;
    CHECK(name != NULL && strncmp(name, "MLAG_", 5) == 0);
    CHECK(strcmp(name, "MLAG_UNKNOWN_STATUS") != 0);
    for (t = 0; t < s; ++t) CHECK(strcmp(name, mlag_status_string((mlag_status)t)) != 0);
  }
  CHECK(strcmp(mlag_status_string(MLAG_OK), "MLAG_OK") == 0);
  CHECK(strcmp(mlag_status_string(MLAG_NOT_FOUND), "MLAG_NOT_FOUND") == 0);
  CHECK(strcmp(mlag_status_string(MLAG_NUM_STATUS), "MLAG_UNKNOWN_STATUS") == 0);
  CHECK(strcmp(mlag_status_string((mlag_status)1000), "MLAG_UNKNOWN_STATUS") == 0);
}

static void test_defaults(void) {
  mlag_engine_options o;
  mlag_sampling_params p;
  CHECK_STATUS(mlag_engine_options_default(NULL), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("NULL");
  CHECK_STATUS(mlag_sampling_params_default(NULL), MLAG_INVALID_ARGUMENT);
  memset(&o, 0xff, sizeof(o));
  CHECK_STATUS(mlag_engine_options_default(&o), MLAG_OK);
  CHECK(o.struct_size == sizeof(o));
  CHECK(o.model != NULL && strcmp(o.model, "tiny-v3") == 0);
  CHECK(o.device != NULL && strcmp(o.device, "auto") == 0);
  CHECK(o.kv_cache_bytes == 0 && o.max_num_seqs > 0 && o.max_num_batched_tokens > 0);
  CHECK(o.memory_utilization == 0.9);
  CHECK(o.block_size > 0 && o.max_model_len == 0);
  CHECK(o.capture_sizes == NULL && o.num_capture_sizes == 0);
  CHECK(o.graph_mode == MLAG_GRAPH_FULL_DECODE && o.enable_prefix_caching == 1 && o.seed == 0);
  CHECK(o.weight_dtype != NULL && strcmp(o.weight_dtype, "auto") == 0);
  memset(&p, 0xff, sizeof(p));
  CHECK_STATUS(mlag_sampling_params_default(&p), MLAG_OK);
  CHECK(p.struct_size == sizeof(p));
  CHECK(p.temperature == 0.0f && p.top_k == 0 && p.top_p == 1.0f && p.seed == 0 && p.logprobs == 0);
}

/* Creation failures that stop before the model is built. */
static void test_create_errors(const reference* ref) {
  mlag_engine_options o;
  mlag_engine* engine = (mlag_engine*)&o; /* must be reset to NULL on failure */
  const int sizes[] = {1, 2, 4};
  mlag_status s;

  CHECK_STATUS(mlag_engine_create(NULL, &engine), MLAG_INVALID_ARGUMENT);
  CHECK(engine == NULL);
  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  CHECK_STATUS(mlag_engine_create(&o, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("out");

  o.struct_size = sizeof(size_t);
  engine = (mlag_engine*)&o;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("struct_size");
  CHECK(engine == NULL);

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.model = NULL;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("model");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.model = "/nonexistent";
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_NOT_FOUND);
  CHECK_ERROR_MENTIONS("/nonexistent");
  CHECK(engine == NULL);

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.device = "tpu";
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("tpu");
  o.device = "cuda:x";
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("cuda:x");
  o.device = NULL;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("device");

  /* "cuda" without a usable device is UNAVAILABLE; with one it works. */
  options_from_reference(ref, MLAG_GRAPH_NONE, &o);
  o.device = "cuda";
  s = mlag_engine_create(&o, &engine);
  CHECK(s == MLAG_UNAVAILABLE || s == MLAG_OK);
  if (s == MLAG_OK) {
    CHECK(engine != NULL);
    CHECK_STATUS(mlag_engine_destroy(engine), MLAG_OK);
  } else {
    CHECK(engine == NULL);
    CHECK_ERROR_MENTIONS("cuda");
  }

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.graph_mode = (mlag_graph_mode)7;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("graph mode");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.capture_sizes = NULL;
  o.num_capture_sizes = 3;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("capture_sizes");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.capture_sizes = sizes;
  o.num_capture_sizes = 3;
  o.block_size = 0;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("block size");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.max_num_seqs = 0;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_num_seqs");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.kv_cache_bytes = 1;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("kv cache");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.memory_utilization = 1.5;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("memory utilization");
  /* A plan that cannot fit (a millionth of the memory) is refused before
     anything is allocated, naming the usable memory. */
  o.memory_utilization = 1e-6;
  o.kv_cache_bytes = 0;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_OUT_OF_MEMORY);
  CHECK_ERROR_MENTIONS("usable");

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.max_model_len = 1 << 20;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_model_len");
  o.max_model_len = -1;
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_model_len");
  CHECK(engine == NULL);

  options_from_reference(ref, MLAG_GRAPH_FULL_DECODE, &o);
  o.weight_dtype = "int4";
  CHECK_STATUS(mlag_engine_create(&o, &engine), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("weight dtype");
  CHECK(engine == NULL);

  CHECK_STATUS(mlag_engine_destroy(NULL), MLAG_OK);
}

/* Adds the reference requests, runs them, and checks their tokens against
 * the C++ engine's. */
static void run_reference_requests(mlag_engine* engine, const reference* ref, const char* label) {
  int64_t ids[MAX_REQUESTS];
  size_t i, j;
  int unfinished = 0;
  int new_tokens = -1;
  for (i = 0; i < ref->num_requests; ++i) {
    const reference_request* r = &ref->requests[i];
    ids[i] = -1;
    CHECK_STATUS(
        mlag_add_request(engine, r->prompt, r->prompt_len, ref->max_tokens, NULL, 0, NULL, &ids[i]),
        MLAG_OK);
    CHECK(ids[i] >= 0);
    for (j = 0; j < i; ++j) CHECK(ids[j] != ids[i]);
  }
  CHECK_STATUS(mlag_has_unfinished(engine, &unfinished), MLAG_OK);
  CHECK(unfinished == 1);
  /* Before any step: no tokens, not finished. */
  {
    size_t n = 99;
    int finished = 7;
    mlag_finish_reason reason = MLAG_FINISH_ABORT;
    CHECK_STATUS(mlag_get_output(engine, ids[0], NULL, 0, &n, &finished, &reason), MLAG_OK);
    CHECK(n == 0 && finished == 0 && reason == MLAG_FINISH_NONE);
  }
  CHECK_STATUS(mlag_step(engine, &new_tokens), MLAG_OK);
  CHECK(new_tokens >= 0 && new_tokens <= (int)ref->num_requests);
  CHECK(run_to_completion(engine));

  for (i = 0; i < ref->num_requests; ++i) {
    const reference_request* r = &ref->requests[i];
    int32_t tokens[MAX_TOKENS];
    size_t n = 0;
    int finished = 0;
    mlag_finish_reason reason = MLAG_FINISH_NONE;
    int same;
    CHECK_STATUS(mlag_get_output(engine, ids[i], tokens, MAX_TOKENS, &n, &finished, &reason),
                 MLAG_OK);
    same = n == r->num_out && memcmp(tokens, r->out, n * sizeof(int32_t)) == 0;
    CHECK(same);
    if (!same) {
      fprintf(stderr, "  %s request %zu: got", label, i);
      for (j = 0; j < n; ++j) fprintf(stderr, " %d", tokens[j]);
      fprintf(stderr, ", C++ engine:");
      for (j = 0; j < r->num_out; ++j) fprintf(stderr, " %d", r->out[j]);
      fprintf(stderr, "\n");
    }
    CHECK(finished == 1 && reason == MLAG_FINISH_LENGTH);
    CHECK(n == (size_t)ref->max_tokens);
  }

  /* Count query, then a truncated copy that writes exactly `capacity` tokens. */
  {
    int32_t buf[8];
    size_t n = 0;
    const int32_t poison = -12345;
    for (j = 0; j < 8; ++j) buf[j] = poison;
    CHECK_STATUS(mlag_get_output(engine, ids[1], NULL, 0, &n, NULL, NULL), MLAG_OK);
    CHECK(n == ref->requests[1].num_out);
    CHECK_STATUS(mlag_get_output(engine, ids[1], buf, 3, &n, NULL, NULL), MLAG_OK);
    CHECK(n == ref->requests[1].num_out);
    CHECK(memcmp(buf, ref->requests[1].out, 3 * sizeof(int32_t)) == 0);
    for (j = 3; j < 8; ++j) CHECK(buf[j] == poison);
  }
  CHECK_STATUS(mlag_has_unfinished(engine, &unfinished), MLAG_OK);
  CHECK(unfinished == 0);
  /* A step with nothing to do succeeds and generates nothing. */
  new_tokens = -1;
  CHECK_STATUS(mlag_step(engine, &new_tokens), MLAG_OK);
  CHECK(new_tokens == 0);
}

static void test_stats(const mlag_engine* engine, int graphs) {
  mlag_engine_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  CHECK_STATUS(mlag_get_stats(engine, &st), MLAG_OK);
  CHECK(st.struct_size == sizeof(st));
  CHECK(st.steps > 0);
  CHECK(st.kv_blocks_total > 0);
  CHECK(st.kv_blocks_used == 0); /* every request finished */
  CHECK(st.kv_blocks_used + st.kv_blocks_free == st.kv_blocks_total);
  CHECK(st.kv_block_size > 0 && st.kv_bytes_per_token > 0);
  CHECK(st.prefix_cache_hit_rate >= 0.0 && st.prefix_cache_hit_rate <= 1.0);
  CHECK(st.preemptions == 0);
  if (graphs) {
    CHECK(st.num_graphs > 0);
    CHECK(st.graph_replays > 0);
    CHECK(st.capture_seconds > 0.0);
  } else {
    CHECK(st.num_graphs == 0);
    CHECK(st.graph_replays == 0);
    CHECK(st.eager_steps >= st.steps);
  }
  CHECK_STATUS(mlag_get_stats(engine, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_stats(NULL, &st), MLAG_INVALID_ARGUMENT);
  st.struct_size = 4;
  CHECK_STATUS(mlag_get_stats(engine, &st), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("struct_size");
}

/* Every request-level error on a live engine; none of them queues anything. */
static void test_request_errors(mlag_engine* engine) {
  int vocab = 0, max_len = 0, unfinished = -1, n_new = 0;
  int64_t id = -1;
  int32_t prompt[512];
  int32_t tokens[4];
  float logprobs[4];
  size_t i, n = 0;
  mlag_sampling_params p;

  CHECK_STATUS(mlag_get_model_limits(engine, &vocab, &max_len), MLAG_OK);
  CHECK(vocab > 1 && max_len > 1 && max_len <= 512);
  CHECK_STATUS(mlag_get_model_limits(NULL, &vocab, &max_len), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_model_limits(engine, NULL, &max_len), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_model_limits(engine, &vocab, NULL), MLAG_INVALID_ARGUMENT);
  if (vocab <= 1 || max_len <= 1 || max_len > 512) return;
  for (i = 0; i < 512; ++i) prompt[i] = (int32_t)(i % (size_t)vocab);

  /* NULL engine, everywhere. */
  CHECK_STATUS(mlag_add_request(NULL, prompt, 3, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("engine");
  CHECK_STATUS(mlag_step(NULL, &n_new), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_has_unfinished(NULL, &unfinished), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_output(NULL, 0, NULL, 0, &n, NULL, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_logprobs(NULL, 0, 0, NULL, NULL, 0, &n), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_abort(NULL, 0), MLAG_INVALID_ARGUMENT);
  /* NULL out pointers. */
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, NULL, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("out_request_id");
  CHECK_STATUS(mlag_has_unfinished(engine, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_output(engine, 0, NULL, 0, NULL, NULL, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_output(engine, 0, NULL, 5, &n, NULL, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("capacity");
  CHECK_STATUS(mlag_get_logprobs(engine, 0, 0, NULL, NULL, 0, NULL), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_get_logprobs(engine, 0, 0, tokens, NULL, 4, &n), MLAG_INVALID_ARGUMENT);

  /* Bad prompts. */
  CHECK_STATUS(mlag_add_request(engine, NULL, 3, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("prompt");
  CHECK_STATUS(mlag_add_request(engine, NULL, 0, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("empty prompt");
  CHECK_STATUS(mlag_add_request(engine, prompt, 0, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  prompt[1] = vocab;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("vocabulary");
  prompt[1] = -1;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("vocabulary");
  prompt[1] = 1;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 0, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_tokens");
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, -5, NULL, 0, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_tokens");
  CHECK_STATUS(mlag_add_request(engine, prompt, (size_t)max_len, 1, NULL, 0, NULL, &id),
               MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_model_len");
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, max_len, NULL, 0, NULL, &id),
               MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("max_model_len");
  /* Bad stop ids and sampling parameters. */
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 2, NULL, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("stop_ids");
  {
    const int32_t stop = vocab + 3;
    CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, &stop, 1, NULL, &id),
                 MLAG_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("stop token");
  }
  mlag_sampling_params_default(&p);
  p.struct_size = 2;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, &p, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("struct_size");
  mlag_sampling_params_default(&p);
  p.top_p = 0.0f;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, &p, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("top_p");
  mlag_sampling_params_default(&p);
  p.top_p = 1.5f;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, &p, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("top_p");
  mlag_sampling_params_default(&p);
  p.temperature = INFINITY;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, &p, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("temperature");
  mlag_sampling_params_default(&p);
  p.logprobs = -1;
  CHECK_STATUS(mlag_add_request(engine, prompt, 3, 4, NULL, 0, &p, &id), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("logprobs");

  /* Unknown request ids. */
  CHECK_STATUS(mlag_get_output(engine, 987654, NULL, 0, &n, NULL, NULL), MLAG_NOT_FOUND);
  CHECK_ERROR_MENTIONS("987654");
  CHECK_STATUS(mlag_get_output(engine, -1, NULL, 0, &n, NULL, NULL), MLAG_NOT_FOUND);
  CHECK_STATUS(mlag_abort(engine, 987654), MLAG_NOT_FOUND);
  CHECK_ERROR_MENTIONS("987654");
  CHECK_STATUS(mlag_get_logprobs(engine, 987654, 0, tokens, logprobs, 4, &n), MLAG_NOT_FOUND);
  CHECK_ERROR_MENTIONS("987654");

  /* Nothing was queued. */
  CHECK_STATUS(mlag_has_unfinished(engine, &unfinished), MLAG_OK);
  CHECK(unfinished == 0);
}

/* Logprobs of a greedy request: K entries per token, sorted, <= 0, and the
 * top-1 is the generated token. */
static void test_logprobs(mlag_engine* engine, const reference* ref) {
  const reference_request* r = &ref->requests[3];
  const int k = 5;
  const int max_tokens = 4;
  mlag_sampling_params p;
  int64_t id = -1, plain = -1;
  int32_t out[MAX_TOKENS];
  size_t n = 0, i, j, count = 0;

  mlag_sampling_params_default(&p);
  p.logprobs = k;
  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, max_tokens, NULL, 0, &p, &id),
               MLAG_OK);
  CHECK_STATUS(
      mlag_add_request(engine, r->prompt, r->prompt_len, max_tokens, NULL, 0, NULL, &plain),
      MLAG_OK);
  /* Nothing generated yet: token 0 has no logprobs. */
  CHECK_STATUS(mlag_get_logprobs(engine, id, 0, NULL, NULL, 0, &count), MLAG_INVALID_ARGUMENT);
  CHECK(run_to_completion(engine));
  CHECK_STATUS(mlag_get_output(engine, id, out, MAX_TOKENS, &n, NULL, NULL), MLAG_OK);
  CHECK(n == (size_t)max_tokens);
  for (i = 0; i < n; ++i) {
    int32_t top_tokens[8];
    float top_logprobs[8];
    int sorted = 1, nonpositive = 1, distinct = 1;
    count = 0;
    CHECK_STATUS(mlag_get_logprobs(engine, id, i, NULL, NULL, 0, &count), MLAG_OK);
    CHECK(count == (size_t)k);
    for (j = 0; j < 8; ++j) {
      top_tokens[j] = -7;
      top_logprobs[j] = 1.0f;
    }
    CHECK_STATUS(mlag_get_logprobs(engine, id, i, top_tokens, top_logprobs, 8, &count), MLAG_OK);
    CHECK(count == (size_t)k);
    for (j = 0; j < (size_t)k; ++j) {
      size_t m;
      if (!(top_logprobs[j] <= 0.0f)) nonpositive = 0;
      if (j > 0 && !(top_logprobs[j] <= top_logprobs[j - 1])) sorted = 0;
      for (m = 0; m < j; ++m) {
        if (top_tokens[m] == top_tokens[j]) distinct = 0;
      }
    }
    CHECK(sorted);
    CHECK(nonpositive);
    CHECK(distinct);
    CHECK(top_tokens[0] == out[i]);
    CHECK(top_tokens[k] == -7 && top_logprobs[k] == 1.0f); /* nothing past K written */
    /* A smaller buffer gets the first entries. */
    {
      int32_t first = -1;
      float first_logprob = 1.0f;
      CHECK_STATUS(mlag_get_logprobs(engine, id, i, &first, &first_logprob, 1, &count), MLAG_OK);
      CHECK(count == (size_t)k && first == top_tokens[0] && first_logprob == top_logprobs[0]);
    }
  }
  CHECK_STATUS(mlag_get_logprobs(engine, id, n, NULL, NULL, 0, &count), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("token_index");
  CHECK_STATUS(mlag_get_logprobs(engine, plain, 0, NULL, NULL, 0, &count), MLAG_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("logprobs");
  /* Asking for logprobs does not change the greedy tokens. */
  {
    int32_t plain_out[MAX_TOKENS];
    size_t plain_n = 0;
    CHECK_STATUS(mlag_get_output(engine, plain, plain_out, MAX_TOKENS, &plain_n, NULL, NULL),
                 MLAG_OK);
    CHECK(plain_n == n && memcmp(plain_out, out, n * sizeof(int32_t)) == 0);
  }
}

/* Abort of a live request, and a stop id. */
static void test_abort_and_stop(mlag_engine* engine, const reference* ref) {
  const reference_request* r = &ref->requests[2];
  int64_t live = -1, other = -1, stopped = -1;
  int32_t out[MAX_TOKENS], full[MAX_TOKENS];
  size_t n = 0, full_n = 0, first;
  int finished = 0, unfinished = 1;
  mlag_finish_reason reason = MLAG_FINISH_NONE;
  mlag_engine_stats st;

  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, 20, NULL, 0, NULL, &live),
               MLAG_OK);
  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, 10, NULL, 0, NULL, &other),
               MLAG_OK);
  CHECK_STATUS(mlag_step(engine, NULL), MLAG_OK);
  CHECK_STATUS(mlag_step(engine, NULL), MLAG_OK);
  CHECK_STATUS(mlag_get_output(engine, live, out, MAX_TOKENS, &n, &finished, &reason), MLAG_OK);
  CHECK(finished == 0 && reason == MLAG_FINISH_NONE && n >= 1 && n < 20);
  CHECK_STATUS(mlag_abort(engine, live), MLAG_OK);
  CHECK_STATUS(mlag_get_output(engine, live, out, MAX_TOKENS, &n, &finished, &reason), MLAG_OK);
  CHECK(finished == 1 && reason == MLAG_FINISH_ABORT && n >= 1 && n < 20);
  /* Aborting a finished request is a no-op. */
  CHECK_STATUS(mlag_abort(engine, live), MLAG_OK);
  CHECK_STATUS(mlag_get_output(engine, live, NULL, 0, &n, &finished, &reason), MLAG_OK);
  CHECK(finished == 1 && reason == MLAG_FINISH_ABORT);
  CHECK_STATUS(mlag_has_unfinished(engine, &unfinished), MLAG_OK);
  CHECK(unfinished == 1); /* `other` still runs */
  CHECK(run_to_completion(engine));
  CHECK_STATUS(mlag_get_output(engine, other, full, MAX_TOKENS, &full_n, &finished, &reason),
               MLAG_OK);
  CHECK(full_n == 10 && finished == 1 && reason == MLAG_FINISH_LENGTH);
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  CHECK_STATUS(mlag_get_stats(engine, &st), MLAG_OK);
  CHECK(st.kv_blocks_used == 0);
  if (full_n != 10) return;

  /* Stopping at the third token's id ends the request at its first occurrence. */
  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, 10, &full[2], 1, NULL, &stopped),
               MLAG_OK);
  CHECK(run_to_completion(engine));
  CHECK_STATUS(mlag_get_output(engine, stopped, out, MAX_TOKENS, &n, &finished, &reason), MLAG_OK);
  for (first = 0; full[first] != full[2]; ++first) {
  }
  CHECK(finished == 1 && reason == MLAG_FINISH_STOP);
  CHECK(n == first + 1 && memcmp(out, full, n * sizeof(int32_t)) == 0);
}

/* Two sampled requests with the same seed, in the same steps, draw the same
 * tokens; the engine seed stands in for a request seed of 0. */
static void test_seeded_sampling(mlag_engine* engine, const reference* ref) {
  const reference_request* r = &ref->requests[5];
  mlag_sampling_params p;
  int64_t a = -1, b = -1;
  int32_t out_a[MAX_TOKENS], out_b[MAX_TOKENS];
  size_t na = 0, nb = 0;
  mlag_sampling_params_default(&p);
  p.temperature = 0.9f;
  p.top_k = 50;
  p.top_p = 0.95f;
  p.seed = 42;
  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, 8, NULL, 0, &p, &a), MLAG_OK);
  CHECK_STATUS(mlag_add_request(engine, r->prompt, r->prompt_len, 8, NULL, 0, &p, &b), MLAG_OK);
  CHECK(run_to_completion(engine));
  CHECK_STATUS(mlag_get_output(engine, a, out_a, MAX_TOKENS, &na, NULL, NULL), MLAG_OK);
  CHECK_STATUS(mlag_get_output(engine, b, out_b, MAX_TOKENS, &nb, NULL, NULL), MLAG_OK);
  CHECK(na == 8 && nb == 8 && memcmp(out_a, out_b, na * sizeof(int32_t)) == 0);
}

/* Text through the model's tokenizer: tokenize, detokenize (sizing with
 * capacity 0, truncation with a NUL), and the incremental detokenizer giving
 * the same text a piece at a time; NULL arguments are errors. */
static void test_text(mlag_engine* engine) {
  const char* text = "Hello, world! \xE4\xB8\xAD\xE6\x96\x87 text";
  int32_t ids[64];
  size_t n = 0, m = 0, len = 0, i;
  char out[128], small[6];
  mlag_detokenizer* d = NULL;
  const char* piece = NULL;
  char streamed[128] = "";
  CHECK_STATUS(mlag_tokenize(engine, text, strlen(text), 1, NULL, 0, &n), MLAG_OK);
  CHECK(n > 2 && n < 64);
  CHECK_STATUS(mlag_tokenize(engine, text, strlen(text), 1, ids, 64, &m), MLAG_OK);
  CHECK(m == n);
  CHECK_STATUS(mlag_detokenize(engine, ids, n, 1, out, sizeof(out), &len), MLAG_OK);
  CHECK(len == strlen(text) && strcmp(out, text) == 0);
  CHECK_STATUS(mlag_detokenize(engine, ids, n, 1, small, sizeof(small), &len), MLAG_OK);
  CHECK(len == strlen(text) && strlen(small) == sizeof(small) - 1);
  CHECK_STATUS(mlag_detokenizer_create(engine, 1, &d), MLAG_OK);
  for (i = 0; d != NULL && i < n; ++i) {
    CHECK_STATUS(mlag_detokenizer_push(d, ids[i], &piece, &len), MLAG_OK);
    CHECK(strlen(piece) == len && strlen(streamed) + len < sizeof(streamed));
    strcat(streamed, piece);
  }
  if (d != NULL) {
    CHECK_STATUS(mlag_detokenizer_finish(d, &piece, &len), MLAG_OK);
    CHECK(len == 0);
  }
  CHECK(strcmp(streamed, text) == 0);
  CHECK_STATUS(mlag_detokenizer_destroy(d), MLAG_OK);
  CHECK_STATUS(mlag_tokenize(engine, "\xC3\x28", 2, 0, ids, 64, &n), MLAG_INVALID_ARGUMENT);
  check_error_mentions("UTF-8", __LINE__);
  CHECK_STATUS(mlag_tokenize(engine, NULL, 3, 0, ids, 64, &n), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_detokenize(engine, ids, 1, 0, NULL, 4, &len), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_detokenizer_push(NULL, 1, &piece, &len), MLAG_INVALID_ARGUMENT);
  CHECK_STATUS(mlag_detokenizer_destroy(NULL), MLAG_OK);
}

int main(int argc, char** argv) {
  reference ref;
  mlag_engine_options o;
  mlag_engine* graphs = NULL;
  mlag_engine* eager = NULL;

  if (argc != 2) {
    fprintf(stderr, "usage: %s EXPECTED_FILE (written by c_api_expected)\n", argv[0]);
    return 2;
  }
  if (!read_reference(argv[1], &ref)) return 1;

  test_version_and_status_strings();
  test_defaults();
  test_create_errors(&ref);

  options_from_reference(&ref, MLAG_GRAPH_FULL_DECODE, &o);
  CHECK_STATUS(mlag_engine_create(&o, &graphs), MLAG_OK);
  options_from_reference(&ref, MLAG_GRAPH_NONE, &o);
  CHECK_STATUS(mlag_engine_create(&o, &eager), MLAG_OK);
  if (graphs != NULL && eager != NULL) {
    run_reference_requests(graphs, &ref, "full-decode");
    run_reference_requests(eager, &ref, "none");
    test_stats(graphs, 1);
    test_stats(eager, 0);
    test_request_errors(graphs);
    test_logprobs(graphs, &ref);
    test_abort_and_stop(graphs, &ref);
    test_seeded_sampling(graphs, &ref);
    test_text(graphs);
  }
  CHECK_STATUS(mlag_engine_destroy(graphs), MLAG_OK);
  CHECK_STATUS(mlag_engine_destroy(eager), MLAG_OK);

  printf("c_api_test: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
