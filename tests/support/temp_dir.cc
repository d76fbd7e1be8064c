#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

namespace kvpool::testing {

TempDir::TempDir(std::string_view prefix) {
  const char* base = ::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" +
                     std::string(prefix) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    status_ = Status::FromErrno(errno, "mkdtemp " + tmpl);
    return;
  }
  path_ = std::move(tmpl);
}

TempDir::~TempDir() { Remove(); }

TempDir::TempDir(TempDir&& other) noexcept
    : path_(std::exchange(other.path_, std::string())), status_(std::move(other.status_)) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, std::string());
    status_ = std::move(other.status_);
  }
  return *this;
}

std::string TempDir::Join(std::string_view name) const { return path_ + "/" + std::string(name); }

std::string TempDir::Release() { return std::exchange(path_, std::string()); }

void TempDir::Remove() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // best effort: a leftover dir under /tmp is harmless
  path_.clear();
}

}  // namespace kvpool::testing
