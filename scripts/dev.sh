#!/usr/bin/env bash
# kvpool developer entry point: installs the dependencies (Debian 12 packages), builds, and
#   ./scripts/dev.sh run    starts kvpoold in the foreground with the embedded defaults
#   ./scripts/dev.sh test   runs the whole test suite with ctest (after scripts/python_env.sh)
#   ./scripts/dev.sh build  only installs and builds
#   ./scripts/dev.sh sanitize  builds the tiers, request handling, framing, access control and
#                           kvpoold with AddressSanitizer and UndefinedBehaviorSanitizer (Debug,
#                           -O1, no CUDA, in $BUILD_DIR-asan) and runs their unit and integration
#                           tests there (about 10 minutes on 2 cores; CI runs it after `test`)
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
  libucx-dev ucx-utils libhiredis-dev redis-server etcd-server
  python3 python3-matplotlib python3-venv python3-dev python3-pip
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
  frame_test control_connection_test segment_mappings_test
  access_control_test namespaces_file_test session_store_test block_service_test
  socket_delivery_test shm_delivery_test
  block_index_test leases_test mover_test host_tier_test disk_tier_test
  tier_manager_test tier_manager_strategies_test tier_manager_gpu_test
  robustness_test access_test shm_test daemon_test crash_test
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
  package)
    # The Debian packages (kvpool, libkvpool0, libkvpool-dev) into $BUILD_DIR; see README "Install".
    install_deps
    build
    (cd "$BUILD_DIR" && cpack -G DEB)
    ls "$BUILD_DIR"/*.deb
    ;;
  *)
    echo "usage: $0 run [kvpoold flags] | test | build | sanitize | package" >&2
    exit 2
    ;;
esac
