#!/usr/bin/env bash
# install_test BUILD_DIR: kvpool as a new user installs it and links it, outside this build.
#  1. `cmake --install` into a temp prefix: binaries, library, headers (each compiles on its own,
#     kvpool.h and kernels.h as C too), unit (systemd-analyze verify), flag file, CMake package,
#     kvpool.pc; `--version` of both binaries.
#  2. examples/quickstart.cc built in a temp dir against that prefix with find_package(kvpool
#     CONFIG), and again with pkg-config and the compiler; a C program through pkg-config. All
#     three run against the installed kvpoold.
#  3. `cpack -G DEB`: each package's files, conffiles and Depends (dpkg-deb -c / -I).
#  4. As root, on a machine with no kvpool package or user: `dpkg -i` of the three packages
#     (user, group, /var/lib/kvpool, conffile, unit verified where it landed), then
#     `dpkg --remove` (data and user stay) and `dpkg --purge` (both go). The machine is left as
#     it was. Without root, or where kvpool is already there, step 4 is skipped: exit 77.
set -euo pipefail

BUILD=$(cd "${1:?usage: install_test.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/kvpool-install-test.XXXXXX)
PREFIX=$WORK/prefix
DAEMON_PID=
DPKG_INSTALLED=0

cleanup() {
  if [[ -n "$DAEMON_PID" ]]; then kill "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; fi
  if ((DPKG_INSTALLED)); then dpkg --purge libkvpool-dev libkvpool0 kvpool >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }
has_line() {  # has_line FILE REGEX: FILE has a line matching REGEX
  grep -Eq -- "$2" "$1" || { echo "--- $1:"; cat "$1"; fail "no line matching '$2' in $1"; }
}

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$BUILD/CMakeCache.txt")
[[ -n "$version" ]] || fail "no CMAKE_PROJECT_VERSION in $BUILD/CMakeCache.txt"

# --- 1. cmake --install into a temp prefix ---------------------------------------------------
step "cmake --install --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" || { cat "$WORK/install.log"; fail "cmake --install"; }
libdir=lib
[[ -d "$PREFIX/lib" ]] || fail "no $PREFIX/lib"
for f in bin/kvpoold bin/kvpool "$libdir/libkvpool.so" "$libdir/libkvpool.so.0" \
         "$libdir/libkvpool.so.$version" include/kvpool/client.h include/kvpool/kvpool.h \
         include/kvpool/block_key.h include/kvpool/status.h include/kvpool/kernels.h \
         lib/systemd/system/kvpoold.service etc/kvpool/kvpoold.flags \
         "$libdir/cmake/kvpool/kvpoolConfig.cmake" "$libdir/cmake/kvpool/kvpoolConfigVersion.cmake" \
         "$libdir/cmake/kvpool/kvpoolTargets.cmake" "$libdir/pkgconfig/kvpool.pc" \
         share/doc/kvpool/README.md; do
  [[ -e "$PREFIX/$f" ]] || fail "cmake --install did not install $f"
done
# Nothing outside the prefix (the flag file used to go to /etc/kvpool whatever the prefix).
if [[ -n "$(grep -E '^-- (Installing|Up-to-date): ' "$WORK/install.log" | grep -v -- ": $PREFIX/")" ]]; then
  fail "installed outside $PREFIX: $(grep -v -- ": $PREFIX/" "$WORK/install.log")"
fi

unit=$PREFIX/lib/systemd/system/kvpoold.service
has_line "$unit" "^ExecStart=$PREFIX/bin/kvpoold --flagfile=$PREFIX/etc/kvpool/kvpoold.flags\$"
has_line "$unit" '^User=kvpool$'
has_line "$unit" '^Group=kvpool$'
if grep -n '@[A-Z_]*@' "$unit"; then fail "unsubstituted placeholder in $unit"; fi
systemd-analyze verify --man=no "$unit" || fail "systemd-analyze verify $unit"
has_line "$PREFIX/$libdir/pkgconfig/kvpool.pc" "^Version: $version\$"

step "--version"
for b in kvpoold kvpool; do
  out=$("$PREFIX/bin/$b" --version 2>&1) || fail "$b --version exited $?"
  echo "$out"
  # e.g. "kvpoold version 0.1.0 (git 2460b06-dirty; CUDA yes, NCCL no, UCX yes)"
  [[ "$out" =~ $b\ version\ $version\ \(git\ [^\;]+\;\ CUDA\ (yes|no),\ NCCL\ (yes|no),\ UCX\ (yes|no)\) ]] ||
    fail "$b --version: '$out'"
done

step "each installed header compiles on its own"
for h in block_key client kernels kvpool status; do
  echo "#include <kvpool/$h.h>" | c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only \
    -I"$PREFIX/include" -x c++ - || fail "<kvpool/$h.h> does not compile alone as C++20"
done
for h in kvpool kernels; do
  echo "#include <kvpool/$h.h>" | cc -std=c11 -Wall -Wextra -Werror -fsyntax-only \
    -I"$PREFIX/include" -x c - || fail "<kvpool/$h.h> does not compile alone as C11"
done

# --- 2. link against the installed tree, outside the project ------------------------------
step "quickstart with find_package(kvpool CONFIG)"
mkdir -p "$WORK/cmake-consumer"
cp "$SRC/examples/quickstart.cc" "$WORK/cmake-consumer/"
cat >"$WORK/cmake-consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.22)
project(consumer LANGUAGES CXX)
find_package(kvpool 0.1 CONFIG REQUIRED)
add_executable(quickstart quickstart.cc)
target_link_libraries(quickstart PRIVATE kvpool::client)
add_executable(kernels_only kernels_only.cc)
target_link_libraries(kernels_only PRIVATE kvpool::kernels)
CM
cat >"$WORK/cmake-consumer/kernels_only.cc" <<'CC'
#include <kvpool/kernels.h>
// A call into the library through kvpool::kernels alone: the documented defaults.
int main() {
  kvpool_compress_params p{};
  kvpool_kernel_compress_params_default(&p);
  return p.window_size == 32 && p.sink_size == 4 ? 0 : 1;
}
CC
cmake -S "$WORK/cmake-consumer" -B "$WORK/cmake-consumer/build" -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_BUILD_TYPE=Release >"$WORK/consumer-configure.log" ||
  { cat "$WORK/consumer-configure.log"; fail "find_package(kvpool CONFIG)"; }
cmake --build "$WORK/cmake-consumer/build" -j2 || fail "building against kvpool::client"
"$WORK/cmake-consumer/build/kernels_only" || fail "kernels_only"

step "quickstart with pkg-config and c++"
export PKG_CONFIG_PATH=$PREFIX/$libdir/pkgconfig
[[ "$(pkg-config --modversion kvpool)" == "$version" ]] || fail "pkg-config --modversion kvpool"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 -o "$WORK/quickstart-pc" "$SRC/examples/quickstart.cc" \
  $(pkg-config --cflags --libs kvpool) -Wl,-rpath,"$(pkg-config --variable=libdir kvpool)" ||
  fail "c++ with pkg-config --cflags --libs kvpool"
cat >"$WORK/c_consumer.c" <<'C'
#include <kvpool/kvpool.h>
#include <stdio.h>
int main(int argc, char** argv) {
  kvpool_client* c = NULL;
  if (kvpool_connect(argc > 1 ? argv[1] : NULL, "tenant-c", 5000, &c) != KVPOOL_OK) {
    fprintf(stderr, "connect: %s\n", kvpool_last_error(NULL));
    return 1;
  }
  int32_t tokens[32];
  for (int i = 0; i < 32; ++i) tokens[i] = i;
  kvpool_key keys[2];
  size_t n_keys = 0;
  uint32_t hit = 99;
  if (kvpool_hash_chain(tokens, 32, 16, "s", 1, "layout", NULL, keys, 2, &n_keys) != KVPOOL_OK ||
      n_keys != 2 || kvpool_lookup(c, keys, n_keys, 0, &hit, NULL) != KVPOOL_OK || hit != 0) {
    fprintf(stderr, "lookup: %s\n", kvpool_last_error(c));
    return 1;
  }
  kvpool_close(c);
  puts("C client: connected, looked up 2 keys, 0 cached");
  return 0;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -o "$WORK/c-consumer" "$WORK/c_consumer.c" \
  $(pkg-config --cflags --libs kvpool) -Wl,-rpath,"$(pkg-config --variable=libdir kvpool)" ||
  fail "cc with pkg-config --cflags --libs kvpool"
# (Output captured first: with pipefail, `ldd | grep -q` fails when grep stops reading early and
# ldd gets SIGPIPE, which made this check fail now and then.)
pc_libs=$(ldd "$WORK/quickstart-pc")
if grep -q "$BUILD" <<<"$pc_libs"; then fail "quickstart-pc links the build tree"; fi
grep -q "$PREFIX/$libdir/libkvpool.so.0" <<<"$pc_libs" ||
  fail "quickstart-pc does not use $PREFIX's libkvpool: $(ldd "$WORK/quickstart-pc" | grep kvpool)" \
    "(pkg-config libdir: $(pkg-config --variable=libdir kvpool))"

step "the three run against the installed kvpoold"
sock=$WORK/kvpool.sock
"$PREFIX/bin/kvpoold" --data_dir="$WORK/data" --socket="$sock" --host_capacity=128MiB \
  --disk_capacity=256MiB --lock_memory=false --ucx=false >"$WORK/kvpoold.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.1; done
[[ -S "$sock" ]] || { cat "$WORK/kvpoold.log"; fail "installed kvpoold did not listen on $sock"; }
"$WORK/cmake-consumer/build/quickstart" "$sock" || fail "quickstart (find_package) against kvpoold"
"$WORK/quickstart-pc" "$sock" | tee "$WORK/qs2.out" || fail "quickstart (pkg-config) against kvpoold"
has_line "$WORK/qs2.out" '^cached prefix: 8 of 8 blocks$'  # the first run put them
"$WORK/c-consumer" "$sock" || fail "C consumer against kvpoold"
"$PREFIX/bin/kvpool" --socket="$sock" status >/dev/null || fail "installed kvpool status"
kill "$DAEMON_PID"; wait "$DAEMON_PID" || fail "kvpoold exited $? on SIGTERM"; DAEMON_PID=

# --- 3. the Debian packages --------------------------------------------------------------------
step "cpack -G DEB"
(cd "$WORK" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$WORK/deb" >"$WORK/cpack.log") ||
  { cat "$WORK/cpack.log"; fail "cpack -G DEB"; }
arch=$(dpkg --print-architecture)
deb_daemon=$WORK/deb/kvpool_${version}-1_${arch}.deb
deb_lib=$WORK/deb/libkvpool0_${version}-1_${arch}.deb
deb_dev=$WORK/deb/libkvpool-dev_${version}-1_${arch}.deb
for d in "$deb_daemon" "$deb_lib" "$deb_dev"; do [[ -f "$d" ]] || { ls "$WORK/deb"; fail "no $d"; }; done

dpkg-deb -c "$deb_daemon" | awk '{print $6}' >"$WORK/daemon.files"
for f in ./usr/bin/kvpoold ./usr/bin/kvpool ./usr/lib/systemd/system/kvpoold.service \
         ./etc/kvpool/kvpoold.flags ./usr/share/doc/kvpool/README.md; do
  has_line "$WORK/daemon.files" "^${f//./\\.}\$"
done
if grep -Eq 'libkvpool|include/|/usr/local' "$WORK/daemon.files"; then fail "kvpool package holds another package's files"; fi
dpkg-deb -c "$deb_lib" | awk '{print $6}' >"$WORK/lib.files"
has_line "$WORK/lib.files" "^\./usr/lib/libkvpool\.so\.0(\.|$)"
if grep -Eq 'include/|libkvpool\.so$|bin/' "$WORK/lib.files"; then fail "libkvpool0 holds -dev or daemon files"; fi
dpkg-deb -c "$deb_dev" | awk '{print $6}' >"$WORK/dev.files"
for f in ./usr/include/kvpool/client.h ./usr/include/kvpool/kvpool.h ./usr/lib/libkvpool.so \
         ./usr/lib/cmake/kvpool/kvpoolConfig.cmake ./usr/lib/pkgconfig/kvpool.pc; do
  has_line "$WORK/dev.files" "^${f//./\\.}\$"
done

dpkg-deb -f "$deb_daemon" Depends >"$WORK/daemon.depends"
tr ',' '\n' <"$WORK/daemon.depends" | sed 's/^ *//' >"$WORK/daemon.depends.lines"
for p in adduser libc6 libstdc\\+\\+6 libprotobuf32 libgflags2\\.2 \
         'libgoogle-glog0v[0-9]' libsystemd0 libucx0 libssl3; do
  has_line "$WORK/daemon.depends.lines" "^$p( |$)"
done
dpkg-deb -f "$deb_lib" Depends | tr ',' '\n' | sed 's/^ *//' >"$WORK/lib.depends.lines"
has_line "$WORK/lib.depends.lines" '^libprotobuf32( |$)'
[[ "$(dpkg-deb -f "$deb_dev" Depends)" == "libkvpool0 (= ${version}-1)" ]] || fail "libkvpool-dev Depends: $(dpkg-deb -f "$deb_dev" Depends)"
dpkg-deb --ctrl-tarfile "$deb_daemon" | tar -x -O ./conffiles >"$WORK/conffiles"
[[ "$(cat "$WORK/conffiles")" == "/etc/kvpool/kvpoold.flags" ]] || fail "conffiles: $(cat "$WORK/conffiles")"
dpkg-deb --ctrl-tarfile "$deb_daemon" | tar -t >"$WORK/control.files"
for s in postinst prerm postrm; do has_line "$WORK/control.files" "^\./$s\$"; done
dpkg-deb -x "$deb_daemon" "$WORK/deb-root"
has_line "$WORK/deb-root/usr/lib/systemd/system/kvpoold.service" \
  '^ExecStart=/usr/bin/kvpoold --flagfile=/etc/kvpool/kvpoold.flags$'
# Hardened: its own user, a read-only system but for its state, no capabilities.
for d in '^User=kvpool$' '^ProtectSystem=strict$' '^CapabilityBoundingSet=$' '^NoNewPrivileges=true$'; do
  has_line "$WORK/deb-root/usr/lib/systemd/system/kvpoold.service" "$d"
done

# --- 4. dpkg -i, remove, purge -----------------------------------------------------------------
if [[ $(id -u) != 0 ]]; then echo "install_test: SKIP dpkg -i (not root)"; exit 77; fi
if grep -q installed <<<"$(dpkg-query -W -f='${Status}' kvpool libkvpool0 libkvpool-dev 2>/dev/null)" ||
   getent passwd kvpool >/dev/null || getent group kvpool >/dev/null || [[ -e /var/lib/kvpool ]] ||
   [[ -e /etc/kvpool ]]; then
  echo "install_test: SKIP dpkg -i (kvpool, its user or its directories are already on this machine)"
  exit 77
fi
step "dpkg -i"
DPKG_INSTALLED=1
dpkg -i "$deb_lib" "$deb_dev" "$deb_daemon" || fail "dpkg -i"
getent passwd kvpool >"$WORK/passwd" || fail "no kvpool user after dpkg -i"
getent group kvpool >/dev/null || fail "no kvpool group after dpkg -i"
uid=$(cut -d: -f3 "$WORK/passwd")
((uid < 1000)) || fail "kvpool is not a system user (uid $uid)"
[[ "$(cut -d: -f4 "$WORK/passwd")" == "$(getent group kvpool | cut -d: -f3)" ]] || fail "kvpool's group is not kvpool"
[[ "$(stat -c '%U:%G %a' /var/lib/kvpool)" == "kvpool:kvpool 750" ]] || fail "/var/lib/kvpool: $(stat -c '%U:%G %a' /var/lib/kvpool)"
[[ -f /etc/kvpool/kvpoold.flags ]] || fail "no /etc/kvpool/kvpoold.flags"
grep -q '/etc/kvpool/kvpoold.flags' <<<"$(dpkg-query -W -f='${Conffiles}\n' kvpool)" || fail "flag file is not a conffile"
systemd-analyze verify --man=no /usr/lib/systemd/system/kvpoold.service || fail "systemd-analyze verify of the installed unit"
grep -q "version $version" <<<"$(/usr/bin/kvpoold --version)" || fail "/usr/bin/kvpoold --version"
[[ "$(pkg-config --modversion kvpool)" == "$version" ]] || fail "installed kvpool.pc"
PKG_CONFIG_PATH= pkg-config --exists kvpool || fail "pkg-config does not find /usr's kvpool.pc"

step "dpkg --remove keeps the data and the user; --purge removes them"
touch /var/lib/kvpool/marker
dpkg --remove libkvpool-dev libkvpool0 kvpool || fail "dpkg --remove"
[[ -e /var/lib/kvpool/marker ]] || fail "dpkg --remove deleted /var/lib/kvpool"
getent passwd kvpool >/dev/null || fail "dpkg --remove deleted the kvpool user"
[[ -f /etc/kvpool/kvpoold.flags ]] || fail "dpkg --remove deleted the conffile"
[[ ! -e /usr/bin/kvpoold ]] || fail "/usr/bin/kvpoold still there after remove"
dpkg --purge libkvpool-dev libkvpool0 kvpool || fail "dpkg --purge"
DPKG_INSTALLED=0
[[ ! -e /var/lib/kvpool ]] || fail "/var/lib/kvpool still there after purge"
[[ ! -e /etc/kvpool ]] || fail "/etc/kvpool still there after purge"
! getent passwd kvpool >/dev/null || fail "kvpool user still there after purge"
! getent group kvpool >/dev/null || fail "kvpool group still there after purge"
[[ ! -e /etc/systemd/system/multi-user.target.wants/kvpoold.service ]] || fail "enable link left after purge"
echo "install_test: OK"
