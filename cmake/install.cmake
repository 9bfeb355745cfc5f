# Installable library: `cmake --install build --prefix P` gives
#   P/lib/libmzcache.so -> libmzcache.so.MAJOR -> libmzcache.so.VERSION  (exports only mz_* symbols)
#   P/lib/libllama.so, libggml*.so       the pinned ggml/llama.cpp it was built against (found by $ORIGIN)
#   P/include/mzcache.h                  the whole public API
#   P/lib/pkgconfig/mzcache.pc           pkg-config --cflags --libs mzcache
#   P/lib/cmake/mzcache/                 find_package(mzcache) -> mzcache::mzcache
#   P/bin/mzcache                        the command (run, chat, serve, bench, ...), finding ggml and
#                                        libllama in P/lib by its rpath ($ORIGIN/../lib)
# A program built against P runs with nothing else set: the .pc file and the CMake target carry an
# rpath to P/lib, and libmzcache.so finds its ggml/llama.cpp beside itself.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(mzcache_shared SHARED $<TARGET_OBJECTS:mzcache_obj>)
target_link_libraries(mzcache_shared PRIVATE mzcache_obj)
target_include_directories(mzcache_shared INTERFACE
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(mzcache_shared PROPERTIES
  OUTPUT_NAME mzcache EXPORT_NAME mzcache
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  PUBLIC_HEADER ${CMAKE_SOURCE_DIR}/include/mzcache.h
  INSTALL_RPATH "$ORIGIN"
  LINK_DEPENDS ${CMAKE_SOURCE_DIR}/src/api/mzcache.map)
target_link_options(mzcache_shared PRIVATE
  -Wl,--version-script=${CMAKE_SOURCE_DIR}/src/api/mzcache.map -Wl,--no-undefined -Wl,-z,now)

install(TARGETS mzcache_shared EXPORT mzcacheTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# ggml and libllama from the pinned build, every versioned file and symlink (the SONAMEs resolve).
install(DIRECTORY ${MZ_DEPS_PREFIX}/lib/ DESTINATION ${CMAKE_INSTALL_LIBDIR}
  FILES_MATCHING PATTERN "libllama.so*" PATTERN "libggml*.so*")

# The command. OPTIONAL: a build that made only the library (the AArch64 cross-build of
# scripts/test-arm64.sh) installs without it; scripts/demo.sh and scripts/test.sh build it.
set_target_properties(mzcache PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS mzcache RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)

install(EXPORT mzcacheTargets NAMESPACE mzcache:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mzcache)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/mzcacheConfig.cmake.in
  ${CMAKE_BINARY_DIR}/mzcacheConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mzcache)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mzcacheConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mzcacheConfig.cmake ${CMAKE_BINARY_DIR}/mzcacheConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mzcache)

configure_file(${CMAKE_SOURCE_DIR}/cmake/mzcache.pc.in ${CMAKE_BINARY_DIR}/mzcache.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/mzcache.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
