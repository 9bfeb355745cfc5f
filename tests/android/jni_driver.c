/*
 * Drives the JNI glue of docs/examples/jni_trim_memory.c (built unchanged into libllmjni.so, linked
 * with -lmzcache -llog as an NDK build links it) the way the Java side would call it, with a fake
 * JNIEnv that implements only the two JNI functions the glue uses (any other one is NULL: calling it
 * crashes, which fails the run). Run by scripts/test-arm64.sh under qemu-aarch64 against the AArch64
 * libmzcache.so.
 *
 * Usage: jni_driver MODEL.gguf      exit 0 when every check passed, 1 otherwise (each failure named)
 *
 * Checks (the example's contract as its comments state it):
 *   - nativeCreate of a missing file returns 0 and logs "load failed" at ERROR;
 *   - nativeCreate of MODEL returns a handle;
 *   - nativeOnTrimMemory(0, level) returns MZ_ERR_INVALID_ARG;
 *   - TRIM_MEMORY_UI_HIDDEN (20) returns MZ_OK and gives back nothing;
 *   - TRIM_MEMORY_BACKGROUND (40) returns MZ_OK and gives back bytes (logged "gave back N bytes,
 *     R% of LLM memory resident" with N > 0 and R < 100);
 *   - TRIM_MEMORY_COMPLETE (80) returns MZ_OK and leaves at most 1% of the LLM memory resident;
 *   - nativeFree returns (and nativeFree(0) is harmless).
 */
#include <jni.h>
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
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
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
  if (failures == 0)
    printf("jni_driver: all checks passed (BACKGROUND gave back %llu bytes, COMPLETE %llu more)\n", freed_background,
           freed);
  return failures == 0 ? 0 : 1;
}
