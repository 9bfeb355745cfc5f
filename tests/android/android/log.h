/*
 * Stand-in for the Android NDK's <android/log.h> on Linux, so that docs/examples/jni_trim_memory.c
 * compiles unchanged outside the NDK (scripts/test-arm64.sh). Declares the subset the example uses,
 * with the NDK's names, values and signature; tests/android/liblog_shim.c implements it (as the NDK's
 * liblog does on a device). Not for apps: on Android the NDK's header and liblog are used.
 */
#ifndef MZ_ANDROID_LOG_SHIM_H
#define MZ_ANDROID_LOG_SHIM_H
#ifdef __cplusplus
extern "C" {
#endif
typedef enum android_LogPriority {
  ANDROID_LOG_UNKNOWN = 0,
  ANDROID_LOG_DEFAULT,
  ANDROID_LOG_VERBOSE,
  ANDROID_LOG_DEBUG,
  ANDROID_LOG_INFO,
  ANDROID_LOG_WARN,
  ANDROID_LOG_ERROR,
  ANDROID_LOG_FATAL,
  ANDROID_LOG_SILENT
} android_LogPriority;
int __android_log_print(int prio, const char* tag, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
#ifdef __cplusplus
}
#endif
#endif
