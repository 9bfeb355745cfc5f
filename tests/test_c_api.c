/*
 * The public header compiles as C (C11, -Wall -Wextra -Werror: see tests/CMakeLists.txt) and the C API
 * works end to end from C: defaults, status names, an I/O error with its message, then load ->
 * tokenize -> decode -> greedy sampling of 4 tokens on the tiny-qwen3 model. Exits non-zero on the
 * first failure, printing what failed and mz_last_error().
 *
 * Model path, in this order: argv[1]; $MZ_TEST_MODEL_DIR_OVERRIDE/tiny-qwen3-q8_0.gguf (the shared
 * model folder the sanitizer runs use, as in tests/test_util.cpp); $MZ_TEST_MODEL (set by ctest).
 * ctest makes sure the file exists first (fixture test c_api_model_setup).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp, rmdir (check_profile) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mzcache.h"

#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                             \
      fprintf(stderr, " (mz_last_error: \"%s\")\n", mz_last_error());           \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

static int check_defaults(void) {
  struct mz_model_params mp = mz_model_default_params();
  CHECK(mp.direct_io && mp.io_threads == 2, "model defaults: direct_io %d io_threads %d", (int)mp.direct_io,
        (int)mp.io_threads);
  CHECK(mp.weight_memory == MZ_WEIGHTS_PAGE_CACHE, "model defaults: weight_memory %d", (int)mp.weight_memory);
  struct mz_context_params cp = mz_context_default_params();
  CHECK(cp.n_ctx == 8192 && cp.kv_chunk_tokens == 256 && cp.n_threads == 2 && cp.n_ubatch == 512,
        "context defaults: n_ctx %u chunk %u threads %d ubatch %u", (unsigned)cp.n_ctx, (unsigned)cp.kv_chunk_tokens,
        (int)cp.n_threads, (unsigned)cp.n_ubatch);
  struct mz_sampler_params sp = mz_sampler_default_params();
  CHECK(sp.temperature <= 0.0f && sp.top_k == 40 && fabsf(sp.top_p - 0.95f) < 1e-6f && sp.seed == 42,
        "sampler defaults: temperature %g top_k %d top_p %g seed %u", (double)sp.temperature, (int)sp.top_k,
        (double)sp.top_p, (unsigned)sp.seed);
  const char* s = mz_status_str(MZ_ERR_CORRUPT);
  CHECK(s != NULL && strstr(s, "corrupt") != NULL, "mz_status_str(MZ_ERR_CORRUPT) = \"%s\"", s ? s : "(null)");
  CHECK(mz_status_str(MZ_OK) != NULL && strcmp(mz_status_str(MZ_OK), s) != 0, "status names not distinct");
  CHECK(mz_status_str(12345) != NULL, "mz_status_str of an unknown code must not be NULL");
  return 0;
}

static int check_missing_file(void) {
  const char* path = "/nonexistent-mzcache-dir/model.gguf";
  mz_model* m = (mz_model*)&m; /* non-NULL garbage: must be reset to NULL on failure */
  int rc = mz_model_load(path, NULL, &m);
  CHECK(rc == MZ_ERR_IO, "loading a missing file returned %d (%s), want MZ_ERR_IO", rc, mz_status_str(rc));
  CHECK(m == NULL, "*out not NULL after a failed load");
  CHECK(mz_last_error()[0] != '\0', "no error message after a failed load");
  CHECK(strstr(mz_last_error(), path) != NULL, "the error message does not name the file");
  CHECK(mz_model_load(NULL, NULL, &m) == MZ_ERR_INVALID_ARG, "NULL path accepted");
  return 0;
}

/* Params structs carry their size: the defaults set it, and a struct not made by them (zeroed) or
 * of a size this library does not know is refused with MZ_ERR_INVALID_ARG and a message naming
 * the struct, changing nothing. */
