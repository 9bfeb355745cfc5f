#!/usr/bin/env bash
# Fails (exit 1, listing file:line: code) when a file under src/ outside src/env/ calls the OS
# directly: environment variables, clocks, file streams and stdio files, open/stat/access, poll,
# eventfd, mmap and friends, processes, sleeps. Those go through mz::Env (src/env/env.h) so that
# FaultEnv can fake and fail them. Comments are ignored; std::chrono durations and condition-variable
# waits are not OS calls and are allowed.
# Usage: tests/check_os_calls.sh [source root]   (default: the repository holding this script)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
[ -d src/env ] || { echo "check_os_calls: no src/env under $root" >&2; exit 2; }

calls='getenv|secure_getenv|setenv|unsetenv|putenv|clock_gettime|gettimeofday|eventfd|poll|ppoll|epoll_create1?|epoll_wait|select|open|openat|creat|fopen|freopen|popen|access|stat|lstat|fstat|statfs|opendir|readdir|mkdir|rmdir|unlink|rename|fsync|fdatasync|ftruncate|mmap|munmap|madvise|mincore|mlock|posix_fadvise|pread|pwrite|preadv|fork|execv|execvp|system|sysconf|setpriority|getpriority|syscall|usleep|nanosleep|sleep'
# A call: the name, not preceded by a letter, digit, '_', '.' or '->' (a member of ours), then '('.
# read/write/close/ioctl only with the global '::' (the names are common as methods).
pattern="(^|[^A-Za-z0-9_.>])(::|std::)?(${calls})[[:space:]]*\\(|steady_clock|system_clock|high_resolution_clock|std::(i|o)?fstream|std::this_thread::sleep_|(^|[^A-Za-z0-9_])::(read|write|close|ioctl)[[:space:]]*\\("

bad=$(find src -path src/env -prune -o -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.c' \) -print | sort |
  while read -r f; do
    # Drop // comments and /* */ comment lines (a crude strip: enough for this code base's style).
    sed -e 's#//.*$##' -e 's#/\*.*\*/##g' "$f" | grep -nE "$pattern" | sed "s#^#$f:#" || true
  done)
# A name that is ours (a method or a local helper) can share an OS call's name: list them here
# as file:regex if ever needed. None today.
if [ -n "$bad" ]; then
  echo "Direct OS calls outside src/env/ (route them through mz::Env, src/env/env.h):"
  echo "$bad"
  exit 1
fi
echo "check_os_calls: no direct OS calls outside src/env/"
