/*
 * Drives the JNI glue of docs/examples/jni_trim_memory.c (built unchanged into libllmjni.so, linked
 * with -lmzcache -llog as an NDK build links it) the way the Java side would call it, with a fake
 * JNIEnv that implements only the two JNI functions the glue uses (any other one is NULL: calling it
 * crashes, which fails the run). Run by scripts/test-arm64.sh under qemu-aarch64 against the AArch64
 * libmzcache.so.
 *
 * The pool glue, docs/examples/jni_pool_lifecycle.c, is compiled into this program (included below,
 * unchanged) so that the checks can put a conversation in the pool the glue made; the build also
 * makes it a shared library of its own, as an app would.
 *
 * Usage: jni_driver MODEL.gguf DIR  exit 0 when every check passed, 1 otherwise (each failure named);
 *                                   DIR: an empty folder for the pool's stored conversations
 *
 * Checks of jni_trim_memory.c (its contract as its comments state it):
 *   - nativeCreate of a missing file returns 0 and logs "load failed" at ERROR;
 *   - nativeCreate of MODEL returns a handle;
 *   - nativeOnTrimMemory(0, level) returns MZ_ERR_INVALID_ARG;
 *   - TRIM_MEMORY_UI_HIDDEN (20) returns MZ_OK and gives back nothing;
 *   - TRIM_MEMORY_BACKGROUND (40) returns MZ_OK and gives back bytes (logged "gave back N bytes,
 *     R% of LLM memory resident" with N > 0 and R < 100);
 *   - TRIM_MEMORY_COMPLETE (80) returns MZ_OK and leaves at most 1% of the LLM memory resident;
 *   - nativeFree returns (and nativeFree(0) is harmless).
 * Checks of jni_pool_lifecycle.c:
 *   - a null handle is refused by nativeOnTrimMemory and nativeOnStop;
 *   - a conversation decoded in the glue's pool and not committed is stored, every token, once
 *     nativeOnStop returns;
 *   - TRIM_MEMORY_BACKGROUND gives bytes back, and the conversation then continues;
 *   - after nativeFree, a new pool on the same folder finds the conversation with all its tokens.
 */
#include <jni.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "android/log.h"
#include "mzcache.h"

/* The glue's exported functions (docs/examples/jni_trim_memory.c). */
JNIEXPORT jlong JNICALL Java_com_example_llm_LlmApplication_nativeCreate(JNIEnv* env, jclass cls, jstring path);
JNIEXPORT jint JNICALL Java_com_example_llm_LlmApplication_nativeOnTrimMemory(JNIEnv* env, jclass cls, jlong handle,
                                                                              jint level);
JNIEXPORT void JNICALL Java_com_example_llm_LlmApplication_nativeFree(JNIEnv* env, jclass cls, jlong handle);
const char* mz_test_log_last(int prio); /* tests/android/liblog_shim.c */

#include "../../docs/examples/jni_pool_lifecycle.c"

/* A jstring here is a pointer to a NUL-terminated UTF-8 string (modified UTF-8 = UTF-8 for paths). */
static int strings_held;
static const char* JNICALL FakeGetStringUTFChars(JNIEnv* env, jstring s, jboolean* is_copy) {
  (void)env;
  if (is_copy) *is_copy = JNI_FALSE;
  ++strings_held;
  return (const char*)s;
}
static void JNICALL FakeReleaseStringUTFChars(JNIEnv* env, jstring s, const char* chars) {
  (void)env;
  (void)s;
  (void)chars;
  --strings_held;
}

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      ++failures;                                          \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