static int check_struct_size(mz_model* model, const char* path, const mz_token* toks, int32_t n) {
  CHECK(mz_model_default_params().struct_size == sizeof(struct mz_model_params), "model params struct_size");
  CHECK(mz_context_default_params().struct_size == sizeof(struct mz_context_params), "context params struct_size");
  CHECK(mz_restore_default_params().struct_size == sizeof(struct mz_restore_params), "restore params struct_size");
  CHECK(mz_sampler_default_params().struct_size == sizeof(struct mz_sampler_params), "sampler params struct_size");
  CHECK(mz_pressure_default_params().struct_size == sizeof(struct mz_pressure_params), "pressure params struct_size");

  struct mz_model_params mp;
  memset(&mp, 0, sizeof mp);
  mz_model* m = (mz_model*)&m;
  CHECK(mz_model_load(path, &mp, &m) == MZ_ERR_INVALID_ARG && m == NULL, "zeroed model params accepted");
  CHECK(strstr(mz_last_error(), "mz_model_params") && strstr(mz_last_error(), "struct_size"),
        "the message does not name the struct and its size");
  mp = mz_model_default_params();
  mp.struct_size += 4; /* a newer header's struct */
  CHECK(mz_model_load(path, &mp, &m) == MZ_ERR_INVALID_ARG, "a larger struct_size accepted");
  mp.struct_size -= 8;
  CHECK(mz_model_load(path, &mp, &m) == MZ_ERR_INVALID_ARG, "a struct_size below the first version's accepted");

  struct mz_context_params cp;
  memset(&cp, 0, sizeof cp);
  mz_context* ctx = (mz_context*)&ctx;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_ERR_INVALID_ARG && ctx == NULL, "zeroed context params accepted");
  CHECK(strstr(mz_last_error(), "mz_context_params") != NULL, "context: %s", mz_last_error());
  cp = mz_context_default_params();
  cp.n_ctx = 256;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_OK, "mz_context_new");
  { /* the caller's fields are the ones used, not the defaults: n_ctx 256 holds no 257 tokens */
    static mz_token many[257];
    for (int i = 0; i < 257; ++i) many[i] = toks[i % n];
    CHECK(mz_decode(ctx, many, 257, false) == MZ_ERR_CONTEXT_FULL, "n_ctx 256 held 257 tokens: %s", mz_last_error());
    CHECK(mz_context_n_tokens(ctx) == 0, "a refused decode left %d tokens", (int)mz_context_n_tokens(ctx));
  }
  CHECK(mz_decode(ctx, toks, n, false) == MZ_OK, "mz_decode");

  struct mz_restore_params rp;
  memset(&rp, 0, sizeof rp);
  mz_token t = toks[0];
  CHECK(mz_restore_generate(ctx, &t, 1, &rp, NULL) == MZ_ERR_INVALID_ARG, "zeroed restore params accepted");
  CHECK(strstr(mz_last_error(), "mz_restore_params") != NULL, "restore: %s", mz_last_error());
  CHECK(mz_context_n_tokens(ctx) == n, "a refused restore_generate changed the conversation (%d tokens)",
        (int)mz_context_n_tokens(ctx));
  rp = mz_restore_default_params();
  rp.overlap = 99; /* copied, then refused */
  CHECK(mz_restore_generate(ctx, &t, 1, &rp, NULL) == MZ_ERR_INVALID_ARG, "overlap 99 accepted");
  rp = mz_restore_default_params();
  CHECK(mz_restore_generate(ctx, &t, 1, &rp, NULL) == MZ_OK && mz_context_n_tokens(ctx) == n + 1,
        "restore_generate with default params: %s", mz_last_error());

  struct mz_sampler_params sp;
  memset(&sp, 0, sizeof sp);
  CHECK(mz_sampler_new(&sp) == NULL, "zeroed sampler params accepted");
  CHECK(strstr(mz_last_error(), "mz_sampler_params") != NULL, "sampler: %s", mz_last_error());
  mz_sampler* s = mz_sampler_new(NULL); /* NULL: the defaults */
  CHECK(s != NULL, "mz_sampler_new(NULL): %s", mz_last_error());
  mz_sampler_free(s);

  struct mz_pressure_params pp;
  memset(&pp, 0, sizeof pp);
  CHECK(mz_pressure_watch_start(ctx, &pp) == MZ_ERR_INVALID_ARG, "zeroed pressure params accepted");
  CHECK(strstr(mz_last_error(), "mz_pressure_params") != NULL, "pressure: %s", mz_last_error());
  mz_context_free(ctx);
  return 0;
}

static int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Memory pressure from C: defaults, argument checks, Android trim levels (mapping: 20 does nothing,
 * 5 gives back one step, 80 everything down to the floor: weights dropped), the conversation going
 * on afterwards, and a watcher started / refused / stopped. */
