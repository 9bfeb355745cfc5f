/*
 * Example JNI glue: forwards Android's Application.onTrimMemory(level) to mz_on_trim_memory(), so
 * the app gives memory back when the system asks instead of being paged out or killed. See
 * docs/pressure.md for the level -> action mapping and docs/android.md for the app's wiring (the
 * pool variant with backgrounding: jni_pool_lifecycle.c). Built for AArch64 against the installed
 * libmzcache.so and driven under qemu by scripts/test-arm64.sh (tests/android/jni_driver.c).
 *
 * Java side:
 *
 *   package com.example.llm;
 *   public final class LlmApplication extends android.app.Application {
 *     static { System.loadLibrary("llmjni"); }
 *     static native long nativeCreate(String modelPath);   // returns a handle (mz_context*)
 *     static native int nativeOnTrimMemory(long handle, int level);
 *     static native void nativeFree(long handle);
 *     long handle;
 *     @Override public void onCreate() { super.onCreate(); handle = nativeCreate(getModelPath()); }
 *     @Override public void onTrimMemory(int level) {
 *       super.onTrimMemory(level);
 *       // Returns at once if a generation is running: the request is queued for its next step.
 *       nativeOnTrimMemory(handle, level);
 *     }
 *   }
 *
 * Backgrounding: when the user switches away Android sends UI_HIDDEN (20), then BACKGROUND (40), and
 * before Android 14 MODERATE (60) and COMPLETE (80); each is forwarded unchanged: nothing for
 * UI_HIDDEN, one escalated step for BACKGROUND, everything above the base unit for COMPLETE. On
 * return nothing is needed here: the next mz_restore_generate restores front layers first,
 * overlapped with its prefill (docs/android.md, "Backgrounding").
 *
 * onTrimMemory runs on the main thread; mz_on_trim_memory never waits for a generation (it
 * returns MZ_ERR_BUSY and queues the request instead), but an idle eviction writes to storage, so
 * apps with very large contexts may prefer to post the call to a background executor.
 */
#include <android/log.h>
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>

#include "mzcache.h"

#define TAG "llmjni"

typedef struct {
  mz_model* model;
  mz_context* ctx;
} llm_handle;

JNIEXPORT jlong JNICALL Java_com_example_llm_LlmApplication_nativeCreate(JNIEnv* env, jclass cls, jstring path) {
  (void)cls;
  const char* p = (*env)->GetStringUTFChars(env, path, NULL);
  llm_handle* h = (llm_handle*)calloc(1, sizeof *h);
  if (!h) return 0;
  int rc = mz_model_load(p, NULL, &h->model);
  (*env)->ReleaseStringUTFChars(env, path, p);
  if (rc == MZ_OK) rc = mz_context_new(h->model, NULL, &h->ctx);
  if (rc != MZ_OK) {
    __android_log_print(ANDROID_LOG_ERROR, TAG, "load failed: %s (%s)", mz_status_str(rc), mz_last_error());
    mz_model_free(h->model);
    free(h);
    return 0;
  }
  /* Optional: also watch PSI where the app may read it (rooted / system apps); on stock Android
   * apps rely on onTrimMemory alone. Failure here is not fatal. */
  struct mz_pressure_params pp = mz_pressure_default_params();
  pp.step_points = 0.25f;
  if (mz_pressure_watch_start(h->ctx, &pp) != MZ_OK)
    __android_log_print(ANDROID_LOG_INFO, TAG, "no pressure watcher: %s", mz_last_error());
  return (jlong)(intptr_t)h;
}

JNIEXPORT jint JNICALL Java_com_example_llm_LlmApplication_nativeOnTrimMemory(JNIEnv* env, jclass cls, jlong handle,
                                                                              jint level) {
  (void)env;
  (void)cls;
  llm_handle* h = (llm_handle*)(intptr_t)handle;
  if (!h) return MZ_ERR_INVALID_ARG;
  int rc = mz_on_trim_memory(h->ctx, (int32_t)level);
  if (rc == MZ_ERR_BUSY) {
    /* A reply is being generated: the request was queued and runs right after the current step. */
    return MZ_OK;
  }
  if (rc != MZ_OK) {
    __android_log_print(ANDROID_LOG_WARN, TAG, "onTrimMemory(%d): %s (%s)", (int)level, mz_status_str(rc),
                        mz_last_error());
    return rc;
  }
  struct mz_pressure_stats st;
  if (mz_pressure_get_stats(h->ctx, &st) == MZ_OK)
    __android_log_print(ANDROID_LOG_INFO, TAG, "onTrimMemory(%d): gave back %llu bytes, %.0f%% of LLM memory resident",
                        (int)level, (unsigned long long)st.last_freed, 100.0 * st.last_remaining);
  return MZ_OK;
}

JNIEXPORT void JNICALL Java_com_example_llm_LlmApplication_nativeFree(JNIEnv* env, jclass cls, jlong handle) {
  (void)env;
  (void)cls;
  llm_handle* h = (llm_handle*)(intptr_t)handle;
  if (!h) return;
  mz_context_free(h->ctx); /* stops the watcher too */
  mz_model_free(h->model);
  free(h);
}
