/*
 * Example JNI glue for an app holding many conversations in one mz_pool (docs/android.md):
 * Android's onTrimMemory(level) goes to mz_pool_on_trim_memory(), and the app going to the
 * background (ProcessLifecycleOwner's ON_STOP) persists every changed conversation with
 * mz_pool_flush(), because a backgrounded process can be killed by lmkd at any moment with no
 * further callback. Built for AArch64 and driven under qemu by scripts/test-arm64.sh
 * (tests/android/jni_driver.c), against the installed libmzcache.so.
 *
 * Java side:
 *
 *   package com.example.llm;
 *   public final class LlmPool {
 *     static { System.loadLibrary("llmjni"); }
 *     // dir: where conversations are stored (getFilesDir() + "/conversations"); budget in bytes, 0: none
 *     static native long nativeCreate(String modelPath, String dir, long memoryBudget);
 *     static native long nativeOnTrimMemory(long handle, int level); // bytes given back, or < 0: mz_status
 *     static native int nativeOnStop(long handle);                   // persist now (mz_status)
 *     static native void nativeFree(long handle);
 *   }
 *
 *   public final class LlmApplication extends android.app.Application {
 *     long pool;
 *     @Override public void onCreate() {
 *       super.onCreate();
 *       pool = LlmPool.nativeCreate(modelPath(), getFilesDir() + "/conversations", 0);
 *       ProcessLifecycleOwner.get().getLifecycle().addObserver(new DefaultLifecycleObserver() {
 *         @Override public void onStop(LifecycleOwner owner) {   // the whole app left the screen
 *           backgroundExecutor.execute(() -> LlmPool.nativeOnStop(pool));
 *         }
 *       });
 *     }
 *     @Override public void onTrimMemory(int level) {
 *       super.onTrimMemory(level);
 *       LlmPool.nativeOnTrimMemory(pool, level);  // never waits for a generation
 *     }
 *   }
 *
 * The conversations themselves (mz_pool_open, mz_conversation_restore_generate, ..._commit) are
 * the app's own JNI calls and are not repeated here; a conversation given back under pressure is
 * restored by its next call, front layers first while its prefill runs.
 */
#include <android/log.h>
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>

#include "mzcache.h"

#define TAG "llmjni"

typedef struct {
  mz_model* model;
  mz_pool* pool;
} llm_pool;

JNIEXPORT jlong JNICALL Java_com_example_llm_LlmPool_nativeCreate(JNIEnv* env, jclass cls, jstring model_path,
                                                                  jstring dir, jlong memory_budget) {
  (void)cls;
  llm_pool* h = (llm_pool*)calloc(1, sizeof *h);
  if (!h) return 0;
  const char* m = (*env)->GetStringUTFChars(env, model_path, NULL);
  const char* d = (*env)->GetStringUTFChars(env, dir, NULL);
  int rc = mz_model_load(m, NULL, &h->model);
  if (rc == MZ_OK) {
    struct mz_pool_params pp = mz_pool_default_params();
    pp.dir = d; /* stored conversations survive a kill: a new pool on this folder finds them */
    pp.memory_budget = memory_budget > 0 ? (uint64_t)memory_budget : 0;
    rc = mz_pool_new(h->model, &pp, &h->pool);
  }
  (*env)->ReleaseStringUTFChars(env, model_path, m);
  (*env)->ReleaseStringUTFChars(env, dir, d);
  if (rc != MZ_OK) {
    __android_log_print(ANDROID_LOG_ERROR, TAG, "pool failed: %s (%s)", mz_status_str(rc), mz_last_error());
    mz_model_free(h->model);
    free(h);
    return 0;
  }
  for (int32_t i = 0;; ++i) { /* stored files that could not be read are skipped, and said so */
    char why[256];
    if (mz_pool_damaged(h->pool, i, why, (int32_t)sizeof why) < 0) break;
    __android_log_print(ANDROID_LOG_WARN, TAG, "damaged conversation skipped: %s", why);
  }
  return (jlong)(intptr_t)h;
}

JNIEXPORT jlong JNICALL Java_com_example_llm_LlmPool_nativeOnTrimMemory(JNIEnv* env, jclass cls, jlong handle,
                                                                        jint level) {
  (void)env;
  (void)cls;
  llm_pool* h = (llm_pool*)(intptr_t)handle;
  if (!h) return MZ_ERR_INVALID_ARG;
  uint64_t freed = 0;
  /* Idle conversations' KV first, weights last; a conversation that is generating is skipped. */
  int rc = mz_pool_on_trim_memory(h->pool, (int32_t)level, &freed);
  if (rc != MZ_OK) {
    __android_log_print(ANDROID_LOG_WARN, TAG, "onTrimMemory(%d): %s (%s)", (int)level, mz_status_str(rc),
                        mz_last_error());
    return rc;
  }
  __android_log_print(ANDROID_LOG_INFO, TAG, "onTrimMemory(%d): pool gave back %llu bytes", (int)level,
                      (unsigned long long)freed);
  return (jlong)freed;
}

JNIEXPORT jint JNICALL Java_com_example_llm_LlmPool_nativeOnStop(JNIEnv* env, jclass cls, jlong handle) {
  (void)env;
  (void)cls;
  llm_pool* h = (llm_pool*)(intptr_t)handle;
  if (!h) return MZ_ERR_INVALID_ARG;
  /* Writes every changed conversation (a turn not yet committed included) and waits for the
   * writes: after this a kill loses nothing. Takes as long as the writes: call it off the main
   * thread. Memory is not given back here: UI_HIDDEN asks for none, and a user coming back finds
   * the conversation as fast as they left it; BACKGROUND (onTrimMemory) gives it back. */
  int rc = mz_pool_flush(h->pool);
  if (rc != MZ_OK)
    __android_log_print(ANDROID_LOG_WARN, TAG, "onStop: flush failed: %s (%s)", mz_status_str(rc), mz_last_error());
  return rc;
}

JNIEXPORT void JNICALL Java_com_example_llm_LlmPool_nativeFree(JNIEnv* env, jclass cls, jlong handle) {
  (void)env;
  (void)cls;
  llm_pool* h = (llm_pool*)(intptr_t)handle;
  if (!h) return;
  mz_pool_free(h->pool); /* persists every changed conversation first */
  mz_model_free(h->model);
  free(h);
}
