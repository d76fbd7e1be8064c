# Debian packages by CPack (`cpack -G DEB` in the build directory, or `scripts/dev.sh package`),
# one per install component of cmake/KvpoolInstall.cmake:
#   kvpool         kvpoold, kvpool, the systemd unit, /etc/kvpool/kvpoold.flags (a conffile);
#                  postinst creates the kvpool system user and group and /var/lib/kvpool, enables
#                  and (under systemd) starts kvpoold.service; prerm stops it; postrm --purge
#                  removes /var/lib/kvpool and the user (data stays on a plain remove)
#   libkvpool0     libkvpool.so.0
#   libkvpool-dev  headers, libkvpool.so, the CMake package, kvpool.pc
# Depends come from dpkg-shlibdeps over the binaries. The CUDA runtime (libcudart, when CUDA is
# built in) is NVIDIA's, not a Debian package, so no Depends names it: the description does.
# Maintainer scripts and the conffiles list are in packaging/debian/.

if(NOT TARGET kvpool)
  return()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvpool)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "kvpool")
set(CPACK_PACKAGE_CONTACT "kvpool maintainers <kvpool@localhost>")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would prepend it to every package's description;
# the first line of each CPACK_DEBIAN_<COMPONENT>_DESCRIPTION is that package's summary.
# The Debian generator installs with DESTDIR, so CMAKE_INSTALL_PREFIX is /usr while the install
# code runs (the flag file then lands in /etc/kvpool, the unit names /usr/bin/kvpoold).
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon runtime dev)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # NAME_VERSION-RELEASE_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(_kvpool_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
if(KVPOOL_CUDA_ENABLED)
  set(_kvpool_cuda_note
    "\nBuilt with CUDA: needs the CUDA ${CUDAToolkit_VERSION_MAJOR} runtime (libcudart.so.${CUDAToolkit_VERSION_MAJOR}) on the library path.")
else()
  set(_kvpool_cuda_note "")
endif()

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME kvpool)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "KV-cache block service for LLM inference (daemon and CLI)
kvpoold pools KV-cache blocks across pinned host memory and disk for the inference
workers on a node; kvpool is its command line. Runs as the kvpoold systemd service,
user kvpool, flags in /etc/kvpool/kvpoold.flags, data in /var/lib/kvpool.${_kvpool_cuda_note}")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
  ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
  ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libkvpool0)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "kvpool client library (C API, C++ client, KV kernels)
libkvpool.so.0: the client of kvpoold for inference engines, and the paged gather/scatter,
quantization and KV-compression kernels.${_kvpool_cuda_note}")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvpool-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libkvpool0 (= ${_kvpool_deb_version})")
set(CPACK_DEBIAN_DEV_DESCRIPTION "kvpool client library (development files)
Headers (include/kvpool), the libkvpool.so link, the CMake package (find_package(kvpool
CONFIG): kvpool::client, kvpool::kernels) and kvpool.pc for pkg-config.")

include(CPack)
