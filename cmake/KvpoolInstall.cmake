# Install rules: what `cmake --install build [--prefix P]` and the Debian packages
# (cmake/KvpoolPackaging.cmake) put in place, in three components:
#   daemon   kvpoold, the kvpool CLI, the systemd unit, the sample flag file, the README and
#            the example namespaces file
#   runtime  libkvpool.so.0 (the C++ client, the C API and the KV kernels in one library)
#   dev      the headers, the libkvpool.so link, the CMake package (find_package(kvpool CONFIG):
#            kvpool::client, kvpool::kernels) and kvpool.pc (pkg-config)
#
# Consumers link the shared library: it carries protobuf, UCX, abseil and the rest as its own
# dependencies, so an engine needs only the headers and -lkvpool (a static kvpool_client would
# make every consumer find and link those seven internal archives and six packages itself), and
# C, Python and Rust need the .so anyway.
#
# The unit, the flag file and kvpool.pc name absolute paths, so they are written at install time
# from the prefix actually used: the flag file goes to /etc/kvpool for the prefixes / and /usr
# (the package), to PREFIX/etc/kvpool otherwise; an existing one is kept (an operator's edits).
# Included from the top-level CMakeLists.txt after the subdirectories.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(NOT TARGET kvpool)
  return()  # KVPOOL_KERNELS_ONLY: nothing of the service or the client library to install
endif()

# --- the library, its headers and the exported targets ------------------------------------

# kvpool::kernels is the same library seen through include/kvpool/kernels.h: the kernels are
# linked into libkvpool.so whole, so an engine that uses only them links this name.
add_library(kvpool_kernels_api INTERFACE)
target_link_libraries(kvpool_kernels_api INTERFACE kvpool)
set_target_properties(kvpool PROPERTIES EXPORT_NAME client)
set_target_properties(kvpool_kernels_api PROPERTIES EXPORT_NAME kernels)
# The same names for a project that adds kvpool with add_subdirectory or FetchContent.
add_library(kvpool::client ALIAS kvpool)
add_library(kvpool::kernels ALIAS kvpool_kernels_api)

install(TARGETS kvpool kvpool_kernels_api EXPORT kvpoolTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES
  ${PROJECT_SOURCE_DIR}/include/kvpool/block_key.h
  ${PROJECT_SOURCE_DIR}/include/kvpool/client.h
  ${PROJECT_SOURCE_DIR}/include/kvpool/kernels.h
  ${PROJECT_SOURCE_DIR}/include/kvpool/kvpool.h
  ${PROJECT_SOURCE_DIR}/include/kvpool/status.h
  ${PROJECT_SOURCE_DIR}/include/kvpool/tier.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvpool COMPONENT dev)

set(KVPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvpool)
install(EXPORT kvpoolTargets NAMESPACE kvpool:: FILE kvpoolTargets.cmake
  DESTINATION ${KVPOOL_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvpoolConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvpoolConfig.cmake INSTALL_DESTINATION ${KVPOOL_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvpoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvpoolConfig.cmake ${PROJECT_BINARY_DIR}/kvpoolConfigVersion.cmake
  DESTINATION ${KVPOOL_CMAKE_DIR} COMPONENT dev)

# --- files written at install time from the prefix in use -------------------------------

# Runs inside cmake_install.cmake: CMAKE_INSTALL_PREFIX is the prefix of this install (/usr when
# CPack builds the package), DESTDIR (applied by file(INSTALL)) the staging root if any.
set(_kvpool_install_code [[
  if(CMAKE_INSTALL_PREFIX MATCHES "^/(usr/?)?$")
    set(_kv_etc "/etc")
  else()
    set(_kv_etc "${CMAKE_INSTALL_PREFIX}/etc")
  endif()
  set(KVPOOL_BINDIR "${CMAKE_INSTALL_PREFIX}/@CMAKE_INSTALL_BINDIR@")
  set(KVPOOL_DOCDIR "${CMAKE_INSTALL_PREFIX}/@CMAKE_INSTALL_DOCDIR@")
  set(KVPOOL_FLAGFILE "${_kv_etc}/kvpool/kvpoold.flags")
  set(KVPOOL_LIBDIR "${CMAKE_INSTALL_PREFIX}/@CMAKE_INSTALL_LIBDIR@")
  set(KVPOOL_INCLUDEDIR "${CMAKE_INSTALL_PREFIX}/@CMAKE_INSTALL_INCLUDEDIR@")
  set(KVPOOL_VERSION "@PROJECT_VERSION@")
  set(_kv_gen "@PROJECT_BINARY_DIR@/install-generated")
]])

if(TARGET kvpoold)
  install(TARGETS kvpoold RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
  if(TARGET kvpool_cli)
    install(TARGETS kvpool_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
  endif()
  install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}
    COMPONENT daemon)
  # The commented namespaces file: copied to /etc/kvpool/namespaces.yaml by whoever wants one (the
  # daemon runs the defaults without it), so it is documentation, not a conffile.
  install(FILES ${PROJECT_SOURCE_DIR}/examples/namespaces.yaml
    DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT daemon)
  set(_kvpool_daemon_code "${_kvpool_install_code}")
  string(APPEND _kvpool_daemon_code [[
  configure_file("@PROJECT_SOURCE_DIR@/systemd/kvpoold.service.in"
    "${_kv_gen}/kvpoold.service" @ONLY)
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system"
    TYPE FILE FILES "${_kv_gen}/kvpoold.service")
  if(EXISTS "$ENV{DESTDIR}${KVPOOL_FLAGFILE}")
    message(STATUS "Kept: $ENV{DESTDIR}${KVPOOL_FLAGFILE} (already there)")
  else()
    file(INSTALL DESTINATION "${_kv_etc}/kvpool" TYPE FILE
      FILES "@PROJECT_SOURCE_DIR@/systemd/kvpoold.flags")
  endif()
]])
  string(CONFIGURE "${_kvpool_daemon_code}" _kvpool_daemon_code @ONLY)
  install(CODE "${_kvpool_daemon_code}" COMPONENT daemon)
endif()

set(_kvpool_dev_code "${_kvpool_install_code}")
string(APPEND _kvpool_dev_code [[
  configure_file("@CMAKE_CURRENT_LIST_DIR@/kvpool.pc.in" "${_kv_gen}/kvpool.pc" @ONLY)
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/@CMAKE_INSTALL_LIBDIR@/pkgconfig"
    TYPE FILE FILES "${_kv_gen}/kvpool.pc")
]])
string(CONFIGURE "${_kvpool_dev_code}" _kvpool_dev_code @ONLY)
install(CODE "${_kvpool_dev_code}" COMPONENT dev)

# --- the test: install, link the quickstart both ways, build and install the .deb ----------

if(KVPOOL_BUILD_TESTS AND TARGET kvpoold)  # the test installs and runs the daemon too
  add_test(NAME install_test
    COMMAND ${PROJECT_SOURCE_DIR}/tests/install_test.sh ${PROJECT_BINARY_DIR})
  # RUN_SERIAL: it installs into the machine's own root for a few seconds (dpkg -i, purge), and
  # a failed link check seen once beside other tests could not be reproduced alone.
  set_tests_properties(install_test PROPERTIES LABELS install TIMEOUT 300
    SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
