/*
 * The public header compiles as C (C11, -Wall -Wextra -Werror: see tests/CMakeLists.txt) and the C API
 * works end to end from C: defaults, status names, an I/O error with its message, then load ->
 * tokenize -> decode -> greedy sampling of 4 tokens on the tiny-qwen3 model. Exits non-zero on the
 * first failure, printing what failed and mz_last_error(). The 0.10 additions: CPU lists and
 * clusters, mz_context_get_threads, mz_session_get_info, mz_pressure_submit / on_action /
 * watch_reason / set_generating, sustained on_event / thermal_zone / get_sustained_info (on a fake
 * thermal tree under /tmp) and the 0.9 sizes of the params structs that grew.
 *
 * Model path, in this order: argv[1]; $MZ_TEST_MODEL_DIR_OVERRIDE/tiny-qwen3-q8_0.gguf (the shared
 * model folder the sanitizer runs use, as in tests/test_util.cpp); $MZ_TEST_MODEL (set by ctest).
 * ctest makes sure the file exists first (fixture test c_api_model_setup).
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 (setenv, mkdtemp, rmdir, mkdir, nanosleep, pthread_self) and nftw */
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mzcache.h"

/* Removes the folder path and everything in it (a test's pool folder, once its checks are done). */
static int remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}
static void remove_tree(const char* path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

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
  CHECK(rp.compute_threads_while_restoring == 0, "compute_threads_while_restoring defaults to 0 (0.19)");
  rp.compute_threads_while_restoring = -1; /* copied, then refused */
  CHECK(mz_restore_generate(ctx, &t, 1, &rp, NULL) == MZ_ERR_INVALID_ARG, "compute_threads_while_restoring -1 accepted");
  rp = mz_restore_default_params();
  rp.struct_size = (uint32_t)offsetof(struct mz_restore_params, compute_threads_while_restoring); /* 0.18's size */
  CHECK(mz_restore_generate(ctx, &t, 1, &rp, NULL) == MZ_OK && mz_context_n_tokens(ctx) == n + 1,
        "restore_generate with 0.18's restore params: %s", mz_last_error());
  mz_context_truncate(ctx, n);
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

/* ---- since 0.10 ---- */

/* mz_parse_cpu_list: the kernel's format in, ascending distinct ids out; the sizing convention;
 * bad text refused with its text quoted in mz_last_error. */
static int check_cpu_list(void) {
  int32_t out[16];
  const int32_t want[] = {0, 1, 2, 3, 5, 7, 8};
  CHECK(mz_parse_cpu_list("0-3,5,7-8", NULL, 0) == 7, "size query: %d", (int)mz_parse_cpu_list("0-3,5,7-8", NULL, 0));
  for (int i = 0; i < 16; ++i) out[i] = -99;
  CHECK(mz_parse_cpu_list("0-3,5,7-8", out, 16) == 7, "\"0-3,5,7-8\" parsed to %d ids", (int)mz_parse_cpu_list("0-3,5,7-8", out, 16));
  for (int i = 0; i < 7; ++i) CHECK(out[i] == want[i], "id %d is %d, want %d", i, (int)out[i], (int)want[i]);
  CHECK(out[7] == -99, "wrote past n: out[7] = %d", (int)out[7]);
  for (int i = 0; i < 16; ++i) out[i] = -99;
  CHECK(mz_parse_cpu_list("0-3,5,7-8", out, 3) == 7, "a short buffer does not return the full count");
  CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == -99, "short buffer: %d %d %d %d", (int)out[0],
        (int)out[1], (int)out[2], (int)out[3]);
  /* As the kernel writes them (trailing newline); ascending and distinct whatever the input order. */
  CHECK(mz_parse_cpu_list("0-1\n", out, 16) == 2 && out[0] == 0 && out[1] == 1, "\"0-1\\n\"");
  CHECK(mz_parse_cpu_list("8,1-2,2", out, 16) == 3 && out[0] == 1 && out[1] == 2 && out[2] == 8,
        "\"8,1-2,2\": %d %d %d", (int)out[0], (int)out[1], (int)out[2]);
  CHECK(mz_parse_cpu_list("", out, 16) == 0, "the empty list");
  CHECK(mz_parse_cpu_list("4095", out, 16) == 1 && out[0] == 4095, "4095 (the largest id)");
  CHECK(mz_parse_cpu_list("0-4095", NULL, 0) == 4096, "0-4095");
  /* Refused, quoting the text. */
  const char* bad[] = {"3-1", "x", "4096", "1,,2", "-1", "0-", "1-x", "0-4096"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    const int32_t rc = mz_parse_cpu_list(bad[i], out, 16);
    CHECK(rc == MZ_ERR_INVALID_ARG, "\"%s\" accepted (%d)", bad[i], (int)rc);
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
    CHECK(strstr(mz_last_error(), quoted) != NULL, "the message does not quote %s", quoted);
  }
  CHECK(mz_parse_cpu_list(NULL, out, 16) == MZ_ERR_INVALID_ARG, "NULL list accepted");
  CHECK(mz_parse_cpu_list("0-3", out, -1) == MZ_ERR_INVALID_ARG, "cap -1 accepted");
  CHECK(mz_parse_cpu_list("0-3", NULL, 2) == MZ_ERR_INVALID_ARG, "NULL out with cap 2 accepted");
  CHECK(mz_parse_cpu_list("0-3", NULL, 0) == 4 && mz_last_error()[0] == '\0', "a success after an error");
  return 0;
}

static int popcount64(uint64_t x) {
  int n = 0;
  for (; x; x &= x - 1) ++n;
  return n;
}

/* mz_cpu_clusters: sized with cap 0, then filled; every online CPU (/sys/devices/system/cpu/online,
 * parsed by mz_parse_cpu_list) in exactly one cluster; n_cpus = the bits set; fastest first. */
static int check_cpu_clusters(void) {
  const int32_t n = mz_cpu_clusters(NULL, 0);
  CHECK(n >= 1 && n <= 64, "mz_cpu_clusters(NULL, 0) = %d", (int)n);
  CHECK(mz_cpu_clusters(NULL, 1) == MZ_ERR_INVALID_ARG, "NULL out with cap 1 accepted");
  struct mz_cpu_cluster one[2];
  memset(one, 0, sizeof one);
  one[1].capacity = 0xdeadbeefu;
  CHECK(mz_cpu_clusters(one, -1) == MZ_ERR_INVALID_ARG, "cap -1 accepted");
  CHECK(mz_cpu_clusters(one, 1) == n && one[0].n_cpus > 0 && one[1].capacity == 0xdeadbeefu,
        "cap 1: n_cpus %d, the second entry %s", (int)one[0].n_cpus, one[1].capacity == 0xdeadbeefu ? "kept" : "written");
  struct mz_cpu_cluster* cl = (struct mz_cpu_cluster*)calloc((size_t)n, sizeof *cl);
  CHECK(cl != NULL, "calloc");
  CHECK(mz_cpu_clusters(cl, n) == n, "second call");
  uint64_t seen[64];
  memset(seen, 0, sizeof seen);
  int32_t total = 0;
  for (int32_t i = 0; i < n; ++i) {
    int bits = 0;
    for (int w = 0; w < 64; ++w) {
      CHECK((seen[w] & cl[i].cpus[w]) == 0, "cluster %d shares a CPU with an earlier one", (int)i);
      seen[w] |= cl[i].cpus[w];
      bits += popcount64(cl[i].cpus[w]);
    }
    CHECK(cl[i].n_cpus > 0 && bits == cl[i].n_cpus, "cluster %d: n_cpus %d, %d bits set", (int)i, (int)cl[i].n_cpus, bits);
    if (i > 0)
      CHECK(cl[i - 1].capacity > cl[i].capacity ||
                (cl[i - 1].capacity == cl[i].capacity && cl[i - 1].max_freq_khz > cl[i].max_freq_khz),
            "cluster %d (capacity %u, %llu kHz) is not slower than cluster %d (capacity %u, %llu kHz)", (int)i,
            (unsigned)cl[i].capacity, (unsigned long long)cl[i].max_freq_khz, (int)i - 1, (unsigned)cl[i - 1].capacity,
            (unsigned long long)cl[i - 1].max_freq_khz);
    total += cl[i].n_cpus;
  }
  CHECK(memcmp(&one[0], &cl[0], sizeof one[0]) == 0, "cap 1 and cap n disagree on the first cluster");
  FILE* f = fopen("/sys/devices/system/cpu/online", "r");
  if (f) {
    char text[4096];
    const size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    const int32_t m = mz_parse_cpu_list(text, NULL, 0);
    CHECK(m > 0, "cannot parse the kernel's online list \"%s\"", text);
    int32_t* ids = (int32_t*)calloc((size_t)m, sizeof *ids);
    CHECK(ids != NULL && mz_parse_cpu_list(text, ids, m) == m, "online list");
    CHECK(total == m, "%d CPUs in the clusters, %d online (%s)", (int)total, (int)m, text);
    for (int32_t i = 0; i < m; ++i)
      CHECK(seen[ids[i] / 64] >> (ids[i] % 64) & 1u, "online CPU %d in no cluster", (int)ids[i]);
    free(ids);
  }
  printf("cpu clusters: %d (first: %d CPUs, capacity %u, %llu kHz)\n", (int)n, (int)cl[0].n_cpus,
         (unsigned)cl[0].capacity, (unsigned long long)cl[0].max_freq_khz);
  free(cl);
  return 0;
}