static int check_pressure(mz_model* model, const mz_token* toks, int32_t n) {
  struct mz_pressure_params pp = mz_pressure_default_params();
  CHECK(pp.source != NULL && strcmp(pp.source, "auto") == 0 && pp.cgroup_dir == NULL, "pressure defaults: source");
  CHECK(fabsf(pp.step_points - 0.25f) < 1e-6f && fabsf(pp.escalation - 1.5f) < 1e-6f && pp.floor_points == 0.0f &&
            pp.hysteresis_ms == 1000 && !pp.restore_in_background && pp.psi_stall_us == 150000 &&
            pp.psi_window_us == 1000000 && pp.poll_ms == 100,
        "pressure defaults: step %g escalation %g", (double)pp.step_points, (double)pp.escalation);
  CHECK(mz_on_trim_memory(NULL, MZ_TRIM_MEMORY_COMPLETE) == MZ_ERR_INVALID_ARG, "NULL context accepted");
  CHECK(mz_pressure_watch_start(NULL, NULL) == MZ_ERR_INVALID_ARG, "watch on NULL context accepted");

  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  int rc = mz_context_new(model, &cp, &ctx);
  CHECK(rc == MZ_OK, "mz_context_new = %d", rc);
  rc = mz_decode(ctx, toks, n, false);
  CHECK(rc == MZ_OK, "mz_decode = %d", rc);
  CHECK(mz_on_trim_memory(ctx, -1) == MZ_ERR_INVALID_ARG, "negative level accepted");

  struct mz_pressure_stats st;
  CHECK(mz_on_trim_memory(ctx, MZ_TRIM_MEMORY_UI_HIDDEN) == MZ_OK, "UI_HIDDEN: %s", mz_last_error());
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == 0 && !st.watching, "UI_HIDDEN acted: %u events",
        (unsigned)st.events);
  rc = mz_on_trim_memory(ctx, MZ_TRIM_MEMORY_RUNNING_MODERATE);
  CHECK(rc == MZ_OK, "RUNNING_MODERATE = %d", rc);
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == 1 && st.last_level == 1,
        "after RUNNING_MODERATE: events %u level %d", (unsigned)st.events, (int)st.last_level);
  rc = mz_on_trim_memory(ctx, MZ_TRIM_MEMORY_COMPLETE);
  CHECK(rc == MZ_OK, "COMPLETE = %d", rc);
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == 2 && st.last_level == 3 && st.pending == 0,
        "after COMPLETE: events %u level %d pending %d", (unsigned)st.events, (int)st.last_level, (int)st.pending);
  struct mz_memory_report r;
  CHECK(mz_get_memory_report(ctx, &r) == MZ_OK, "report");
  {
    uint64_t counted = 0, in_ram = 0;
    CHECK(mz_kernel_residency(ctx, &counted, &in_ram) == MZ_OK, "kernel residency: %s", mz_last_error());
    CHECK(counted > 0 && counted <= r.weights_resident + r.kv_resident && in_ram <= counted,
          "kernel residency: counted %llu, in RAM %llu, report %llu", (unsigned long long)counted,
          (unsigned long long)in_ram, (unsigned long long)(r.weights_resident + r.kv_resident));
    CHECK(mz_kernel_residency(NULL, &counted, &in_ram) == MZ_ERR_INVALID_ARG && counted == 0, "NULL ctx");
    /* Unit by unit (0.9): sized with cap 0, then filled; the same units the memory report counts. */
    struct mz_residency_summary sum;
    CHECK(mz_kernel_residency(ctx, &counted, &in_ram) == MZ_OK, "kernel residency again");
    const int32_t nu = mz_residency_report(ctx, true, &sum, NULL, 0);
    CHECK(nu > 0 && sum.n_units == nu, "residency report: %d units (summary %d)", (int)nu, (int)sum.n_units);
    CHECK(sum.weights_file_counted + sum.weights_anon_counted + sum.kv_counted == counted,
          "residency summary counts %llu, mz_kernel_residency %llu",
          (unsigned long long)(sum.weights_file_counted + sum.weights_anon_counted + sum.kv_counted),
          (unsigned long long)counted);
    struct mz_unit_residency* units = (struct mz_unit_residency*)calloc((size_t)nu, sizeof *units);
    CHECK(units != NULL, "calloc");
    CHECK(mz_residency_report(ctx, false, NULL, units, nu) == nu, "second call");
    int32_t dropped = 0;
    for (int32_t i = 0; i < nu; ++i) {
      const struct mz_unit_residency* u = &units[i];
      if (u->kind == MZ_UNIT_WEIGHTS && u->state == MZ_STATE_WEIGHTS_DROPPED) {
        ++dropped;
        CHECK(u->backing == MZ_BACKING_NONE && u->held_bytes == 0 && u->counted_bytes == 0, "dropped unit %d", (int)u->layer);
      }
      CHECK(u->in_ram_bytes <= u->counted_bytes, "unit %d: in RAM %llu of %llu", (int)i,
            (unsigned long long)u->in_ram_bytes, (unsigned long long)u->counted_bytes);
    }
    CHECK(dropped == r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED], "dropped %d, report %d", (int)dropped,
          (int)r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED]);
    free(units);
    CHECK(mz_residency_report(ctx, true, NULL, NULL, 1) == MZ_ERR_INVALID_ARG, "NULL units with cap 1");
    CHECK(mz_residency_report(ctx, true, NULL, NULL, -1) == MZ_ERR_INVALID_ARG, "cap -1");
    CHECK(mz_residency_report(NULL, true, &sum, NULL, 0) == MZ_ERR_INVALID_ARG && sum.n_units == 0, "NULL ctx");
  }
  CHECK(r.weights_dropped > 0 && r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED] > 0,
        "COMPLETE left every weight unit resident (dropped %llu)", (unsigned long long)r.weights_dropped);
  /* The conversation goes on (units come back on demand). */
  mz_token t = toks[0];
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode after trimming: %s", mz_last_error());
  CHECK(mz_context_n_tokens(ctx) == n + 1, "n_tokens %d", (int)mz_context_n_tokens(ctx));

  /* Threads change between calls (0.7); bad requests are refused; the conversation goes on. */
  {
    const int32_t bad_cpu = 4000, cpu0 = 0;
    CHECK(mz_context_set_threads(NULL, 1, NULL, 0) == MZ_ERR_INVALID_ARG, "NULL ctx");
    CHECK(mz_context_set_threads(ctx, 0, NULL, 0) == MZ_ERR_INVALID_ARG, "0 threads accepted");
    CHECK(mz_context_set_threads(ctx, 1, &bad_cpu, 1) == MZ_ERR_INVALID_ARG, "CPU 4000 accepted");
    CHECK(mz_context_set_threads(ctx, 1, &cpu0, 0) == MZ_ERR_INVALID_ARG, "cpus with n_cpus 0 accepted");
    CHECK(mz_context_set_threads(ctx, 2, &cpu0, 1) == MZ_ERR_INVALID_ARG, "2 threads on 1 CPU accepted");
    CHECK(mz_context_set_threads(ctx, 1, NULL, 0) == MZ_OK, "set_threads(1): %s", mz_last_error());
    CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode on 1 thread: %s", mz_last_error());
    CHECK(mz_context_set_threads(ctx, 2, NULL, 0) == MZ_OK, "set_threads(2): %s", mz_last_error());
    CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode on 2 threads: %s", mz_last_error());
    CHECK(mz_context_n_tokens(ctx) == n + 3, "n_tokens %d", (int)mz_context_n_tokens(ctx));
  }

  /* A watcher: refused for a source this machine lacks, bad values refused, started, stopped. */
  struct mz_pressure_params bad = mz_pressure_default_params();
  bad.source = "cgroup-v1";
  bad.cgroup_dir = "/nonexistent-mzcache-cgroup";
  rc = mz_pressure_watch_start(ctx, &bad);
  CHECK(rc == MZ_ERR_UNSUPPORTED, "cgroup-v1 on a missing dir = %d (%s)", rc, mz_status_str(rc));
  CHECK(strstr(mz_last_error(), "nonexistent-mzcache-cgroup") != NULL, "the error does not name the directory");
  bad = mz_pressure_default_params();
  bad.step_points = 0.0f;
  CHECK(mz_pressure_watch_start(ctx, &bad) == MZ_ERR_INVALID_ARG, "step_points 0 accepted");
  bad = mz_pressure_default_params();
  bad.source = "bogus";
  CHECK(mz_pressure_watch_start(ctx, &bad) == MZ_ERR_INVALID_ARG, "unknown source accepted");
  CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop without a watcher");
  rc = mz_pressure_watch_start(ctx, NULL);
  CHECK(rc == MZ_OK, "mz_pressure_watch_start(auto) = %d (%s)", rc, mz_status_str(rc));
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.watching && st.source[0] != '\0', "watcher not reported");
  printf("pressure watcher: %s\n", st.source);
  CHECK(mz_pressure_watch_start(ctx, NULL) == MZ_ERR_BUSY, "second watcher accepted");
  /* Trim events go through the watcher's policy while it runs. */
  CHECK(mz_on_trim_memory(ctx, MZ_TRIM_MEMORY_BACKGROUND) == MZ_OK, "BACKGROUND with a watcher: %s", mz_last_error());
  CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop");
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && !st.watching && st.source[0] == '\0', "still watching");
  CHECK(st.events >= 3 && st.last_level >= 2, "events %u level %d", (unsigned)st.events, (int)st.last_level);
  /* A watcher left running is stopped by mz_context_free. */
  CHECK(mz_pressure_watch_start(ctx, NULL) == MZ_OK, "restart: %s", mz_last_error());
  mz_context_free(ctx);
  return 0;
}

