#!/usr/bin/env bash
# kvpool developer entry point: installs the dependencies (Debian 12 packages), builds, and
#   ./scripts/dev.sh run    starts kvpoold in the foreground with the embedded defaults
#   ./scripts/dev.sh test   runs the whole test suite with ctest (after scripts/python_env.sh)
#   ./scripts/dev.sh build  only installs and builds
#   ./scripts/dev.sh sanitize  builds the tiers, request handling, framing, access control and
#                           kvpoold with AddressSanitizer and UndefinedBehaviorSanitizer (Debug,
#                           -O1, no CUDA, in $BUILD_DIR-asan) and runs their unit and integration
#                           tests there (about 10 minutes on 2 cores; CI runs it after `test`)
#   ./scripts/dev.sh tsan   builds the tier manager's and the control server's tests with
#                           ThreadSanitizer (clang, Debug, -O1, in $BUILD_DIR-tsan, abseil built
#                           there from Debian's source so its mutexes are seen) and runs them
#   ./scripts/dev.sh fuzz   builds the libFuzzer targets (fuzz/, clang, ASan + UBSan, in
#                           $BUILD_DIR-fuzz) and runs each FUZZ_SECONDS (default 30) from its seed
#                           corpus; a crash, sanitizer report or hang fails (CI runs it last)
#   ./scripts/dev.sh package  builds the Debian packages (cpack -G DEB) into $BUILD_DIR
# Environment: BUILD_DIR (default build), CTEST_ARGS (extra ctest arguments, e.g. "-L unit"),
# KVPOOL_SKIP_INSTALL=1 to skip apt-get (dependencies already present).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=$(nproc)

# Debian 12 packages kvpool builds and tests with (see ../shared/BUILD-NOTES.md).
PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libboost-system-dev libgflags-dev libgoogle-glog-dev librocksdb-dev
  libprotobuf-dev protobuf-compiler libssl-dev libxxhash-dev libabsl-dev nlohmann-json3-dev
  libsystemd-dev libgtest-dev libbenchmark-dev libyaml-cpp-dev
  libucx-dev ucx-utils libhiredis-dev redis-server etcd-server openssl fio
  python3 python3-matplotlib python3-venv python3-dev python3-pip
  clang libclang-rt-14-dev
)