/* mz_context_get_threads after mz_context_set_threads, with and without CPUs; the default pinning
 * agrees with mz_cpu_clusters. */
static int check_get_threads(mz_model* model) {
  int32_t nt = -5, cpus[8];
  CHECK(mz_context_get_threads(NULL, &nt, NULL, 0) == MZ_ERR_INVALID_ARG && nt == 0, "NULL ctx: rc, n_threads %d", (int)nt);
  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_OK, "mz_context_new: %s", mz_last_error());
  CHECK(mz_context_get_threads(ctx, &nt, NULL, -1) == MZ_ERR_INVALID_ARG, "cap -1 accepted");
  CHECK(mz_context_get_threads(ctx, &nt, NULL, 2) == MZ_ERR_INVALID_ARG, "NULL cpus with cap 2 accepted");

  /* The default: on a homogeneous CPU 2 threads, not pinned; on big.LITTLE pinned to the fastest
   * cluster, min(2, its size) threads. */
  struct mz_cpu_cluster fastest;
  const int32_t nc = mz_cpu_clusters(&fastest, 1);
  CHECK(nc >= 1, "mz_cpu_clusters: %d", (int)nc);
  int32_t n = mz_context_get_threads(ctx, &nt, cpus, 8);
  if (nc == 1) {
    CHECK(n == 0 && nt == 2, "default on one cluster: %d pinned CPUs, %d threads", (int)n, (int)nt);
  } else {
    const int32_t want = fastest.n_cpus < 2 ? fastest.n_cpus : 2;
    CHECK(n == want && nt == want, "default on %d clusters: %d pinned CPUs, %d threads, want %d", (int)nc, (int)n,
          (int)nt, (int)want);
    for (int32_t i = 0; i < n; ++i)
      CHECK(fastest.cpus[cpus[i] / 64] >> (cpus[i] % 64) & 1u, "default pinned CPU %d outside the fastest cluster",
            (int)cpus[i]);
  }
  CHECK(mz_context_get_threads(ctx, NULL, NULL, 0) == n, "size query without n_threads");

  CHECK(mz_context_set_threads(ctx, 1, NULL, 0) == MZ_OK, "set_threads(1): %s", mz_last_error());
  CHECK(mz_context_get_threads(ctx, &nt, cpus, 8) == 0 && nt == 1, "after set_threads(1): n_threads %d", (int)nt);
  CHECK(mz_context_set_threads(ctx, 3, NULL, 0) == MZ_OK, "set_threads(3): %s", mz_last_error());
  CHECK(mz_context_get_threads(ctx, &nt, NULL, 0) == 0 && nt == 3, "after set_threads(3): n_threads %d", (int)nt);
  /* A refused change leaves them. */
  const int32_t bad_cpu = 4000;
  CHECK(mz_context_set_threads(ctx, 1, &bad_cpu, 1) == MZ_ERR_INVALID_ARG, "CPU 4000 accepted");
  CHECK(mz_context_get_threads(ctx, &nt, NULL, 0) == 0 && nt == 3, "a refused set_threads changed them: %d", (int)nt);

  /* Pinned: the CPUs this process may use are the ones set_threads accepts one at a time. */
  int32_t ok_cpus[2];
  int32_t n_ok = 0;
  struct mz_cpu_cluster all[64];
  const int32_t nall = mz_cpu_clusters(all, 64);
  CHECK(nall == nc, "cluster count changed");
  for (int32_t c = 0; c < 4096 && n_ok < 2; ++c) {
    int in = 0;
    for (int32_t i = 0; i < nall; ++i) in |= (int)(all[i].cpus[c / 64] >> (c % 64) & 1u);
    if (!in) continue;
    if (mz_context_set_threads(ctx, 1, &c, 1) != MZ_OK) continue; /* not in this process's affinity */
    CHECK(mz_context_get_threads(ctx, &nt, cpus, 8) == 1 && cpus[0] == c && nt == 1, "pinned to CPU %d: got %d (n %d)",
          (int)c, (int)cpus[0], (int)nt);
    ok_cpus[n_ok++] = c;
  }
  CHECK(n_ok >= 1, "no CPU accepted by mz_context_set_threads: %s", mz_last_error());
  mz_token t = 0;
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode pinned: %s", mz_last_error());
  if (n_ok == 2) {
    /* The first n_threads of the list, reported ascending whatever the order given. */
    const int32_t desc[2] = {ok_cpus[1], ok_cpus[0]};
    CHECK(mz_context_set_threads(ctx, 1, desc, 2) == MZ_OK, "set_threads(1, {%d, %d})", (int)desc[0], (int)desc[1]);
    CHECK(mz_context_get_threads(ctx, &nt, cpus, 8) == 1 && cpus[0] == desc[0] && nt == 1,
          "1 thread on the first of {%d, %d}: pinned to %d", (int)desc[0], (int)desc[1], (int)cpus[0]);
    CHECK(mz_context_set_threads(ctx, 2, desc, 2) == MZ_OK, "set_threads(2, {%d, %d}): %s", (int)desc[0], (int)desc[1],
          mz_last_error());
    CHECK(mz_context_get_threads(ctx, NULL, NULL, 0) == 2, "size query: 2 pinned CPUs");
    cpus[1] = -99;
    CHECK(mz_context_get_threads(ctx, &nt, cpus, 1) == 2 && nt == 2 && cpus[1] == -99, "cap 1 of 2");
    CHECK(mz_context_get_threads(ctx, &nt, cpus, 8) == 2 && nt == 2, "2 pinned threads");
    CHECK(cpus[0] == ok_cpus[0] && cpus[1] == ok_cpus[1], "pinned to {%d, %d} given {%d, %d}: not ascending",
          (int)cpus[0], (int)cpus[1], (int)desc[0], (int)desc[1]);
    CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode on 2 pinned threads: %s", mz_last_error());
  }
  /* Unpinned again. */
  CHECK(mz_context_set_threads(ctx, 2, NULL, 0) == MZ_OK, "set_threads(2): %s", mz_last_error());
  CHECK(mz_context_get_threads(ctx, &nt, cpus, 8) == 0 && nt == 2, "unpinned: n_threads %d", (int)nt);
  mz_context_free(ctx);
  return 0;
}

static int flip_byte(const char* path, long offset) {
  FILE* f = fopen(path, "r+b");
  if (!f) return -1;
  int c = -1;
  if (fseek(f, offset, SEEK_SET) == 0) c = fgetc(f);
  if (c >= 0 && fseek(f, offset, SEEK_SET) == 0 && fputc(c ^ 0x5a, f) != EOF) c = 0;
  else c = -1;
  return fclose(f) == 0 ? c : -1;
}

static int copy_file(const char* from, const char* to, long max_bytes) {
  FILE* in = fopen(from, "rb");
  if (!in) return -1;
  FILE* out = fopen(to, "wb");
  if (!out) {
    fclose(in);
    return -1;
  }
  char buf[8192];
  long done = 0;
  size_t got;
  int rc = 0;
  while ((max_bytes < 0 || done < max_bytes) && (got = fread(buf, 1, sizeof buf, in)) > 0) {
    if (max_bytes >= 0 && done + (long)got > max_bytes) got = (size_t)(max_bytes - done);
    if (fwrite(buf, 1, got, out) != got) rc = -1;
    done += (long)got;
  }
  fclose(in);
  return fclose(out) == 0 ? rc : -1;
}

static int info_is_zero(const struct mz_session_info* s) {
  static const struct mz_session_info zero;
  return memcmp(s, &zero, sizeof zero) == 0;
}

/* mz_session_get_info: what mz_session_save wrote (tokens, chunks, codec, size), the context left
 * as it was; a missing file (MZ_ERR_IO) and damaged ones (MZ_ERR_CORRUPT) with *out zeroed. */