static int run_model(const char* path) {
  mz_model* model = NULL;
  int rc = mz_model_load(path, NULL, &model);
  CHECK(rc == MZ_OK && model != NULL, "mz_model_load(%s) = %d (%s)", path, rc, mz_status_str(rc));

  struct mz_model_info info;
  rc = mz_model_get_info(model, &info);
  CHECK(rc == MZ_OK, "mz_model_get_info = %d", rc);
  CHECK(mz_last_error()[0] == '\0', "mz_last_error not cleared by a successful call");
  CHECK(strcmp(info.arch, "qwen3") == 0 && info.n_layer == 4 && info.n_vocab > 0, "info: arch %s n_layer %d n_vocab %d",
        info.arch, (int)info.n_layer, (int)info.n_vocab);
  CHECK(info.weight_bytes > 0 && info.kv_bytes_per_token == 2ull * info.n_layer * info.n_head_kv * info.head_dim * 2,
        "info: weight_bytes %llu kv_bytes_per_token %llu", (unsigned long long)info.weight_bytes,
        (unsigned long long)info.kv_bytes_per_token);

  /* Size query first (cap 0), then the real call. */
  int32_t n = 0;
  rc = mz_tokenize(model, "Hello world", false, false, NULL, 0, &n);
  CHECK(rc == MZ_ERR_INVALID_ARG && n > 0, "size query: rc %d n %d", rc, (int)n);
  mz_token toks[64 + 4];
  CHECK(n <= 64, "\"Hello world\" took %d tokens", (int)n);
  int32_t n2 = 0;
  rc = mz_tokenize(model, "Hello world", false, false, toks, 64, &n2);
  CHECK(rc == MZ_OK && n2 == n, "mz_tokenize = %d, n %d vs %d", rc, (int)n2, (int)n);
  char piece[64];
  printf("prompt tokens:");
  for (int i = 0; i < n; ++i) {
    CHECK(toks[i] >= 0 && toks[i] < info.n_vocab, "token %d out of range", (int)toks[i]);
    CHECK(mz_token_to_piece(model, toks[i], piece, sizeof piece) >= 0, "no piece for token %d", (int)toks[i]);
    printf(" %d '%s'", (int)toks[i], piece);
  }
  printf("\n");

  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  rc = mz_context_new(model, &cp, &ctx);
  CHECK(rc == MZ_OK && ctx != NULL, "mz_context_new = %d", rc);
  CHECK(mz_decode(ctx, toks, 0, false) == MZ_ERR_INVALID_ARG, "decoding 0 tokens accepted");
  rc = mz_decode(ctx, toks, n, false);
  CHECK(rc == MZ_OK, "mz_decode(prompt) = %d (%s)", rc, mz_status_str(rc));
  CHECK(mz_context_n_tokens(ctx) == n, "n_tokens %d after the prompt, want %d", (int)mz_context_n_tokens(ctx), (int)n);
  CHECK(mz_get_logits(ctx, 1) == NULL, "logits row 1 exists without all_logits");

  /* The same prompt on the model held in anonymous memory: the same logits, bit for bit; a bad
   * weight_memory is refused. */
  {
    struct mz_model_params mp = mz_model_default_params();
    mz_model* bad = NULL;
    mp.weight_memory = 7;
    CHECK(mz_model_load(path, &mp, &bad) == MZ_ERR_INVALID_ARG && bad == NULL, "weight_memory 7 accepted");
    mp.weight_memory = MZ_WEIGHTS_ANONYMOUS;
    mz_model* anon = NULL;
    rc = mz_model_load(path, &mp, &anon);
    CHECK(rc == MZ_OK, "mz_model_load(anonymous) = %d (%s)", rc, mz_last_error());
    mz_context* c2 = NULL;
    CHECK(mz_context_new(anon, &cp, &c2) == MZ_OK, "mz_context_new(anonymous)");
    CHECK(mz_decode(c2, toks, n, false) == MZ_OK, "mz_decode(anonymous): %s", mz_last_error());
    CHECK(memcmp(mz_get_logits(c2, 0), mz_get_logits(ctx, 0), sizeof(float) * (size_t)info.n_vocab) == 0,
          "logits differ between page-cache and anonymous weights");
    mz_context_free(c2);
    mz_model_free(anon);
  }

  struct mz_sampler_params sp = mz_sampler_default_params(); /* greedy by default */
  mz_sampler* s = mz_sampler_new(&sp);
  CHECK(s != NULL, "mz_sampler_new failed");
  printf("greedy:");
  for (int step = 0; step < 4; ++step) {
    const float* logits = mz_get_logits(ctx, 0);
    CHECK(logits != NULL, "no logits at step %d", step);
    for (int v = 0; v < info.n_vocab; ++v) CHECK(isfinite(logits[v]), "logit %d not finite at step %d", v, step);
    mz_token t = mz_sampler_sample(s, ctx, 0);
    CHECK(t >= 0 && t < info.n_vocab, "sampled %d at step %d", (int)t, step);
    CHECK(t == argmax(logits, info.n_vocab), "greedy sample %d is not the argmax %d", (int)t,
          argmax(logits, info.n_vocab));
    mz_token_to_piece(model, t, piece, sizeof piece);
    printf(" %d '%s'", (int)t, piece);
    rc = mz_decode(ctx, &t, 1, false);
    CHECK(rc == MZ_OK, "mz_decode(token %d) = %d (%s)", (int)t, rc, mz_status_str(rc));
  }
  printf("\n");
  CHECK(mz_context_n_tokens(ctx) == n + 4, "n_tokens %d, want %d", (int)mz_context_n_tokens(ctx), (int)n + 4);
  CHECK(mz_context_truncate(ctx, 0) == MZ_OK && mz_context_n_tokens(ctx) == 0, "truncate to 0 failed");

  mz_sampler_free(s);
  mz_context_free(ctx);
  if (check_pressure(model, toks, n)) return 1;
  if (check_struct_size(model, path, toks, n)) return 1;
  mz_model_free(model);
  return 0;
}

