/* The library's teardown leaves no thread behind (issue 46): a program that loads a model, decodes
 * a few tokens and frees everything must be back to its one thread before it returns from main.
 * Before, the OpenMP worker that computed beside the main thread stayed (libgomp never joins its
 * pool), and exit() ran the libraries' static destructors (ggml's backend registry among them)
 * while it was still running: once in about 1,060 runs it died with SIGSEGV there.
 * Usage: exit_threads MODEL.gguf [RUNS]: exit 0 if every run ends with one thread. Each run is a
 * fork()ed child doing the whole sequence, so that RUNS exits are exercised too. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <mzcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int count_threads(void) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

static int one_run(const char* path) {
  mz_model* model = NULL;
  mz_context* ctx = NULL;
  if (mz_model_load(path, NULL, &model) != MZ_OK) return fprintf(stderr, "load: %s\n", mz_last_error()), 2;
  if (mz_context_new(model, NULL, &ctx) != MZ_OK) return fprintf(stderr, "context: %s\n", mz_last_error()), 2;
  mz_token toks[4] = {1, 2, 3, 4};
  if (mz_decode(ctx, toks, 4, false) != MZ_OK) return fprintf(stderr, "decode: %s\n", mz_last_error()), 2;
  for (int i = 0; i < 3; ++i) {
    mz_token t = 5 + i;
    if (mz_decode(ctx, &t, 1, false) != MZ_OK) return fprintf(stderr, "decode: %s\n", mz_last_error()), 2;
  }
  mz_context_free(ctx);
  mz_model_free(model);
  /* Exiting threads leave /proc/self/task a moment after they are told to: up to 2 s. */
  int n = 0;
  for (int i = 0; i < 200 && (n = count_threads()) != 1; ++i) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (n != 1) return fprintf(stderr, "exit_threads: %d threads left after the last free (1 expected)\n", n), 1;
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return fprintf(stderr, "usage: %s MODEL.gguf [RUNS]\n", argv[0]), 2;
  const int runs = argc > 2 ? atoi(argv[2]) : 1;
  int crashed = 0, left = 0;
  for (int i = 0; i < runs; ++i) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) return perror("fork"), 2;
    if (pid == 0) exit(one_run(argv[1]));
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return perror("waitpid"), 2;
    if (WIFSIGNALED(st)) {
      ++crashed;
      fprintf(stderr, "exit_threads: run %d died with signal %d\n", i, WTERMSIG(st));
    } else if (WEXITSTATUS(st) == 2) {
      return 2;
    } else if (WEXITSTATUS(st) != 0) {
      ++left;
    }
  }
  printf("exit_threads: %d runs, %d crashed, %d left threads behind\n", runs, crashed, left);
  return crashed || left ? 1 : 0;
}