static int check_session_info(mz_model* model, const mz_token* toks, int32_t n) {
  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  cp.kv_chunk_tokens = 16;
  mz_context* ctx = NULL;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_OK, "mz_context_new: %s", mz_last_error());
  mz_token many[40];
  for (int i = 0; i < 40; ++i) many[i] = toks[i % n];
  CHECK(mz_decode(ctx, many, 40, false) == MZ_OK, "decode 40: %s", mz_last_error());
  char path[256], bad[300], missing[300];
  snprintf(path, sizeof path, "%s/mz-c-session-%d.mzs", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  snprintf(bad, sizeof bad, "%s.bad", path);
  snprintf(missing, sizeof missing, "%s.missing", path);
  CHECK(mz_session_save(ctx, path, "none") == MZ_OK, "save: %s", mz_last_error());
  struct stat sb;
  CHECK(stat(path, &sb) == 0, "no session file at %s", path);

  struct mz_session_info si;
  memset(&si, 0xff, sizeof si);
  int rc = mz_session_get_info(ctx, path, &si);
  CHECK(rc == MZ_OK, "get_info = %d", rc);
  CHECK(si.n_tokens == 40 && si.n_chunks == 3, "info: %d tokens, %d chunks (want 40, 3)", (int)si.n_tokens,
        (int)si.n_chunks);
  CHECK(strcmp(si.codec, "none") == 0, "info: codec \"%s\"", si.codec);
  CHECK(si.file_bytes > 0 && si.file_bytes == (uint64_t)sb.st_size, "info: file_bytes %llu, stat %lld",
        (unsigned long long)si.file_bytes, (long long)sb.st_size);
  CHECK(mz_context_n_tokens(ctx) == 40, "get_info changed the context: %d tokens", (int)mz_context_n_tokens(ctx));

  /* The default codec (q8), a shorter conversation. */
  CHECK(mz_context_truncate(ctx, 17) == MZ_OK, "truncate");
  CHECK(mz_session_save(ctx, path, NULL) == MZ_OK, "save q8: %s", mz_last_error());
  CHECK(mz_session_get_info(ctx, path, &si) == MZ_OK && si.n_tokens == 17 && si.n_chunks == 2 &&
            strcmp(si.codec, "q8") == 0 && si.file_bytes > 0,
        "q8 info: %d tokens, %d chunks, codec \"%s\"", (int)si.n_tokens, (int)si.n_chunks, si.codec);

  /* Arguments. */
  memset(&si, 0xff, sizeof si);
  CHECK(mz_session_get_info(NULL, path, &si) == MZ_ERR_INVALID_ARG && info_is_zero(&si), "NULL ctx");
  memset(&si, 0xff, sizeof si);
  CHECK(mz_session_get_info(ctx, NULL, &si) == MZ_ERR_INVALID_ARG && info_is_zero(&si), "NULL path");
  CHECK(mz_session_get_info(ctx, path, NULL) == MZ_ERR_INVALID_ARG, "NULL out");

  /* A missing file. */
  memset(&si, 0xff, sizeof si);
  rc = mz_session_get_info(ctx, missing, &si);
  CHECK(rc == MZ_ERR_IO && info_is_zero(&si), "missing file: %d (%s)", rc, mz_status_str(rc));
  CHECK(strstr(mz_last_error(), missing) != NULL, "the message does not name the file");

  /* Damaged copies: the header, the index (the first token), a truncated file. */
  const long offsets[] = {0, 28, 4096};
  for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; ++i) {
    CHECK(copy_file(path, bad, -1) == 0 && flip_byte(bad, offsets[i]) == 0, "cannot damage %s", bad);
    memset(&si, 0xff, sizeof si);
    rc = mz_session_get_info(ctx, bad, &si);
    CHECK(rc == MZ_ERR_CORRUPT && info_is_zero(&si), "byte %ld flipped: %d (%s)", offsets[i], rc, mz_status_str(rc));
    CHECK(mz_last_error()[0] != '\0', "no message");
    CHECK(mz_session_load(ctx, bad) == MZ_ERR_CORRUPT, "mz_session_load accepted what get_info refused");
  }
  CHECK(copy_file(path, bad, 1000) == 0, "cannot truncate %s", bad);
  memset(&si, 0xff, sizeof si);
  rc = mz_session_get_info(ctx, bad, &si);
  CHECK(rc == MZ_ERR_CORRUPT && info_is_zero(&si), "truncated file: %d (%s)", rc, mz_status_str(rc));
  CHECK(mz_context_n_tokens(ctx) == 17, "refused infos changed the context: %d tokens", (int)mz_context_n_tokens(ctx));

  /* A context with another chunk size refuses it (as mz_session_load does): MZ_ERR_CORRUPT, "another
   * KV geometry" in the header. */
  {
    struct mz_context_params cp2 = cp;
    cp2.kv_chunk_tokens = 32;
    mz_context* c2 = NULL;
    CHECK(mz_context_new(model, &cp2, &c2) == MZ_OK, "context with chunk 32: %s", mz_last_error());
    memset(&si, 0xff, sizeof si);
    rc = mz_session_get_info(c2, path, &si);
    CHECK(rc == MZ_ERR_CORRUPT && info_is_zero(&si), "another chunk size: %d", rc);
    CHECK(mz_session_load(c2, path) < 0, "mz_session_load accepted another chunk size");
    mz_context_free(c2);
  }

  /* And the file loads as get_info described it. */
  CHECK(mz_context_truncate(ctx, 0) == MZ_OK && mz_session_load(ctx, path) == MZ_OK, "load: %s", mz_last_error());
  CHECK(mz_context_n_tokens(ctx) == 17, "loaded %d tokens", (int)mz_context_n_tokens(ctx));
  mz_context_free(ctx);
  remove(bad);
  CHECK(remove(path) == 0, "remove %s", path);
  return 0;
}

/* on_action: every call recorded (copies of the strings: they are valid during the call only). */
struct action_log {
  int calls;
  int other_thread;
  pthread_t thread;
  struct {
    char source[64], level_name[16], error[128], note[64];
    int32_t level, status;
    uint64_t requested, freed, restored_bytes;
    bool deferred, restored;
    double remaining, delay_s;
    uint32_t repeats;
  } last;
  uint64_t freed_sum;
};
static void on_action(const struct mz_pressure_action* a, void* user) {
  struct action_log* log = (struct action_log*)user;
  log->calls++;
  if (!pthread_equal(pthread_self(), log->thread)) log->other_thread++;
  snprintf(log->last.source, sizeof log->last.source, "%s", a->source ? a->source : "(null)");
  snprintf(log->last.level_name, sizeof log->last.level_name, "%s", a->level_name ? a->level_name : "(null)");
  snprintf(log->last.error, sizeof log->last.error, "%s", a->error ? a->error : "(null)");
  snprintf(log->last.note, sizeof log->last.note, "%s", a->note ? a->note : "(null)");
  log->last.level = a->level;
  log->last.status = a->status;
  log->last.requested = a->requested;
  log->last.freed = a->freed;
  log->last.restored_bytes = a->restored_bytes;
  log->last.deferred = a->deferred;
  log->last.restored = a->restored;
  log->last.remaining = a->remaining;
  log->last.delay_s = a->delay_s;
  log->last.repeats = a->repeats;
  if (!a->restored) log->freed_sum += a->freed;
}
static void reset_log(struct action_log* log) {
  memset(log, 0, sizeof *log);
  log->thread = pthread_self();
}

/* The sane fields of the last action: source and level as submitted, nothing restored, the
 * strings set, 0 <= remaining <= 1, a small non-negative delay. */
static int check_action(const struct action_log* log, const char* source, int32_t level, bool deferred) {
  static const char* names[] = {"none", "low", "medium", "critical"};
  CHECK(log->other_thread == 0, "on_action called on another thread");
  CHECK(strcmp(log->last.source, source) == 0, "source \"%s\", want \"%s\"", log->last.source, source);
  CHECK(log->last.level == level && strcmp(log->last.level_name, names[level]) == 0, "level %d \"%s\", want %d \"%s\"",
        (int)log->last.level, log->last.level_name, (int)level, names[level]);
  CHECK(log->last.deferred == deferred, "deferred %d, want %d", (int)log->last.deferred, (int)deferred);
  CHECK(!log->last.restored && log->last.restored_bytes == 0, "a pressure event reported as a restore");
  CHECK(log->last.status == MZ_OK && log->last.error[0] == '\0', "status %d error \"%s\"", (int)log->last.status,
        log->last.error);
  /* remaining counts the in-memory swap's mapped segments too (mz_memory_report.in_memory): on this
   * small model a low event that moves ~1 MB into a fresh 8 MiB segment leaves it above 1. */
  CHECK(isfinite(log->last.remaining) && log->last.remaining >= 0.0, "%s: remaining %g (requested %llu, freed %llu, note \"%s\")",
        source, log->last.remaining, (unsigned long long)log->last.requested, (unsigned long long)log->last.freed,
        log->last.note);
  CHECK(log->last.delay_s >= 0.0 && log->last.delay_s < 60.0, "delay_s %g", log->last.delay_s);
  CHECK(strcmp(log->last.note, "(null)") != 0, "note NULL");
  if (log->last.requested == 0) {
    CHECK(log->last.freed == 0 && log->last.note[0] != '\0', "nothing requested: freed %llu, note \"%s\"",
          (unsigned long long)log->last.freed, log->last.note);
  } else {
    CHECK(log->last.note[0] == '\0', "an eviction with a note \"%s\"", log->last.note);
  }
  return 0;
}

