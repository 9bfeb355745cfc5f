// LD_PRELOAD shim for scripts/tsan-census.sh: writes "@@PTHREAD_CREATE" to stdout (fd 1, after
// flushing stdio, so the line lands after gtest's "[ RUN ] name") whenever the process starts a
// thread, and "@@GOMP_PARALLEL" when an OpenMP region (ggml's compute threads) runs on more than
// one thread. A test that prints neither starts no thread: ThreadSanitizer has nothing to check in
// it. Build: gcc -shared -fPIC -O1 -o pthread_census.so pthread_census.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
typedef int (*pc_t)(pthread_t*, const pthread_attr_t*, void*(*)(void*), void*);
int pthread_create(pthread_t* t, const pthread_attr_t* a, void*(*f)(void*), void* arg) {
  static pc_t real;
  if (!real) real = (pc_t)dlsym(RTLD_NEXT, "pthread_create");
  fflush(0);
  write(1, "@@PTHREAD_CREATE\n", 17);
  return real(t, a, f, arg);
}
typedef void (*gp_t)(void (*)(void*), void*, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
  static gp_t real;
  if (!real) real = (gp_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  if (n != 1) { fflush(0); write(1, "@@GOMP_PARALLEL\n", 16); }
  real(fn, data, n, flags);
}