/* mz_profile_device, quick: progress reaches its total, the report has the codec table, the
 * read-test file is gone, and the profile loads: a context made with it as <cache>/profile.json
 * (MZ_CACHE_DIR) starts, and one made with that file damaged does not (so it was read). Bad
 * params are refused before anything is measured. */
struct profile_seen {
  int32_t calls, last_done, last_total;
  int report_has_q8;
};
static void on_profile_progress(const char* step, int32_t done, int32_t total, void* user) {
  struct profile_seen* seen = (struct profile_seen*)user;
  seen->calls += step != NULL && step[0] != '\0';
  seen->last_done = done;
  seen->last_total = total;
}
static void on_profile_report(const char* text, void* user) {
  struct profile_seen* seen = (struct profile_seen*)user;
  if (strstr(text, "| q8 |") != NULL) seen->report_has_q8 = 1;
}

static int check_profile(const char* path) {
  char dir[] = "/tmp/mzcache-c-api-profile-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
  char out[256], probe[256];
  snprintf(out, sizeof out, "%s/profile.json", dir);
  snprintf(probe, sizeof probe, "%s/mzcache-profile.bin", dir);

  CHECK(mz_profile_default_params().struct_size == sizeof(struct mz_profile_params), "profile params struct_size");
  struct mz_profile_params pp;
  memset(&pp, 0, sizeof pp);
  CHECK(mz_profile_device(path, &pp, out) == MZ_ERR_INVALID_ARG, "zeroed profile params accepted");
  CHECK(strstr(mz_last_error(), "mz_profile_params") != NULL, "the message does not name the struct");
  pp = mz_profile_default_params();
  CHECK(pp.dir == NULL && pp.file_mib == 512 && pp.threads == 2 && !pp.quick && pp.progress == NULL,
        "profile defaults: file_mib %u threads %d quick %d", (unsigned)pp.file_mib, (int)pp.threads, (int)pp.quick);
  CHECK(mz_profile_device(NULL, &pp, out) == MZ_ERR_INVALID_ARG, "NULL model path accepted");
  pp.threads = 0;
  CHECK(mz_profile_device(path, &pp, out) == MZ_ERR_INVALID_ARG, "threads 0 accepted");
  pp = mz_profile_default_params();
  pp.dir = ""; /* not "the root folder": refused */
  CHECK(mz_profile_device(path, &pp, out) == MZ_ERR_INVALID_ARG, "an empty dir accepted");
  CHECK(access(out, F_OK) != 0, "a refused call wrote the profile");

  struct profile_seen seen = {0, 0, 0, 0};
  pp = mz_profile_default_params();
  pp.dir = dir;
  pp.file_mib = 8;
  pp.quick = true;
  pp.progress = on_profile_progress;
  pp.report = on_profile_report;
  pp.user = &seen;
  int rc = mz_profile_device(path, &pp, out);
  CHECK(rc == MZ_OK, "mz_profile_device = %d (%s)", rc, mz_status_str(rc));
  CHECK(seen.calls > 1 && seen.last_total > 1 && seen.last_done == seen.last_total,
        "progress: %d calls, last %d/%d", (int)seen.calls, (int)seen.last_done, (int)seen.last_total);
  CHECK(seen.report_has_q8, "the report has no q8 codec row");
  CHECK(access(probe, F_OK) != 0, "the read-test file was left behind");
  CHECK(access(out, F_OK) == 0, "no profile at %s", out);

  const char* old = getenv("MZ_CACHE_DIR");
  char saved[1024] = "";
  if (old) snprintf(saved, sizeof saved, "%s", old);
  CHECK(setenv("MZ_CACHE_DIR", dir, 1) == 0, "setenv failed");
  mz_model* model = NULL;
  CHECK(mz_model_load(path, NULL, &model) == MZ_OK, "load: %s", mz_last_error());
  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  rc = mz_context_new(model, &cp, &ctx);
  CHECK(rc == MZ_OK && ctx != NULL, "a context with the new profile: %d (%s)", rc, mz_last_error());
  mz_context_free(ctx);
  FILE* f = fopen(out, "w");
  CHECK(f != NULL && fputs("{ not a profile", f) >= 0 && fclose(f) == 0, "cannot damage %s", out);
  ctx = NULL;
  rc = mz_context_new(model, &cp, &ctx);
  CHECK(rc != MZ_OK && ctx == NULL, "a context started with a damaged profile (%d): was the profile read?", rc);
  mz_model_free(model);
  if (old)
    setenv("MZ_CACHE_DIR", saved, 1);
  else
    unsetenv("MZ_CACHE_DIR");
  remove(out);
  CHECK(rmdir(dir) == 0, "%s not empty after the profile", dir);
  return 0;
}