/* mz_pressure_submit (levels 0..3, bad levels), mz_pressure_params.on_action, mz_pressure_watch_reason
 * and mz_pressure_set_generating, through a "manual" watcher; an old-size params struct. */
static int check_pressure_submit(mz_model* model, const mz_token* toks, int32_t n) {
  struct mz_pressure_params pp = mz_pressure_default_params();
  CHECK(pp.on_action == NULL && pp.user == NULL, "pressure defaults: on_action / user not NULL");
  CHECK(mz_pressure_submit(NULL, 1, NULL) == MZ_ERR_INVALID_ARG, "submit on NULL ctx accepted");
  CHECK(mz_pressure_set_generating(NULL, true) == MZ_ERR_INVALID_ARG, "set_generating on NULL ctx accepted");
  CHECK(mz_pressure_watch_reason(NULL, NULL, 0) == MZ_ERR_INVALID_ARG, "watch_reason on NULL ctx accepted");

  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_OK, "mz_context_new: %s", mz_last_error());
  CHECK(mz_decode(ctx, toks, n, false) == MZ_OK, "decode: %s", mz_last_error());

  /* No watcher: no reason. */
  char why[512];
  memset(why, 'x', sizeof why);
  CHECK(mz_pressure_watch_reason(ctx, NULL, 0) == 0, "a reason without a watcher");
  CHECK(mz_pressure_watch_reason(ctx, why, (int32_t)sizeof why) == 0 && why[0] == '\0', "reason buffer \"%.8s\"", why);
  CHECK(mz_pressure_watch_reason(ctx, why, -1) == MZ_ERR_INVALID_ARG, "cap -1 accepted");
  CHECK(mz_pressure_watch_reason(ctx, NULL, 4) == MZ_ERR_INVALID_ARG, "NULL buf with cap 4 accepted");

  /* Without a watcher: the default params' handler; levels outside 0..3 refused, changing nothing. */
  struct mz_pressure_stats st;
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == 0, "events before any");
  CHECK(mz_pressure_submit(ctx, 4, NULL) == MZ_ERR_INVALID_ARG, "level 4 accepted");
  CHECK(strstr(mz_last_error(), "4") != NULL, "the message does not name the level: %s", mz_last_error());
  CHECK(mz_pressure_submit(ctx, -1, "x") == MZ_ERR_INVALID_ARG, "level -1 accepted");
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == 0, "a refused level counted: %u events",
        (unsigned)st.events);
  for (int32_t level = 0; level <= 3; ++level) {
    const int rc = mz_pressure_submit(ctx, level, level == 2 ? NULL : "c-test");
    CHECK(rc == MZ_OK, "submit level %d = %d (%s)", (int)level, rc, mz_status_str(rc));
    CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == (uint32_t)level + 1 && st.last_level == level,
          "after level %d: %u events, last level %d", (int)level, (unsigned)st.events, (int)st.last_level);
  }
  CHECK(st.bytes_freed > 0, "levels 1..3 freed nothing");
  struct mz_memory_report r;
  CHECK(mz_get_memory_report(ctx, &r) == MZ_OK && r.weights_dropped > 0, "critical dropped no weights");
  mz_token t = toks[0];
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode after submit: %s", mz_last_error());

  /* A manual watcher with on_action: called on this thread for submit and mz_on_trim_memory. */
  struct action_log log;
  reset_log(&log);
  pp = mz_pressure_default_params();
  pp.source = "manual";
  pp.hysteresis_ms = 0;
  pp.on_action = on_action;
  pp.user = &log;
  CHECK(mz_pressure_watch_start(ctx, &pp) == MZ_OK, "manual watcher: %s", mz_last_error());
  const int32_t len = mz_pressure_watch_reason(ctx, NULL, 0);
  CHECK(len > 0, "no reason with a watcher (%d)", (int)len);
  CHECK(mz_pressure_watch_reason(ctx, why, (int32_t)sizeof why) == len && (int32_t)strlen(why) == len &&
            strstr(why, "manual") != NULL,
        "reason \"%s\" (%d)", why, (int)len);
  char short_buf[8];
  CHECK(mz_pressure_watch_reason(ctx, short_buf, 8) == len && strlen(short_buf) == 7 &&
            strncmp(short_buf, why, 7) == 0,
        "truncated reason \"%s\"", short_buf);
  printf("pressure watch reason: %s\n", why);
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK, "stats");
  const uint64_t freed_before = st.bytes_freed;
  const uint32_t events_before = st.events;

  int rc = mz_pressure_submit(ctx, 3, "c-test critical");
  CHECK(rc == MZ_OK, "submit 3 with a watcher = %d (%s)", rc, mz_status_str(rc));
  CHECK(log.calls == 1, "on_action called %d times for one event", log.calls);
  if (check_action(&log, "c-test critical", 3, false)) return 1;
  CHECK(log.last.requested > 0 && log.last.freed > 0, "critical on a resident context: requested %llu freed %llu",
        (unsigned long long)log.last.requested, (unsigned long long)log.last.freed);
  CHECK(log.last.remaining < 1.0, "remaining %g after freeing %llu", log.last.remaining,
        (unsigned long long)log.last.freed);
  rc = mz_pressure_submit(ctx, 0, NULL);
  CHECK(rc == MZ_OK && log.calls == 2, "submit 0: %d, %d calls", rc, log.calls);
  if (check_action(&log, "manual", 0, false)) return 1;
  CHECK(log.last.requested == 0 && log.last.freed == 0, "level 0 gave back %llu", (unsigned long long)log.last.freed);
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode: %s", mz_last_error());
  rc = mz_pressure_submit(ctx, 1, "low one");
  CHECK(rc == MZ_OK && log.calls == 3, "submit 1: %d, %d calls", rc, log.calls);
  if (check_action(&log, "low one", 1, false)) return 1;
  rc = mz_pressure_submit(ctx, 2, "medium one");
  CHECK(rc == MZ_OK && log.calls == 4, "submit 2: %d, %d calls", rc, log.calls);
  if (check_action(&log, "medium one", 2, false)) return 1;
  CHECK(mz_on_trim_memory(ctx, MZ_TRIM_MEMORY_COMPLETE) == MZ_OK && log.calls == 5, "trim: %d calls", log.calls);
  if (check_action(&log, "onTrimMemory(80)", 3, false)) return 1;
  CHECK(mz_pressure_submit(ctx, 4, "bad") == MZ_ERR_INVALID_ARG && log.calls == 5, "level 4 reached on_action");
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.events == events_before + 5, "events %u, want %u",
        (unsigned)st.events, (unsigned)events_before + 5);
  CHECK(st.bytes_freed - freed_before == log.freed_sum, "on_action freed %llu in all, the statistics %llu",
        (unsigned long long)log.freed_sum, (unsigned long long)(st.bytes_freed - freed_before));

  /* A declared generation: a low event waits for its end (MZ_ERR_BUSY: queued), applied on this
   * thread by set_generating(false); a critical one is applied at once (no call holds ctx). */
  CHECK(mz_decode(ctx, toks, n, false) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(mz_pressure_set_generating(ctx, true) == MZ_OK && mz_pressure_set_generating(ctx, true) == MZ_OK,
        "set_generating(true)");
  reset_log(&log);
  rc = mz_pressure_submit(ctx, 1, "during");
  CHECK(rc == MZ_ERR_BUSY, "low during a generation = %d (%s), want MZ_ERR_BUSY", rc, mz_status_str(rc));
  CHECK(log.calls == 0, "on_action called for a queued event");
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.pending == 1, "pending %d", (int)st.pending);
  CHECK(mz_pressure_set_generating(ctx, false) == MZ_OK, "set_generating(false)");
  CHECK(log.calls == 1, "the queued event: %d on_action calls after the generation", log.calls);
  if (check_action(&log, "during", 1, true)) return 1;
  CHECK(mz_pressure_get_stats(ctx, &st) == MZ_OK && st.pending == 0, "still pending after the generation");
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(mz_pressure_set_generating(ctx, true) == MZ_OK, "set_generating(true)");
  rc = mz_pressure_submit(ctx, 3, "critical during");
  CHECK(rc == MZ_OK && log.calls == 2, "critical during a generation: %d, %d calls", rc, log.calls);
  if (check_action(&log, "critical during", 3, false)) return 1;
  /* ... and a watcher started during a declared generation begins in it. */
  CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop");
  CHECK(mz_pressure_watch_reason(ctx, why, (int32_t)sizeof why) == 0 && why[0] == '\0', "a reason after stop: \"%s\"", why);
  reset_log(&log);
  CHECK(mz_pressure_watch_start(ctx, &pp) == MZ_OK, "restart: %s", mz_last_error());
  CHECK(mz_decode(ctx, &t, 1, false) == MZ_OK, "decode: %s", mz_last_error());
  rc = mz_pressure_submit(ctx, 2, "queued");
  CHECK(rc == MZ_ERR_BUSY && log.calls == 0, "medium during a generation begun before the watcher: %d (%d calls)", rc,
        log.calls);
  CHECK(mz_pressure_set_generating(ctx, false) == MZ_OK && log.calls == 1, "end: %d calls", log.calls);
  if (check_action(&log, "queued", 2, true)) return 1;
  CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop");

  /* A 0.9 params struct (it ends at restore_margin, tail padding included): accepted, on_action
   * and user not read. */
  {
    struct action_log other;
    reset_log(&other);
    struct mz_pressure_params old = mz_pressure_default_params();
    const size_t end = offsetof(struct mz_pressure_params, restore_margin) + sizeof old.restore_margin;
    const size_t align = offsetof(struct mz_pressure_params, on_action);
    CHECK(align >= end && align - end < sizeof(void*), "layout: on_action at %zu, restore_margin ends at %zu", align, end);
    old.struct_size = (uint32_t)align; /* the 0.9 sizeof */
    old.source = "manual";
    old.on_action = on_action;
    old.user = &other;
    CHECK(mz_pressure_watch_start(ctx, &old) == MZ_OK, "a 0.9-size pressure struct refused: %s", mz_last_error());
    CHECK(mz_pressure_submit(ctx, 3, "old") == MZ_OK, "submit: %s", mz_last_error());
    CHECK(other.calls == 0, "on_action of a 0.9 struct (beyond its struct_size) was called");
    CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop");
    /* A size inside a field (half of on_action) is no header's: refused, never half-copied. */
    old.struct_size = (uint32_t)(align + 4);
    CHECK(mz_pressure_watch_start(ctx, &old) == MZ_ERR_INVALID_ARG, "struct_size %u (inside on_action) accepted",
          (unsigned)old.struct_size);
  }
  /* After mz_pressure_watch_stop, the stopped watcher's on_action is never called again (its user
   * data may be freed); submit and onTrimMemory go on unreported. */
  {
    struct action_log after;
    reset_log(&after);
    struct mz_pressure_params pp = mz_pressure_default_params();
    pp.source = "manual";
    pp.on_action = on_action;
    pp.user = &after;
    CHECK(mz_pressure_watch_start(ctx, &pp) == MZ_OK, "watch: %s", mz_last_error());
    CHECK(mz_pressure_submit(ctx, 1, "before stop") == MZ_OK && after.calls == 1, "on_action before stop: %d calls",
          after.calls);
    CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "stop");
    CHECK(mz_pressure_submit(ctx, 3, "after stop") == MZ_OK, "submit after stop: %s", mz_last_error());
    CHECK(mz_on_trim_memory(ctx, 80) == MZ_OK, "trim after stop: %s", mz_last_error());
    CHECK(after.calls == 1, "on_action called %d times after mz_pressure_watch_stop", after.calls - 1);
  }
  mz_context_free(ctx);
  return 0;
}

