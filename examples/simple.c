/* simple.c: the whole mzcache cycle on the public C API alone (include/mzcache.h).
 *
 *   simple MODEL.gguf [PROMPT]
 *
 * Loads a model, decodes a prompt, gives back half of the memory as the OS would ask for it
 * (mz_evict: the policy decides what leaves and where), answers the next turn with
 * mz_restore_generate (evicted units come back front layers first while prefill runs), samples a
 * few tokens and prints what happened. Exits 0 on success, 1 with the library's message otherwise.
 * Built out of tree against an installed prefix, by pkg-config or by find_package(mzcache). */
#include <mzcache.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(int rc, const char* what) {
  if (rc != MZ_OK) fprintf(stderr, "simple: %s failed: %s (%s)\n", what, mz_status_str(rc), mz_last_error());
  return rc;
}

/* Tokenizes text into a malloc'd array (*n tokens); NULL on failure. */
static mz_token* tokenize(const mz_model* m, const char* text, bool add_special, int32_t* n) {
  int32_t need = 0;
  mz_tokenize(m, text, add_special, true, NULL, 0, &need); /* asks for the size */
  mz_token* t = malloc(sizeof(mz_token) * (size_t)(need > 0 ? need : 1));
  if (!t || check(mz_tokenize(m, text, add_special, true, t, need, n), "mz_tokenize") != MZ_OK) {
    free(t);
    return NULL;
  }
  return t;
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0) {
    fprintf(argc < 2 ? stderr : stdout, "usage: %s MODEL.gguf [PROMPT]\n", argv[0]);
    return argc < 2 ? 1 : 0;
  }
  const char* prompt = argc > 2 ? argv[2] : "Memory on a phone is shared with every other app.";
  printf("mzcache %s\n", mz_version());

  mz_model* model = NULL;
  mz_context* ctx = NULL;
  mz_sampler* smpl = NULL;
  mz_token *toks = NULL, *query = NULL;
  int rc = 1;
  if (check(mz_model_load(argv[1], NULL, &model), "mz_model_load") != MZ_OK) goto out;
  if (check(mz_context_new(model, NULL, &ctx), "mz_context_new") != MZ_OK) goto out;
  if (!(smpl = mz_sampler_new(NULL))) goto out;

  int32_t n = 0;
  if (!(toks = tokenize(model, prompt, true, &n))) goto out;
  if (check(mz_decode(ctx, toks, n, false), "mz_decode") != MZ_OK) goto out;
  mz_token t = mz_sampler_sample(smpl, ctx, 0);
  printf("prompt: %d tokens, first token %d\n", n, t);

  /* The OS asks for half of what the model holds: the policy picks the units and their tier. */
  struct mz_memory_report r;
  if (check(mz_get_memory_report(ctx, &r), "mz_get_memory_report") != MZ_OK) goto out;
  const uint64_t ask = r.in_memory / 2;
  uint64_t freed = 0;
  if (check(mz_evict(ctx, ask, NULL, &freed), "mz_evict") != MZ_OK) goto out;
  if (check(mz_get_memory_report(ctx, &r), "mz_get_memory_report") != MZ_OK) goto out;
  printf("asked for %.1f MiB, %.1f MiB given back; %.1f MiB still in memory\n", (double)ask / (1 << 20),
         (double)freed / (1 << 20), (double)r.in_memory / (1 << 20));

  /* The user comes back: the next turn restores front layers first while prefill runs. */
  int32_t nq = 0;
  if (!(query = tokenize(model, " And then?", false, &nq))) goto out;
  struct mz_restore_stats st;
  if (check(mz_restore_generate(ctx, query, nq, NULL, &st), "mz_restore_generate") != MZ_OK) goto out;
  printf("restore_generate: TTFT %.3f s, %d units restored, %.1f MiB from storage\n", st.ttft_s, st.units_restored,
         (double)st.bytes_from_storage / (1 << 20));

  printf("generated:");
  for (int i = 0; i < 8; i++) {
    t = mz_sampler_sample(smpl, ctx, 0);
    if (t < 0 || mz_token_is_eog(model, t)) break;
    char piece[64];
    mz_token_to_piece(model, t, piece, sizeof piece);
    printf(" %d", t);
    if (check(mz_decode(ctx, &t, 1, false), "mz_decode") != MZ_OK) goto out;
  }
  printf("\ncontext: %d tokens\n", mz_context_n_tokens(ctx));
  rc = 0;
out:
  free(toks);
  free(query);
  mz_sampler_free(smpl);
  mz_context_free(ctx);
  mz_model_free(model);
  return rc;
}
