/*
 * liblog stand-in for Linux (see android/log.h here): __android_log_print writes
 * "<priority letter>/<tag>: <message>" as one line to stderr, and keeps the last message of each
 * priority for tests/android/jni_driver.c (mz_test_log_last). Built as liblog.so by
 * scripts/test-arm64.sh, so that libllmjni.so links with -llog exactly as it does with the NDK.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "android/log.h"

static char last[ANDROID_LOG_SILENT + 1][512];

int __android_log_print(int prio, const char* tag, const char* fmt, ...) {
  static const char letters[] = "??VDIWEF?";
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (prio < 0 || prio > ANDROID_LOG_SILENT) prio = ANDROID_LOG_UNKNOWN;
  memcpy(last[prio], buf, sizeof buf);
  fprintf(stderr, "%c/%s: %s\n", letters[prio], tag, buf);
  return n;
}

/* The last message logged at priority prio ("" if none). Not part of Android's liblog. */
const char* mz_test_log_last(int prio) {
  return (prio < 0 || prio > ANDROID_LOG_SILENT) ? "" : last[prio];
}
