# kvpool_build_info: an interface target whose generated header (cmake/build_info.h.in) names
# the version, the git revision and the optional parts built in, for `--version`. Included from
# the top-level CMakeLists.txt after the subdirectories, so the targets that decide the optional
# parts (kvpool_ucx, ...) already exist.

find_package(Git QUIET)
set(KVPOOL_GIT_REVISION "unknown")
if(GIT_EXECUTABLE)
  execute_process(COMMAND "${GIT_EXECUTABLE}" describe --always --dirty
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    OUTPUT_VARIABLE _kvpool_describe OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _kvpool_describe_rc ERROR_QUIET)
  if(_kvpool_describe_rc EQUAL 0 AND _kvpool_describe)
    set(KVPOOL_GIT_REVISION "${_kvpool_describe}")
  endif()
endif()

set(_kvpool_features "")
foreach(_part IN ITEMS CUDA NCCL UCX)
  if(_part STREQUAL "CUDA")
    set(_on ${KVPOOL_CUDA_ENABLED})
  elseif(_part STREQUAL "NCCL")
    # NCCL's device links built in (transport/CMakeLists.txt); libnccl.so.2 loads at run time.
    get_property(_on GLOBAL PROPERTY KVPOOL_NCCL_BUILT)
  else()
    if(TARGET kvpool_ucx)
      set(_on ON)
    else()
      set(_on OFF)
    endif()
  endif()
  if(_on)
    list(APPEND _kvpool_features "${_part} yes")
  else()
    list(APPEND _kvpool_features "${_part} no")
  endif()
endforeach()
list(JOIN _kvpool_features ", " KVPOOL_BUILD_FEATURES)
message(STATUS "kvpool: version ${PROJECT_VERSION} (git ${KVPOOL_GIT_REVISION}; ${KVPOOL_BUILD_FEATURES})")

configure_file(${CMAKE_CURRENT_LIST_DIR}/build_info.h.in
  ${PROJECT_BINARY_DIR}/generated/build_info.h @ONLY)
add_library(kvpool_build_info INTERFACE)
target_include_directories(kvpool_build_info INTERFACE ${PROJECT_BINARY_DIR}/generated)