/* on_event: every call recorded. */
struct event_log {
  int calls;
  int32_t from, to, wanted, status;
  bool refused;
  char reason[16], why[160], error[128];
};
static void on_event(const struct mz_sustained_event* ev, void* user) {
  struct event_log* log = (struct event_log*)user;
  log->calls++;
  log->from = ev->from;
  log->to = ev->to;
  log->wanted = ev->wanted;
  log->status = ev->status;
  log->refused = ev->refused;
  snprintf(log->reason, sizeof log->reason, "%s", ev->reason ? ev->reason : "(null)");
  snprintf(log->why, sizeof log->why, "%s", ev->why ? ev->why : "(null)");
  snprintf(log->error, sizeof log->error, "%s", ev->error ? ev->error : "(null)");
}

static int write_text(const char* dir, const char* name, const char* text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE* f = fopen(p, "w");
  if (!f) return -1;
  const int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* One decode of a token after the window (1 ms) has passed: sustained mode decides after it. */
static int decode_after_window(mz_context* ctx, mz_token t) {
  const struct timespec ms5 = {0, 5000000};
  nanosleep(&ms5, NULL);
  return mz_decode(ctx, &t, 1, false);
}

/* Sustained mode 0.10: on_event on a fake thermal tree (a cpu zone with a passive trip at 90 C: high
 * mark 85 C; a battery zone without trips) heating and cooling; mz_context_get_sustained_info; the
 * thermal_zone filter; struct_size of 0.10 and of 0.9 (ending at thermal_root: the new fields are
 * not read). */
static int check_sustained(mz_model* model, const mz_token* toks, int32_t n) {
  struct mz_sustained_params sp = mz_sustained_default_params();
  CHECK(sp.struct_size == sizeof(struct mz_sustained_params), "sustained params struct_size %u, sizeof %zu",
        (unsigned)sp.struct_size, sizeof(struct mz_sustained_params));
  CHECK(sp.thermal_root == NULL && sp.thermal_zone == NULL && sp.on_event == NULL && sp.user == NULL,
        "sustained defaults: thermal_zone / on_event / user not NULL");
  struct mz_sustained_info info;
  CHECK(mz_context_get_sustained_info(NULL, &info) == MZ_ERR_INVALID_ARG, "info on NULL ctx accepted");

  char root[] = "/tmp/mzcache-c-api-thermal-XXXXXX";
  CHECK(mkdtemp(root) != NULL, "mkdtemp failed");
  char z0[300], z1[300];
  snprintf(z0, sizeof z0, "%s/thermal_zone0", root);
  snprintf(z1, sizeof z1, "%s/thermal_zone1", root);
  CHECK(mkdir(z0, 0755) == 0 && mkdir(z1, 0755) == 0, "mkdir under %s", root);
  CHECK(write_text(z0, "type", "cpu-test\n") == 0 && write_text(z0, "temp", "60000\n") == 0 &&
            write_text(z0, "trip_point_0_type", "passive\n") == 0 &&
            write_text(z0, "trip_point_0_temp", "90000\n") == 0 && write_text(z1, "type", "battery\n") == 0 &&
            write_text(z1, "temp", "30000\n") == 0,
        "cannot write the fake thermal tree");

  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  mz_context* ctx = NULL;
  CHECK(mz_context_new(model, &cp, &ctx) == MZ_OK, "mz_context_new: %s", mz_last_error());
  CHECK(mz_context_set_threads(ctx, 2, NULL, 0) == MZ_OK, "set_threads(2): %s", mz_last_error());
  memset(&info, 0x7f, sizeof info);
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && info.enabled == 0 && info.threads == 0 &&
            info.max_threads == 0 && info.sensors[0] == '\0',
        "info with sustained mode off: enabled %d threads %d", (int)info.enabled, (int)info.threads);
  CHECK(mz_context_get_sustained_info(ctx, NULL) == MZ_ERR_INVALID_ARG, "NULL out accepted");
  CHECK(mz_decode(ctx, toks, n, false) == MZ_OK, "decode: %s", mz_last_error());

  struct event_log log;
  memset(&log, 0, sizeof log);
  sp = mz_sustained_default_params();
  sp.thermal_root = root;
  sp.min_interval_s = 0;
  sp.hold_up_s = 0;
  sp.drift = 0;
  sp.window_s = 0.001f;
  sp.on_event = on_event;
  sp.user = &log;
  CHECK(mz_context_set_sustained(ctx, &sp) == MZ_OK, "enable: %s", mz_last_error());
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK, "info");
  CHECK(info.enabled == 1 && info.min_threads == 1 && info.max_threads == 2 && info.threads == 2,
        "info: enabled %d, threads %d in [%d, %d]", (int)info.enabled, (int)info.threads, (int)info.min_threads,
        (int)info.max_threads);
  CHECK(info.sensors[0] != '\0' && strstr(info.sensors, "1 of 2 thermal zones watched") != NULL, "sensors \"%s\"",
        info.sensors);
  printf("sustained sensors: %s\n", info.sensors);

  /* Cool (60 C < 85 - 5), at the cap: no change, no event. */
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 0, "an event without a change: %s %d -> %d", log.reason, (int)log.from, (int)log.to);
  /* Hot: one thread down, reported. */
  CHECK(write_text(z0, "temp", "86000\n") == 0, "heat");
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 1, "%d events after the heat", log.calls);
  CHECK(log.from == 2 && log.to == 1 && log.wanted == 1 && !log.refused && strcmp(log.reason, "hot") == 0,
        "event %d -> %d (wanted %d) refused %d reason \"%s\"", (int)log.from, (int)log.to, (int)log.wanted,
        (int)log.refused, log.reason);
  CHECK(strstr(log.why, "86.0") != NULL, "why \"%s\" does not name the temperature", log.why);
  CHECK(log.status == MZ_OK && log.error[0] == '\0', "status %d error \"%s\"", (int)log.status, log.error);
  int32_t nt = 0;
  mz_context_get_threads(ctx, &nt, NULL, 0);
  CHECK(nt == 1, "the context computes with %d threads after the step down", (int)nt);
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && info.threads == 1, "info.threads %d", (int)info.threads);
  /* Still hot at min_threads: nothing to do. */
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 1, "an event at min_threads (%d calls)", log.calls);
  /* Cool again (hold_up 0): back up. */
  CHECK(write_text(z0, "temp", "40000\n") == 0, "cool");
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 2 && log.from == 1 && log.to == 2 && log.wanted == 2 && !log.refused &&
            strcmp(log.reason, "cool") == 0 && strstr(log.why, "40.0") != NULL,
        "after cooling: %d events, last %d -> %d (wanted %d) \"%s\": %s", log.calls, (int)log.from, (int)log.to,
        (int)log.wanted, log.reason, log.why);
  struct mz_sustained_stats ss;
  CHECK(mz_context_get_sustained_stats(ctx, &ss) == MZ_OK && ss.steps_down == 1 && ss.steps_up == 1 && ss.threads == 2,
        "stats: %d down, %d up, %d threads", (int)ss.steps_down, (int)ss.steps_up, (int)ss.threads);

  /* The thermal_zone filter: only zones whose type contains it. */
  memset(&log, 0, sizeof log);
  sp.thermal_zone = "battery";
  CHECK(mz_context_set_sustained(ctx, &sp) == MZ_OK, "thermal_zone battery: %s", mz_last_error());
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && strstr(info.sensors, "none with a trip point") != NULL,
        "battery only: \"%s\"", info.sensors);
  sp.thermal_zone = "no-such-zone";
  CHECK(mz_context_set_sustained(ctx, &sp) == MZ_OK, "thermal_zone no-such-zone: %s", mz_last_error());
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && strstr(info.sensors, "no thermal sensors") != NULL &&
            strstr(info.sensors, "no-such-zone") != NULL,
        "no zone: \"%s\"", info.sensors);
  CHECK(write_text(z0, "temp", "86000\n") == 0, "heat");
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 0, "a filtered-out zone stepped the threads: %s", log.why);
  sp.thermal_zone = "cpu";
  CHECK(mz_context_set_sustained(ctx, &sp) == MZ_OK, "thermal_zone cpu: %s", mz_last_error());
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && strstr(info.sensors, "1 of 1 thermal zones watched") != NULL,
        "cpu only: \"%s\"", info.sensors);
  CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
  CHECK(log.calls == 1 && strcmp(log.reason, "hot") == 0 && log.from == 2 && log.to == 1, "cpu zone hot: %d events",
        log.calls);

  /* A 0.9 struct (ending at thermal_root): accepted; thermal_zone, on_event and user not read. */
  {
    struct event_log other;
    memset(&other, 0, sizeof other);
    struct mz_sustained_params old = sp;
    old.struct_size = (uint32_t)(offsetof(struct mz_sustained_params, thermal_root) + sizeof old.thermal_root);
    CHECK(old.struct_size < sizeof old && old.struct_size % sizeof(void*) == 0, "0.9 size %u", (unsigned)old.struct_size);
    old.thermal_zone = "no-such-zone";
    old.on_event = on_event;
    old.user = &other;
    CHECK(mz_context_set_sustained(ctx, &old) == MZ_OK, "a 0.9-size struct refused: %s", mz_last_error());
    CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && info.threads == 2 &&
              strstr(info.sensors, "1 of 2 thermal zones watched") != NULL,
          "0.9 struct: thermal_zone read? threads %d, \"%s\"", (int)info.threads, info.sensors);
    CHECK(decode_after_window(ctx, toks[0]) == MZ_OK, "decode: %s", mz_last_error());
    mz_context_get_threads(ctx, &nt, NULL, 0);
    CHECK(nt == 1, "0.9 struct: hot did not step down (%d threads)", (int)nt);
    CHECK(other.calls == 0, "on_event of a 0.9 struct (beyond its struct_size) was called");
    old.struct_size = sizeof old + 8;
    CHECK(mz_context_set_sustained(ctx, &old) == MZ_ERR_INVALID_ARG, "a larger struct_size accepted");
    /* inside thermal_zone (its first half): no header's size */
    old.struct_size = (uint32_t)(offsetof(struct mz_sustained_params, thermal_zone) + 4);
    CHECK(mz_context_set_sustained(ctx, &old) == MZ_ERR_INVALID_ARG, "struct_size %u (inside thermal_zone) accepted",
          (unsigned)old.struct_size);
  }
  CHECK(mz_context_set_sustained(ctx, NULL) == MZ_OK, "disable: %s", mz_last_error());
  CHECK(mz_context_get_sustained_info(ctx, &info) == MZ_OK && info.enabled == 0 && info.sensors[0] == '\0',
        "info after disabling: enabled %d", (int)info.enabled);
  mz_context_get_threads(ctx, &nt, NULL, 0);
  CHECK(nt == 2, "disabling did not put back 2 threads: %d", (int)nt);
  CHECK(mz_context_n_tokens(ctx) == n + 7, "the conversation: %d tokens, want %d", (int)mz_context_n_tokens(ctx),
        (int)n + 7);
  mz_context_free(ctx);

  const char* files[] = {"thermal_zone0/type", "thermal_zone0/temp", "thermal_zone0/trip_point_0_type",
                         "thermal_zone0/trip_point_0_temp", "thermal_zone1/type", "thermal_zone1/temp"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, files[i]);
    remove(p);
  }
  CHECK(rmdir(z0) == 0 && rmdir(z1) == 0 && rmdir(root) == 0, "%s not empty", root);
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
    /* Repacked (since 0.16): loads and decodes; the same argmax (where this CPU repacks the
     * model's types the sums run in another order, so not bit for bit: tests/test_repack.cpp). */
    mp.weight_memory = MZ_WEIGHTS_REPACKED;
    mz_model* rp = NULL;
    rc = mz_model_load(path, &mp, &rp);
    CHECK(rc == MZ_OK, "mz_model_load(repacked) = %d (%s)", rc, mz_last_error());
    CHECK(mz_context_new(rp, &cp, &c2) == MZ_OK, "mz_context_new(repacked)");
    CHECK(mz_decode(c2, toks, n, false) == MZ_OK, "mz_decode(repacked): %s", mz_last_error());
    CHECK(argmax(mz_get_logits(c2, 0), info.n_vocab) == argmax(mz_get_logits(ctx, 0), info.n_vocab),
          "argmax differs between page-cache and repacked weights");
    mz_context_free(c2);
    mz_model_free(rp);
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
  if (check_get_threads(model) || check_session_info(model, toks, n) || check_pressure_submit(model, toks, n) ||
      check_sustained(model, toks, n))
    return 1;
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
/* Since 0.15: two pools (the model loaded twice: two "models") under one mz_budget. The idle one
 * gives back first (its conversation, then its weights); the 0.14 size of mz_pool_params is still
 * accepted; a pool with a budget of its own beside the shared one is refused. */
