/* Embedding mlagraph in a C program: one engine, two greedy requests, step
 * until both finish, print their tokens.
 *
 * Usage: embed [MODEL]   (MODEL: a built-in name or a checkpoint
 * directory; default tiny-v3). */
#include <mlagraph/mlagraph.h>
#include <stdio.h>

/* Prints the library's message (it names the failed function); 1 on failure. */
static int failed(mlag_status status) {
  if (status == MLAG_OK) return 0;
  fprintf(stderr, "error: %s (%s)\n", mlag_last_error(), mlag_status_string(status));
  return 1;
}

int main(int argc, char** argv) {
  const int32_t prompts[2][4] = {{1, 2, 3, 4}, {100, 200, 300, 400}};
  int64_t ids[2];
  int32_t tokens[16];
  mlag_engine_options options;
  mlag_engine* engine = NULL;
  int unfinished = 1;
  int i, rc = 1;
  size_t n, j;

  if (failed(mlag_engine_options_default(&options))) return 1;
  if (argc > 1) options.model = argv[1];
  if (failed(mlag_engine_create(&options, &engine))) return 1;

  for (i = 0; i < 2; ++i) {
    if (failed(mlag_add_request(engine, prompts[i], 4, 16, NULL, 0, NULL, &ids[i]))) {
      goto done;
    }
  }
  while (unfinished) {
    if (failed(mlag_step(engine, NULL))) goto done;
    if (failed(mlag_has_unfinished(engine, &unfinished))) goto done;
  }
  for (i = 0; i < 2; ++i) {
    if (failed(mlag_get_output(engine, ids[i], tokens, 16, &n, NULL, NULL))) {
      goto done;
    }
    printf("request %d:", i);
    for (j = 0; j < n; ++j) printf(" %d", (int)tokens[j]);
    printf("\n");
  }
  rc = 0;

done:
  if (failed(mlag_engine_destroy(engine))) rc = 1;
  return rc;
}
