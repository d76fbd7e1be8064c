#pragma once
// gtest assertions on kvpool::Status and Result<T>: ASSERT_OK(expr) and EXPECT_OK(expr) print the
// status (and with it any log a helper attached) when it is not OK. Header-only, so the support
// library itself stays free of gtest; include it from tests only.
//
// Thread safety: as gtest's own assertions.

#include <gtest/gtest.h>

#include "common/status.h"

namespace kvpool::testing {

inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

}  // namespace kvpool::testing

#define KVPOOL_STATUS_OK_IMPL_(expr, fail)                                                   \
  do {                                                                                       \
    const auto& kvpool_status_or_ = (expr);                                                  \
    const ::kvpool::Status& kvpool_status_ = ::kvpool::testing::StatusOf(kvpool_status_or_); \
    if (!kvpool_status_.ok()) fail() << #expr << ": " << kvpool_status_.ToString();          \
  } while (0)

#define ASSERT_OK(expr) KVPOOL_STATUS_OK_IMPL_(expr, FAIL)
#define EXPECT_OK(expr) KVPOOL_STATUS_OK_IMPL_(expr, ADD_FAILURE)