/* Parses the glue's INFO line "onTrimMemory(L): gave back N bytes, R% of LLM memory resident". */
static int LastTrim(int level, unsigned long long* freed, double* resident) {
  int l = -1;
  return sscanf(mz_test_log_last(ANDROID_LOG_INFO), "onTrimMemory(%d): gave back %llu bytes, %lf%%", &l, freed,
                resident) == 3 &&
         l == level;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf DIR\n", argv[0]);
    return 2;
  }
  struct JNINativeInterface_ fns;
  memset(&fns, 0, sizeof fns);
  fns.GetStringUTFChars = FakeGetStringUTFChars;
  fns.ReleaseStringUTFChars = FakeReleaseStringUTFChars;
  JNIEnv env_value = &fns;
  JNIEnv* env = &env_value;

  jlong bad = Java_com_example_llm_LlmApplication_nativeCreate(env, NULL, (jstring) "/nonexistent/model.gguf");
  CHECK(bad == 0, "nativeCreate of a missing file returned a handle");
  CHECK(strstr(mz_test_log_last(ANDROID_LOG_ERROR), "load failed") != NULL, "no 'load failed' error logged: '%s'",
        mz_test_log_last(ANDROID_LOG_ERROR));

  jlong h = Java_com_example_llm_LlmApplication_nativeCreate(env, NULL, (jstring)argv[1]);
  CHECK(h != 0, "nativeCreate(%s) failed: %s", argv[1], mz_test_log_last(ANDROID_LOG_ERROR));
  CHECK(strings_held == 0, "%d jstring(s) not released", strings_held);
  if (h == 0) return 1;

  CHECK(Java_com_example_llm_LlmApplication_nativeOnTrimMemory(env, NULL, 0, 40) == MZ_ERR_INVALID_ARG,
        "a null handle was not refused");
  /* The glue also starts a PSI watcher (optional on a phone). This driver checks the onTrimMemory
   * path alone: the watcher is stopped, and what it may have given back already under the host's
   * own memory pressure (seen once, on a loaded build machine: BACKGROUND then had nothing left to
   * give) is restored, so the trims below start from everything resident. The handle's first field
   * is the model, its second the context (llm_handle in the glue). */
  {
    mz_context* ctx = ((mz_context* const*)(intptr_t)h)[1];
    CHECK(mz_pressure_watch_stop(ctx) == MZ_OK, "watch stop: %s", mz_last_error());
    CHECK(mz_restore(ctx) == MZ_OK, "restore: %s", mz_last_error());
    struct mz_memory_report r;
    CHECK(mz_get_memory_report(ctx, &r) == MZ_OK && r.remaining >= 0.99, "not all resident before the trims: %.2f",
          r.remaining);
  }

  unsigned long long freed = 0;
  double resident = 0;
  int rc = Java_com_example_llm_LlmApplication_nativeOnTrimMemory(env, NULL, h, MZ_TRIM_MEMORY_UI_HIDDEN);
  CHECK(rc == MZ_OK, "UI_HIDDEN: %s", mz_status_str(rc));
  CHECK(LastTrim(MZ_TRIM_MEMORY_UI_HIDDEN, &freed, &resident) && freed == 0,
        "UI_HIDDEN gave memory back or logged no result: '%s'", mz_test_log_last(ANDROID_LOG_INFO));

  rc = Java_com_example_llm_LlmApplication_nativeOnTrimMemory(env, NULL, h, MZ_TRIM_MEMORY_BACKGROUND);
  CHECK(rc == MZ_OK, "BACKGROUND: %s", mz_status_str(rc));
  CHECK(LastTrim(MZ_TRIM_MEMORY_BACKGROUND, &freed, &resident) && freed > 0 && resident < 100.0,
        "BACKGROUND gave nothing back: '%s'", mz_test_log_last(ANDROID_LOG_INFO));
  unsigned long long freed_background = freed;

  rc = Java_com_example_llm_LlmApplication_nativeOnTrimMemory(env, NULL, h, MZ_TRIM_MEMORY_COMPLETE);
  CHECK(rc == MZ_OK, "COMPLETE: %s", mz_status_str(rc));
  CHECK(LastTrim(MZ_TRIM_MEMORY_COMPLETE, &freed, &resident) && freed > 0 && resident <= 1.0,
        "COMPLETE left more than 1%% resident: '%s'", mz_test_log_last(ANDROID_LOG_INFO));

  Java_com_example_llm_LlmApplication_nativeFree(env, NULL, h);
  Java_com_example_llm_LlmApplication_nativeFree(env, NULL, 0);

  /* ---- the pool glue ---- */
  CHECK(Java_com_example_llm_LlmPool_nativeOnTrimMemory(env, NULL, 0, 40) == MZ_ERR_INVALID_ARG, "pool: null handle");
  CHECK(Java_com_example_llm_LlmPool_nativeOnStop(env, NULL, 0) == MZ_ERR_INVALID_ARG, "pool: null handle");
  jlong ph = Java_com_example_llm_LlmPool_nativeCreate(env, NULL, (jstring)argv[1], (jstring)argv[2], 0);
  CHECK(ph != 0, "pool nativeCreate failed: %s", mz_test_log_last(ANDROID_LOG_ERROR));
  CHECK(strings_held == 0, "%d jstring(s) not released", strings_held);
  if (ph == 0) return 1;
  llm_pool* lp = (llm_pool*)(intptr_t)ph;
  mz_conversation* conv = NULL;
  CHECK(mz_pool_open(lp->pool, "chat", &conv) == MZ_OK, "mz_pool_open: %s", mz_last_error());
  if (!conv) return 1;
  mz_token toks[300];
  int32_t n = 0;
  CHECK(mz_tokenize(lp->model,
                    "A phone shares its memory with every other app, and the system takes it back when it needs "
                    "it: an app in the background gets a callback, or nothing at all before it is killed. ",
                    true, false, toks, 300, &n) == MZ_OK && n > 8,
        "mz_tokenize: %s", mz_last_error());
  CHECK(mz_conversation_decode(conv, toks, n, false) == MZ_OK, "decode: %s", mz_last_error());
  rc = Java_com_example_llm_LlmPool_nativeOnStop(env, NULL, ph);
  CHECK(rc == MZ_OK, "pool nativeOnStop: %s", mz_status_str(rc));
  struct mz_conversation_report cr;
  CHECK(mz_pool_conversation_report(lp->pool, "chat", &cr) == MZ_OK && cr.stored_tokens == n,
        "after onStop the stored file holds %d of %d tokens", cr.stored_tokens, n);
  jlong pfreed = Java_com_example_llm_LlmPool_nativeOnTrimMemory(env, NULL, ph, MZ_TRIM_MEMORY_BACKGROUND);
  CHECK(pfreed > 0, "pool BACKGROUND gave back %lld", (long long)pfreed);
  CHECK(mz_conversation_decode(conv, toks, 4, false) == MZ_OK, "decode after trim: %s", mz_last_error());
  CHECK(mz_conversation_n_tokens(conv) == n + 4, "%d tokens after trim, want %d", mz_conversation_n_tokens(conv),
        n + 4);
  mz_conversation_release(conv);
  Java_com_example_llm_LlmPool_nativeFree(env, NULL, ph);
  ph = Java_com_example_llm_LlmPool_nativeCreate(env, NULL, (jstring)argv[1], (jstring)argv[2], 0);
  CHECK(ph != 0, "pool nativeCreate (restart) failed: %s", mz_test_log_last(ANDROID_LOG_ERROR));
  if (ph) {
    lp = (llm_pool*)(intptr_t)ph;
    CHECK(mz_pool_conversation_report(lp->pool, "chat", &cr) == MZ_OK && cr.stored_tokens == n + 4,
          "after a restart the stored conversation holds %d of %d tokens", cr.stored_tokens, n + 4);
    Java_com_example_llm_LlmPool_nativeFree(env, NULL, ph);
  }
  if (failures == 0)
    printf("jni_driver: all checks passed (context: BACKGROUND gave back %llu bytes, COMPLETE %llu more; pool: %d "
           "tokens stored at onStop, BACKGROUND gave back %lld bytes)\n",
           freed_background, freed, n, (long long)pfreed);
  return failures == 0 ? 0 : 1;
}
