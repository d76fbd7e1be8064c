#pragma once
// TempDir: a fresh directory for one test or one benchmark run, `<$TMPDIR or
// /tmp>/<prefix>-XXXXXX`, removed with everything in it by the destructor. When it cannot be made,
// path() is empty and status() says why (the caller decides whether that fails a test or ends a
// run).
//
// Thread safety: one thread; path() may be read from any thread while nobody moves or resets it.
// Ownership: the object owns the directory; Release() hands it to the caller.

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::testing {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "kvpool-test");
  ~TempDir();  // removes the directory recursively, unless released
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  // OK, or why mkdtemp failed.
  const Status& status() const { return status_; }
  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Join(std::string_view name) const;
  // Stops owning the directory: the destructor leaves it. Returns its path.
  std::string Release();
  // Removes the directory and everything in it now (best effort); path() becomes empty.
  void Remove();

 private:
  std::string path_;
  Status status_;
};

}  // namespace kvpool::testing
