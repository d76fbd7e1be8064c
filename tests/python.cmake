# Python tests under CTest: pytest in one of scripts/python_env.sh's venvs against a real kvpoold.
#
#   kvpool_add_pytest(NAME python_core VENV core DIR python/tests
#                     [ARGS extra pytest args...] [LABELS python;integration] [TIMEOUT seconds])
#
# Runs `.venv/<venv>/bin/python -m pytest <dir> -q <args>` from the repository root with
# KVPOOL_KVPOOLD and KVPOOL_CLI set to this build's binaries. Fails with a clear message when the
# venv is missing (make it with scripts/python_env.sh <venv>), and when pytest collected no tests
# (exit code 5): a test that runs nothing is a broken test.
if(NOT KVPOOL_BUILD_TESTS)
  return()
endif()
set(KVPOOL_PYTEST_RUNNER ${CMAKE_CURRENT_LIST_DIR}/run_pytest.cmake)

function(kvpool_add_pytest)
  cmake_parse_arguments(P "" "NAME;VENV;DIR;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT P_NAME OR NOT P_VENV OR NOT P_DIR)
    message(FATAL_ERROR "kvpool_add_pytest needs NAME, VENV and DIR")
  endif()
  if(NOT P_LABELS)
    set(P_LABELS python integration)
  endif()
  if(NOT P_TIMEOUT)
    set(P_TIMEOUT 600)
  endif()
  string(REPLACE ";" "|" args "${P_ARGS}")  # "|" separates them on the way to the runner
  add_test(NAME ${P_NAME}
    COMMAND ${CMAKE_COMMAND}
      -DPYTHON=${PROJECT_SOURCE_DIR}/.venv/${P_VENV}/bin/python
      -DVENV=${P_VENV}
      -DDIR=${P_DIR}
      "-DARGS=${args}"
      -P ${KVPOOL_PYTEST_RUNNER}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${P_NAME} PROPERTIES
    LABELS "${P_LABELS}" TIMEOUT ${P_TIMEOUT}
    ENVIRONMENT "KVPOOL_KVPOOLD=$<TARGET_FILE:kvpoold>;KVPOOL_CLI=$<TARGET_FILE:kvpool_cli>;PYTHONDONTWRITEBYTECODE=1")
endfunction()

# kvpool's own tests (the core venv: numpy and pytest, no torch). Subfolders (hf/, kvpress/)
# belong to other venvs and are registered on their own.
kvpool_add_pytest(NAME python_core VENV core DIR python/tests ARGS -o norecursedirs=*
  LABELS python integration TIMEOUT 600)

# kvpool.hf (transformers DynamicCache <-> blocks) and kvpool.hf.compress: the hf venv (torch,
# transformers). A tiny random-weight Llama end to end: two processes, restarts, sessions.
kvpool_add_pytest(NAME python_hf VENV hf DIR python/tests/hf
  LABELS python model slow TIMEOUT 900)
# Smoke run of the multi-round chat benchmark (512-token system prompt, 2 users, 2 rounds);
# fails when a first token differs from recompute or no request found its prefix.
add_test(NAME bench_hf_multiround_quick
  COMMAND ${PROJECT_SOURCE_DIR}/.venv/hf/bin/python ${PROJECT_SOURCE_DIR}/bench/hf_multiround.py
    --quick
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_hf_multiround_quick PROPERTIES
  LABELS "bench;python" TIMEOUT 300
  ENVIRONMENT "KVPOOL_KVPOOLD=$<TARGET_FILE:kvpoold>;PYTHONDONTWRITEBYTECODE=1")
# kvpress 0.5.5 as an independent reference for the compression kernels (its own venv: it pins
# transformers < 5.3): kvpool's kept token sets against StreamingLLM-, SnapKV- and PyramidKVPress.
kvpool_add_pytest(NAME python_kvpress VENV kvpress DIR python/tests/kvpress
  LABELS python model slow TIMEOUT 600)
# Engine connectors, each in its engine's own venv.
kvpool_add_pytest(NAME python_lmcache VENV lmcache DIR python/tests/lmcache
  LABELS python integration TIMEOUT 600)
kvpool_add_pytest(NAME python_vllm VENV vllm DIR python/tests/vllm
  LABELS python integration TIMEOUT 600)
# Smoke run of what a stopped kvpoold costs vLLM's scheduler (4 lookups a case, 0.2 s timeout);
# fails when the answering daemon's lookups miss.
add_test(NAME bench_vllm_scheduler_outage_quick
  COMMAND ${PROJECT_SOURCE_DIR}/.venv/vllm/bin/python
    ${PROJECT_SOURCE_DIR}/bench/vllm_scheduler_outage.py --lookups 4 --timeout 0.2
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_vllm_scheduler_outage_quick PROPERTIES
  LABELS "bench;python" TIMEOUT 300
  ENVIRONMENT "KVPOOL_KVPOOLD=$<TARGET_FILE:kvpoold>;PYTHONDONTWRITEBYTECODE=1")
kvpool_add_pytest(NAME python_sglang VENV sglang DIR python/tests/sglang
  LABELS python integration TIMEOUT 300)
# Mooncake Store beside kvpool (bench/mooncake_bench.py, the mooncake venv): a short run whose
# every get is verified byte for byte; fails on any wrong byte, error or missing process.
add_test(NAME bench_mooncake_smoke
  COMMAND ${PROJECT_SOURCE_DIR}/.venv/mooncake/bin/python ${PROJECT_SOURCE_DIR}/bench/mooncake_bench.py
    --calls 8 --working-set-mib 32 --json --require-mooncake
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_mooncake_smoke PROPERTIES
  LABELS "bench;python" TIMEOUT 300
  ENVIRONMENT "KVPOOL_KVPOOLD=$<TARGET_FILE:kvpoold>;PYTHONDONTWRITEBYTECODE=1")