install_deps() {
  if [[ "${KVPOOL_SKIP_INSTALL:-0}" == 1 ]]; then return; fi
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "dev.sh: all ${#PACKAGES[@]} packages present"
    return
  fi
  echo "dev.sh: installing ${missing[*]}"
  local sudo=()
  if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# What `sanitize` builds and runs: the unit tests of the parts a hostile client or peer reaches
# and the integration tests that run a (sanitized) kvpoold against hostile input and SIGKILL.
SANITIZED_TESTS=(
  frame_test tls_test control_connection_test segment_mappings_test
  access_control_test namespaces_file_test session_store_test block_service_test
  socket_delivery_test shm_delivery_test
  block_index_test leases_test mover_test host_tier_test disk_tier_test
  tier_manager_test tier_manager_strategies_test tier_manager_gpu_test tier_manager_stress_test
  tier_manager_gpu_stress_test fake_device_link_test
  robustness_test access_test daemon_tls_test shm_test daemon_test crash_test gpu_path_test
)

sanitize() {
  local dir="$BUILD_DIR-asan"
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVPOOL_WITH_CUDA=OFF \
    -DKVPOOL_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="$flags -O1" -DCMAKE_C_FLAGS="$flags -O1" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
  cmake --build "$dir" -j "$JOBS" --target kvpoold "${SANITIZED_TESTS[@]}"
  local names
  names=$(IFS='|'; echo "${SANITIZED_TESTS[*]}")
  # A sanitizer report fails the test (UBSan does not recover; ASan's leak check at exit counts).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$dir" --output-on-failure -j 2 -R "^($names)\$"
}

# What `fuzz` runs: each libFuzzer target from its committed seeds (fuzz/corpus/<target>/); what
# it learns stays in $BUILD_DIR-fuzz/corpus/<target>/ (outside the tree), and the input of a
# finding in $BUILD_DIR-fuzz/artifacts/<target>/ (reproduce: run the target on that file).
FUZZERS=(fuzz_frame fuzz_handlers fuzz_etcd_replies fuzz_namespaces_file)

fuzz() {
  local dir="$BUILD_DIR-fuzz"
  local flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
  flags+=" -fno-omit-frame-pointer"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DKVPOOL_WITH_CUDA=OFF -DKVPOOL_BUILD_BENCH=OFF \
    -DKVPOOL_BUILD_TESTS=OFF -DKVPOOL_BUILD_FUZZERS=ON -DCMAKE_CXX_FLAGS="$flags -O1" \
    -DCMAKE_C_FLAGS="$flags -O1"
  cmake --build "$dir" -j "$JOBS" --target "${FUZZERS[@]}"
  local seconds=${FUZZ_SECONDS:-30} f
  for f in "${FUZZERS[@]}"; do
    mkdir -p "$dir/corpus/$f" "$dir/artifacts/$f"
    echo "dev.sh: fuzzing $f for ${seconds} s"
    if ! "$dir/fuzz/$f" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/$f/" "$dir/corpus/$f" \
      "fuzz/corpus/$f" >"$dir/$f.log" 2>&1; then
      tail -n 80 "$dir/$f.log"
      echo "dev.sh: $f found a problem; its input is in $dir/artifacts/$f/" >&2
      return 1
    fi
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$dir/$f.log" |
      tr '\n' ' '
    echo
  done
}

# What `tsan` runs: the tier manager's and the control server's tests (threads racing on the
# index, leases, reservations, movers, gpu placements and copies down; connections, timers and
# handler hops on Asio). Not the host consistency stress: its many threads writing to disk at
# once run RocksDB's write group, whose uninstrumented hand-offs TSan reports without a RocksDB
# frame to suppress them by (scripts/tsan.supp). The gpu stress (six threads, a smaller key set)
# ran clean in each run so far.
TSAN_TESTS=(
  tier_manager_test tier_manager_strategies_test leases_test mover_test tls_test
  block_service_test host_tier_test tier_manager_gpu_stress_test gpu_path_test
)

# abseil's source, as Debian ships it (the same release as libabsl-dev), for a build whose
# absl::Mutex ThreadSanitizer can see: Debian's libabsl is not built with TSan's annotations, so
# every lock in kvpool would read as a race. Fetched once with `apt-get source` (a deb-src
# entry for the Debian mirror is added if missing).
abseil_source() {
  local dest="$1"
  if [[ -f "$dest/CMakeLists.txt" ]]; then return; fi
  local sudo=()
  if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
  local list=/etc/apt/sources.list.d/kvpool-deb-src.sources
  if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' |
      "${sudo[@]}" tee "$list" >/dev/null
    "${sudo[@]}" apt-get update -q -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=-
  fi
  local work
  work=$(mktemp -d)
  (cd "$work" && apt-get source -q --download-only abseil >/dev/null &&
    dpkg-source -x abseil_*.dsc src >/dev/null)
  mkdir -p "$(dirname "$dest")"
  mv "$work/src" "$dest"
  rm -rf "$work"
}

tsan() {
  local dir="$BUILD_DIR-tsan"
  mkdir -p "$dir"
  local absl
  absl="$(cd "$dir" && pwd)/abseil-src"
  abseil_source "$absl"
  local flags="-fsanitize=thread -fno-omit-frame-pointer"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DKVPOOL_WITH_CUDA=OFF -DKVPOOL_BUILD_BENCH=OFF \
    -DKVPOOL_ABSL_SOURCE_DIR="$absl" -DCMAKE_CXX_FLAGS="$flags -O1" \
    -DCMAKE_C_FLAGS="$flags -O1" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread"
  cmake --build "$dir" -j "$JOBS" --target "${TSAN_TESTS[@]}"
  local names
  names=$(IFS='|'; echo "${TSAN_TESTS[*]}")
  # A report fails the test (exit code 66). scripts/tsan.supp names what is not kvpool's.
  TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp" \
    ctest --test-dir "$dir" --output-on-failure -j 2 -R "^($names)\$"
}

case "${1:-}" in
  run)
    install_deps
    build
    shift
    mkdir -p kvpool-data
    echo "dev.sh: starting kvpoold (Ctrl-C stops it; try '$BUILD_DIR/client/kvpool status' in another shell)"
    exec "$BUILD_DIR/daemon/kvpoold" --data_dir=kvpool-data "$@"
    ;;
  test)
    install_deps
    # The Python venvs (.venv/<name>, the kvpool wheel installed in each) that the python-labelled
    # tests run in; fast when nothing changed. Their requirements (GBs of downloads: torch, the
    # engines) install while the C++ tree builds; the wheel and its installs follow the build.
    mkdir -p "$BUILD_DIR"
    scripts/python_env.sh --requirements-only >"$BUILD_DIR/python_env.log" 2>&1 &
    requirements_pid=$!
    build
    if ! wait "$requirements_pid"; then
      cat "$BUILD_DIR/python_env.log"
      echo "dev.sh: installing the Python requirements failed (log above)" >&2
      exit 1
    fi
    cat "$BUILD_DIR/python_env.log"
    scripts/python_env.sh
    # Integration tests start their own daemons on temp dirs: safe to run two at a time.
    # shellcheck disable=SC2086
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 ${CTEST_ARGS:-}
    ;;
  build)
    install_deps
    build
    ;;
  sanitize)
    install_deps
    sanitize
    ;;
  tsan)
    install_deps
    tsan
    ;;
  fuzz)
    install_deps
    fuzz
    ;;
  package)
    # The Debian packages (kvpool, libkvpool0, libkvpool-dev) into $BUILD_DIR; see README "Install".
    install_deps
    build
    (cd "$BUILD_DIR" && cpack -G DEB)
    ls "$BUILD_DIR"/*.deb
    ;;
  *)
    echo "usage: $0 run [kvpoold flags] | test | build | sanitize | fuzz | package" >&2
    exit 2
    ;;
esac