/* The pool through the C API: two conversations, a shared prefix, a budget, commit, a restart that
 * finds the conversation again, delete. */
static int check_pool(const char* path) {
  CHECK(mz_pool_default_params().struct_size == sizeof(struct mz_pool_params), "pool params struct_size");
  mz_model* model = NULL;
  CHECK(mz_model_load(path, NULL, &model) == MZ_OK, "load: %s", mz_last_error());
  char dir[256];
  snprintf(dir, sizeof dir, "%s/mz-c-pool-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 1024;
  cp.kv_chunk_tokens = 64;
  struct mz_pool_params pp = mz_pool_default_params();
  pp.dir = dir;
  pp.context = &cp;
  mz_pool* pool = NULL;
  CHECK(mz_pool_new(model, &pp, &pool) == MZ_OK && pool, "mz_pool_new: %s", mz_last_error());
  mz_conversation* a = NULL;
  mz_conversation* b = NULL;
  CHECK(mz_pool_open(pool, "../escape", &a) == MZ_ERR_INVALID_ARG && a == NULL, "a name with a path was accepted");
  CHECK(mz_pool_open(pool, "a", &a) == MZ_OK, "open a: %s", mz_last_error());
  CHECK(mz_pool_open(pool, "b", &b) == MZ_OK, "open b: %s", mz_last_error());
  mz_token t[200];
  for (int i = 0; i < 200; ++i) t[i] = 100 + (i * 37) % 3000;
  CHECK(mz_conversation_decode(a, t, 200, false) == MZ_OK, "decode a: %s", mz_last_error());
  t[199] = 7; /* b shares the first 3 chunks */
  struct mz_restore_stats rs;
  CHECK(mz_conversation_restore_generate(b, t, 200, NULL, &rs) == MZ_OK, "restore_generate b: %s", mz_last_error());
  struct mz_conversation_report r;
  CHECK(mz_pool_conversation_report(pool, "b", &r) == MZ_OK, "report b");
  CHECK(r.shared_chunks == 3 && r.n_tokens == 200 && r.open, "b: shared %d tokens %d", (int)r.shared_chunks,
        (int)r.n_tokens);
  /* The 3 chunks are held once for a and b (since 0.10). */
  struct mz_pool_shared_report sh;
  CHECK(mz_pool_get_shared_report(pool, NULL) == MZ_ERR_INVALID_ARG, "shared report without out");
  CHECK(mz_pool_get_shared_report(pool, &sh) == MZ_OK && sh.chunks == 3 && sh.units > 0 &&
            sh.refs == 2 * (uint64_t)sh.units && sh.bytes_if_copied == 2 * sh.resident_bytes && sh.resident_bytes > 0,
        "shared report: %d chunks, %d units, %llu refs, %llu resident, %llu if copied", (int)sh.chunks, (int)sh.units,
        (unsigned long long)sh.refs, (unsigned long long)sh.resident_bytes, (unsigned long long)sh.bytes_if_copied);
  struct mz_sampler_params sp = mz_sampler_default_params();
  mz_sampler* s = mz_sampler_new(&sp);
  const mz_token next = mz_conversation_sample(b, s, 0);
  CHECK(next >= 0, "sample: %d", (int)next);
  mz_sampler_free(s);
  uint64_t freed = 0;
  CHECK(mz_pool_evict(pool, 1ull << 40, &freed) == MZ_OK && freed > 0, "mz_pool_evict freed %llu",
        (unsigned long long)freed);
  CHECK(mz_conversation_commit(a) == MZ_OK && mz_pool_flush(pool) == MZ_OK, "commit/flush: %s", mz_last_error());
  struct mz_pool_report pr;
  CHECK(mz_pool_get_report(pool, &pr) == MZ_OK && pr.n_conversations == 2 && pr.persists >= 1,
        "pool report: %d conversations, %llu persists", (int)pr.n_conversations, (unsigned long long)pr.persists);
  mz_conversation_release(a);
  mz_conversation_release(b);
  mz_pool_free(pool);
  pool = NULL;
  CHECK(mz_pool_new(model, &pp, &pool) == MZ_OK, "reopen: %s", mz_last_error());
  struct mz_conversation_report list[4];
  CHECK(mz_pool_list(pool, list, 4) == 2, "after a restart %d conversations", (int)mz_pool_list(pool, NULL, 0));
  CHECK(mz_pool_damaged(pool, 0, NULL, 0) == MZ_ERR_INVALID_ARG, "a damaged file reported");
  /* The history of a stored conversation (0.10), from its file's header and index, before it is
   * opened; then of the open one; a count query; a short buffer gets the prefix. */
  {
    mz_token h[256];
    CHECK(mz_pool_conversation_tokens(pool, "b", NULL, 0) == 200, "stored history count");
    CHECK(mz_pool_conversation_tokens(pool, "b", h, 256) == 200 && h[0] == t[0] && h[198] == t[198] && h[199] == 7,
          "stored history of b");
    CHECK(mz_pool_conversation_tokens(pool, "b", h, 3) == 200 && h[2] == t[2], "short buffer");
    CHECK(mz_pool_conversation_tokens(pool, "nobody", h, 256) == MZ_ERR_INVALID_ARG, "unknown conversation");
    CHECK(mz_pool_conversation_tokens(pool, "b", NULL, 5) == MZ_ERR_INVALID_ARG, "NULL out with cap 5");
  }
  CHECK(mz_pool_open(pool, "a", &a) == MZ_OK && mz_conversation_n_tokens(a) == 200, "a after restart: %s",
        mz_last_error());
  {
    mz_token h[256];
    CHECK(mz_pool_conversation_tokens(pool, "a", h, 256) == 200 && h[199] == 100 + (199 * 37) % 3000, "open history of a");
  }
  mz_conversation_release(a);
  /* The pool's pressure watch (0.8): the watermark source works everywhere; one at a time;
   * restore-ahead is accepted for a pool since 0.9; stop is idempotent. */
  {
    struct mz_pressure_params wp = mz_pressure_default_params();
    wp.source = "watermark";
    CHECK(mz_pool_pressure_watch_start(pool, &wp) == MZ_OK, "pool watch: %s", mz_last_error());
    CHECK(mz_pool_pressure_watch_start(pool, &wp) == MZ_ERR_BUSY, "a second pool watch was accepted");
    CHECK(mz_pool_pressure_watch_stop(pool) == MZ_OK && mz_pool_pressure_watch_stop(pool) == MZ_OK, "pool watch stop");
    wp.restore_in_background = true;
    CHECK(mz_pool_pressure_watch_start(pool, &wp) == MZ_OK, "pool restore-ahead: %s", mz_last_error());
    CHECK(mz_pool_pressure_watch_stop(pool) == MZ_OK, "pool watch stop");
    wp.restore_in_background = false;
    wp.step_points = 2.0f;
    CHECK(mz_pool_pressure_watch_start(pool, &wp) == MZ_ERR_INVALID_ARG, "step_points 2 was accepted");
    CHECK(mz_pool_pressure_watch_start(NULL, NULL) == MZ_ERR_INVALID_ARG, "NULL pool was accepted");
    CHECK(mz_pool_pressure_watch_start(pool, NULL) == MZ_OK, "pool watch (defaults): %s", mz_last_error());
    /* left running: mz_pool_free stops it */
  }
  CHECK(mz_pool_delete(pool, "a") == MZ_OK && mz_pool_delete(pool, "b") == MZ_OK, "delete: %s", mz_last_error());
  CHECK(mz_pool_list(pool, NULL, 0) == 0, "conversations left after delete");
  mz_pool_free(pool);
  mz_model_free(model);
  char sw[300];
  snprintf(sw, sizeof sw, "%s/swap", dir);
  rmdir(sw);
  CHECK(rmdir(dir) == 0, "%s not empty after deleting every conversation", dir);
  return 0;
}

int main(int argc, char** argv) {
  static char buf[4096];
  const char* path = argc > 1 ? argv[1] : NULL;
  const char* over = getenv("MZ_TEST_MODEL_DIR_OVERRIDE");
  if (!path && over && *over) {
    snprintf(buf, sizeof buf, "%s/tiny-qwen3-q8_0.gguf", over);
    path = buf;
  }
  if (!path) path = getenv("MZ_TEST_MODEL");
  if (!path || !*path) {
    fprintf(stderr, "FAIL: no model path (argv[1], MZ_TEST_MODEL_DIR_OVERRIDE or MZ_TEST_MODEL)\n");
    return 2;
  }
  if (check_defaults() || check_missing_file() || run_model(path) || check_profile(path) || check_pool(path)) return 1;
  printf("PASS: C API (%s)\n", path);
  return 0;
}
