# CMake toolchain for aarch64-linux-gnu with Debian's cross compiler (g++-aarch64-linux-gnu) and
# Debian multiarch -dev packages (libzstd-dev:arm64 ...; scripts/deps-arm64.sh installs them).
#
# Contract: configures a build whose every binary is AArch64 (generic armv8-a: NEON, no dotprod,
# no SVE), finds libraries and CMake packages of architecture arm64 (/usr/lib/aarch64-linux-gnu)
# and the architecture-independent ones (/usr/share: nlohmann-json, CLI11), never the host's
# x86-64 libraries, and runs target programs (ctest, gtest_discover_tests) through qemu-aarch64.
# Used by scripts/deps-arm64.sh (the pinned ggml/llama.cpp) and scripts/test-arm64.sh (mzcache).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian multiarch: find_library / find_package search <prefix>/lib/aarch64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The cross compiler's own sysroot (libc, libstdc++, libgomp of the cross toolchain).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# BOTH: the sysroot above and the host root, where multiarch arm64 packages live; the host's
# x86-64 libraries are in /usr/lib/x86_64-linux-gnu, which CMAKE_LIBRARY_ARCHITECTURE excludes.
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config reads only the arm64 .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# Generic ARMv8-A: every 64-bit Arm phone runs it. NEON is part of the base architecture.
set(CMAKE_C_FLAGS_INIT "-march=armv8-a")
set(CMAKE_CXX_FLAGS_INIT "-march=armv8-a")
# Target programs run under qemu-user with the host's multiarch arm64 runtime (libc6:arm64,
# libstdc++6:arm64, libgomp1:arm64: /lib/ld-linux-aarch64.so.1 and /lib/aarch64-linux-gnu). Not
# `-L /usr/aarch64-linux-gnu`: that takes the cross toolchain's ld.so (glibc 2.36-8cross1) while the
# multiarch libraries pull the multiarch libc.so.6 (2.36-9+deb12u14), and with that mix every
# program hung at its first pthread_create (measured: > 10 min, no syscalls).
find_program(MZ_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${MZ_QEMU_AARCH64})