static int check_budget(const char* path) {
  CHECK(mz_budget_default_params().struct_size == sizeof(struct mz_budget_params), "budget params struct_size");
  mz_model* m1 = NULL;
  mz_model* m2 = NULL;
  CHECK(mz_model_load(path, NULL, &m1) == MZ_OK && mz_model_load(path, NULL, &m2) == MZ_OK, "load: %s", mz_last_error());
  CHECK(mz_model_verify_file(m1) == MZ_OK, "verify_file: %s", mz_last_error());
  CHECK(mz_model_verify_file(NULL) == MZ_ERR_INVALID_ARG, "verify_file(NULL)");
  {
    char t[16];
    const int32_t n = mz_model_get_text(m1, MZ_MODEL_TEXT_CHAT_TEMPLATE, NULL, 0);
    CHECK(n > 0, "the tiny model's chat template: %d", (int)n);
    CHECK(mz_model_get_text(m1, MZ_MODEL_TEXT_CHAT_TEMPLATE, t, sizeof t) == n && strlen(t) == sizeof t - 1,
          "a truncated copy returns the full length");
    CHECK(mz_model_get_text(m1, MZ_MODEL_TEXT_EOS, t, sizeof t) > 0, "eos text");
    CHECK(mz_model_get_text(m1, 7, t, sizeof t) == MZ_ERR_INVALID_ARG, "an unknown text accepted");
    CHECK(mz_model_get_text(m1, MZ_MODEL_TEXT_BOS, NULL, 4) == MZ_ERR_INVALID_ARG, "NULL buf with cap accepted");
  }
  mz_budget* b = NULL;
  struct mz_budget_params bp = mz_budget_default_params();
  bp.memory_budget = 1; /* everything over: every pass gives back all it may */
  CHECK(bp.pass_after_return, "pass_after_return defaults to true (0.19)");
  {
    struct mz_budget_params old = bp; /* the 0.15-0.18 size: no pass_after_return (true) */
    old.struct_size = (uint32_t)offsetof(struct mz_budget_params, pass_after_return);
    mz_budget* b18 = NULL;
    CHECK(mz_budget_new(&old, &b18) == MZ_OK && b18, "0.18 budget params: %s", mz_last_error());
    CHECK(mz_budget_settle(b18) == MZ_OK, "settle with no pool");
    mz_budget_free(b18);
  }
  bp.pass_after_return = false;
  CHECK(mz_budget_new(&bp, &b) == MZ_OK && b, "mz_budget_new: %s", mz_last_error());
  bp.pass_after_return = true;
  char d1[256], d2[256];
  const char* tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(d1, sizeof d1, "%s/mz-c-budget1-%d", tmp, (int)getpid());
  snprintf(d2, sizeof d2, "%s/mz-c-budget2-%d", tmp, (int)getpid());
  struct mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 512;
  cp.kv_chunk_tokens = 64;
  struct mz_pool_params pp = mz_pool_default_params();
  CHECK(pp.shared_budget == NULL, "shared_budget defaults to NULL");
  pp.context = &cp;
  pp.shared_budget = b;
  pp.memory_budget = 1 << 20;
  pp.dir = d1;
  mz_pool* p1 = NULL;
  mz_pool* p2 = NULL;
  CHECK(mz_pool_new(m1, &pp, &p1) == MZ_ERR_INVALID_ARG && !p1, "a pool with its own budget in a shared one accepted");
  pp.memory_budget = 0;
  CHECK(mz_pool_new(m1, &pp, &p1) == MZ_OK, "pool 1: %s", mz_last_error());
  mz_budget_free(b); /* the pools hold it */
  {
    struct mz_pool_params old = pp; /* the 0.14 size: no shared_budget (its own pool, no budget) */
    old.struct_size = (uint32_t)offsetof(struct mz_pool_params, shared_budget);
    old.dir = d2;
    mz_pool* p0 = NULL;
    CHECK(mz_pool_new(m2, &old, &p0) == MZ_OK, "0.14 pool params: %s", mz_last_error());
    mz_pool_free(p0);
  }
  pp.dir = d2;
  mz_budget* b2 = NULL;
  CHECK(mz_budget_new(&bp, &b2) == MZ_OK, "budget 2");
  pp.shared_budget = b2;
  CHECK(mz_pool_new(m2, &pp, &p2) == MZ_OK, "pool 2 (its own budget): %s", mz_last_error());
  mz_token t[130];
  for (int i = 0; i < 130; ++i) t[i] = 100 + (i * 53) % 3000;
  mz_conversation* c1 = NULL;
  CHECK(mz_pool_open(p1, "x", &c1) == MZ_OK && mz_conversation_decode(c1, t, 130, false) == MZ_OK, "decode 1: %s",
        mz_last_error());
  CHECK(mz_conversation_commit(c1) == MZ_OK, "commit 1");
  {
    /* Since 0.19: b runs the pass after a call inside it (pass_after_return false), so the call
     * report has its time; the deferred default is checked on b2 below. */
    struct mz_call_report cr;
    CHECK(mz_conversation_get_call_report(c1, &cr) == MZ_OK && cr.pass_s > 0 && cr.room_s >= 0,
          "call report: pass %.6f s inside the call", cr.pass_s);
    CHECK(mz_conversation_get_call_report(NULL, &cr) == MZ_ERR_INVALID_ARG, "call report of NULL");
    CHECK(mz_budget_settle(NULL) == MZ_ERR_INVALID_ARG, "settle NULL");
  }
  struct mz_pool_weights_report w;
  CHECK(mz_pool_get_weights_report(p1, &w) == MZ_OK, "weights report: %s", mz_last_error());
  CHECK(!w.in_use && w.units > 1 && w.resident + w.dropped == w.total && w.units_resident < w.units && w.last_use_unix_ms > 0,
        "pool 1 alone over a 1-byte budget: %d of %d units resident, in use %d", (int)w.units_resident, (int)w.units,
        (int)w.in_use);
  {
    /* b2 (pass_after_return, the default): the pass after p2's call runs on the budget's thread,
     * not inside the call; once settled, p2 alone over a 1-byte budget gave its weights back. */
    mz_conversation* c2 = NULL;
    CHECK(mz_pool_open(p2, "y", &c2) == MZ_OK && mz_conversation_decode(c2, t, 130, false) == MZ_OK, "decode 2: %s",
          mz_last_error());
    struct mz_call_report cr;
    CHECK(mz_conversation_get_call_report(c2, &cr) == MZ_OK && cr.pass_s == 0, "deferred pass inside the call: %.6f s",
          cr.pass_s);
    CHECK(mz_budget_settle(b2) == MZ_OK, "settle: %s", mz_last_error());
    struct mz_pool_weights_report w2;
    CHECK(mz_pool_get_weights_report(p2, &w2) == MZ_OK && w2.units_resident < w2.units,
          "the deferred pass gave back p2's weights: %d of %d units resident", (int)w2.units_resident, (int)w2.units);
    CHECK(mz_conversation_commit(c2) == MZ_OK, "commit 2");
    mz_conversation_release(c2);
  }
  uint64_t freed = 0;
  CHECK(mz_budget_evict(b2, UINT64_MAX, &freed) == MZ_OK, "evict: %s", mz_last_error());
  CHECK(mz_budget_evict(NULL, 1, &freed) == MZ_ERR_INVALID_ARG, "evict NULL");
  CHECK(mz_budget_on_trim_memory(b2, 80, &freed) == MZ_OK, "trim: %s", mz_last_error());
  struct mz_budget_report r;
  CHECK(mz_budget_get_report(b2, &r) == MZ_OK && r.n_pools == 1 && r.memory_budget == 1 && r.evict_calls == 1,
        "budget 2 report: %d pools, %llu evict calls", (int)r.n_pools, (unsigned long long)r.evict_calls);
  mz_conversation_release(c1);
  mz_pool_free(p1);
  mz_pool_free(p2);
  mz_budget_free(b2);
  mz_model_free(m1);
  mz_model_free(m2);
  remove_tree(d1);
  remove_tree(d2);
  return 0;
}

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
  /* The shared forward pass (since 0.13): on by default; every call above went through it. b's
   * turn is open (restore_generate, not committed): in use. Cancel without a call in flight is a
   * no-op for later calls. */
  {
    struct mz_pool_batch_report br;
    CHECK(mz_pool_get_batch_report(pool, NULL) == MZ_ERR_INVALID_ARG, "batch report without out");
    CHECK(mz_pool_get_batch_report(pool, &br) == MZ_OK && br.batching && br.steps >= 2 && br.tokens >= 208 &&
              br.compute_buffer_bytes > 0 && br.max_batch >= 1 && br.in_use == 1,
          "batch report: batching %d, %llu steps, %llu tokens, %llu buffer bytes, in use %d", (int)br.batching,
          (unsigned long long)br.steps, (unsigned long long)br.tokens, (unsigned long long)br.compute_buffer_bytes,
          (int)br.in_use);
    CHECK(mz_conversation_cancel(NULL) == MZ_ERR_INVALID_ARG, "cancel NULL");
    CHECK(mz_conversation_cancel(a) == MZ_OK, "cancel a: %s", mz_last_error());
  }
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
  /* The 3 shared chunks are stored once, in chunk files the stored files (a, and b if written) name (since 0.11). */
  struct mz_pool_stored_report sr;
  CHECK(mz_pool_get_stored_report(pool, NULL) == MZ_ERR_INVALID_ARG, "stored report without out");
  CHECK(mz_pool_get_stored_report(pool, &sr) == MZ_OK && sr.chunk_files == 3 && sr.chunk_file_refs >= 3 && sr.chunk_file_refs % 3 == 0 &&
            sr.chunk_file_bytes > 0 && sr.chunk_files_damaged == 0,
        "stored report: %d chunk files, %llu refs, %llu bytes", (int)sr.chunk_files,
        (unsigned long long)sr.chunk_file_refs, (unsigned long long)sr.chunk_file_bytes);
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
  /* One conversation's memory back and given back on request, and evictions by reason (0.14). a was
   * opened from its stored file (its storage tier): restore brings its KV into RAM, evict gives it
   * back; b is stored only (nothing in RAM). */
  {
    uint64_t got = 0, gone = 0;
    struct mz_conversation_report cr;
    struct mz_pool_event_report er;
    CHECK(mz_pool_restore_conversation(pool, "a", &got) == MZ_OK && got > 0, "restore a: %llu (%s)",
          (unsigned long long)got, mz_last_error());
    CHECK(mz_pool_conversation_report(pool, "a", &cr) == MZ_OK && cr.kv_resident > 0, "a not resident after restore");
    CHECK(mz_pool_evict_conversation(pool, "a", &gone) == MZ_OK && gone > 0, "evict a: %llu", (unsigned long long)gone);
    CHECK(mz_pool_conversation_report(pool, "a", &cr) == MZ_OK && cr.kv_resident == 0 && cr.kv_mem_compressed + cr.kv_storage > 0,
          "a after evict: %llu resident", (unsigned long long)cr.kv_resident);
    CHECK(mz_pool_evict_conversation(pool, "b", &gone) == MZ_OK && gone == 0, "evict stored-only b: %llu",
          (unsigned long long)gone);
    CHECK(mz_pool_evict_conversation(pool, "nobody", &gone) == MZ_ERR_INVALID_ARG, "evict of an unknown id");
    uint64_t none = 1;
    CHECK(mz_pool_restore_conversation(pool, "nobody", &none) == MZ_ERR_INVALID_ARG && none == 0,
          "restore of an unknown id");
    CHECK(mz_pool_list(pool, NULL, 0) == 2, "restore of an unknown id created one");
    CHECK(mz_pool_evict_conversation(NULL, "a", NULL) == MZ_ERR_INVALID_ARG &&
              mz_pool_restore_conversation(pool, NULL, NULL) == MZ_ERR_INVALID_ARG,
          "NULL arguments accepted");
    CHECK(mz_pool_evict(pool, 1, NULL) == MZ_OK && mz_pool_on_trim_memory(pool, 80, NULL) == MZ_OK, "evict/trim");
    CHECK(mz_pool_get_event_report(pool, NULL) == MZ_ERR_INVALID_ARG, "event report without out");
    CHECK(mz_pool_get_event_report(pool, &er) == MZ_OK && er.evict_conversation == 1 &&
              er.evict_conversation_bytes > 0 && er.evict_manual == 1 && er.trim_events == 1 && er.evict_trim == 1 &&
              er.pressure_events == 0 && er.conversation_restores == 1 && er.conversation_restored_bytes == got,
          "event report: conversation %llu (%llu B), manual %llu, trim %llu/%llu, restores %llu",
          (unsigned long long)er.evict_conversation, (unsigned long long)er.evict_conversation_bytes,
          (unsigned long long)er.evict_manual, (unsigned long long)er.trim_events, (unsigned long long)er.evict_trim,
          (unsigned long long)er.conversation_restores);
  }
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
  /* The remote tier (0.15): none by default (its report says so; flush_remote is a no-op); a
   * remote_url without dir, a rediss:// URL with a CA file that cannot be read, a CA file with a
   * redis:// URL (0.18) and a bad URL are refused; a 0.13-0.14 struct_size (ending before
   * remote_url), a 0.15-0.17 one (ending before remote_ca_file) and a 0.18 one (ending before
   * remote_prefix_whole) are still accepted. */
  {
    struct mz_pool_remote_report rr;
    CHECK(mz_pool_get_remote_report(pool, NULL) == MZ_ERR_INVALID_ARG, "remote report without out");
    CHECK(mz_pool_get_remote_report(pool, &rr) == MZ_OK && !rr.enabled && !rr.degraded && rr.pending == 0,
          "remote report of a pool without one");
    CHECK(mz_pool_flush_remote(pool) == MZ_OK, "flush_remote without a remote tier: %s", mz_last_error());
    /* 0.19: the fetch-or-compute counters; all 0 without a remote tier */
    struct mz_pool_remote_fetch_report rf;
    memset(&rf, 0xff, sizeof rf);
    CHECK(mz_pool_get_remote_fetch_report(pool, NULL) == MZ_ERR_INVALID_ARG, "remote fetch report without out");
    CHECK(mz_pool_get_remote_fetch_report(NULL, &rf) == MZ_ERR_INVALID_ARG, "remote fetch report without pool");
    CHECK(mz_pool_get_remote_fetch_report(pool, &rf) == MZ_OK && rf.prefix_chunks == 0 &&
              rf.fetches_skipped_slower == 0 && rf.chunks_skipped_slower == 0 && rf.streaming == 0,
          "remote fetch report of a pool without a remote tier");
    struct mz_pool_params rp = mz_pool_default_params();
    CHECK(!rp.remote_prefix_whole, "remote_prefix_whole defaults to false (streamed)");
    CHECK(rp.remote_url == NULL && rp.remote_timeout_ms == 2000 && rp.remote_ttl_s == 604800, "remote defaults");
    rp.context = &cp;
    rp.remote_url = "redis://127.0.0.1:1";
    mz_pool* bad = NULL;
    CHECK(mz_pool_new(model, &rp, &bad) == MZ_ERR_INVALID_ARG && !bad, "remote_url without dir accepted");
    char rdir[300];
    snprintf(rdir, sizeof rdir, "%s-remote", dir);
    rp.dir = rdir;
    CHECK(rp.remote_ca_file == NULL && rp.remote_cert_file == NULL && rp.remote_key_file == NULL, "TLS defaults");
    rp.remote_url = "rediss://127.0.0.1:6380";
    rp.remote_ca_file = "/nonexistent/mz-ca.pem";
    CHECK(mz_pool_new(model, &rp, &bad) != MZ_OK && !bad && strstr(mz_last_error(), "mz-ca.pem"),
          "rediss:// with an unreadable CA file accepted or without its name: %s", mz_last_error());
    rp.remote_url = "redis://127.0.0.1:6380";
    CHECK(mz_pool_new(model, &rp, &bad) == MZ_ERR_INVALID_ARG && !bad && strstr(mz_last_error(), "rediss://"),
          "a CA file with redis:// accepted: %s", mz_last_error());
    rp.remote_ca_file = NULL;
    rp.remote_url = "http://127.0.0.1:6379";
    CHECK(mz_pool_new(model, &rp, &bad) == MZ_ERR_INVALID_ARG && !bad, "a non-redis URL accepted");
    struct mz_pool_params old = mz_pool_default_params();
    old.struct_size = (uint32_t)offsetof(struct mz_pool_params, shared_budget);
    old.context = &cp;
    mz_pool* p14 = NULL;
    CHECK(mz_pool_new(model, &old, &p14) == MZ_OK && p14, "a 0.14 struct_size refused: %s", mz_last_error());
    mz_pool_free(p14);
    old.struct_size = (uint32_t)offsetof(struct mz_pool_params, remote_ca_file);
    mz_pool* p17 = NULL;
    CHECK(mz_pool_new(model, &old, &p17) == MZ_OK && p17, "a 0.17 struct_size refused: %s", mz_last_error());
    mz_pool_free(p17);
    old.struct_size = (uint32_t)offsetof(struct mz_pool_params, remote_prefix_whole);
    mz_pool* p18 = NULL;
    CHECK(mz_pool_new(model, &old, &p18) == MZ_OK && p18, "a 0.18 struct_size refused: %s", mz_last_error());
    mz_pool_free(p18);
    remove_tree(rdir);
  }
  CHECK(mz_pool_delete(pool, "a") == MZ_OK && mz_pool_delete(pool, "b") == MZ_OK, "delete: %s", mz_last_error());
  CHECK(mz_pool_list(pool, NULL, 0) == 0, "conversations left after delete");
  mz_pool_free(pool);
  mz_model_free(model);
  char sw[300];
  snprintf(sw, sizeof sw, "%s/swap", dir);
  rmdir(sw);
  /* The shared chunks' files go with the last stored conversation naming them (since 0.11). */
  snprintf(sw, sizeof sw, "%s/chunks", dir);
  CHECK(rmdir(sw) == 0, "%s not empty after deleting every conversation", sw);
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
  if (check_defaults() || check_missing_file() || check_cpu_list() || check_cpu_clusters() || run_model(path) ||
      check_profile(path) || check_pool(path) || check_budget(path))
    return 1;
  printf("PASS: C API (%s)\n", path);
  return 0;
}
