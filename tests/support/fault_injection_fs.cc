#include "tests/support/fault_injection_fs.h"

#include <functional>
#include <string>
#include <utility>

namespace kvpool::testing {
namespace {

using rocksdb::DataVerificationInfo;
using rocksdb::FSReadRequest;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;
using Op = FaultInjectionFileSystem::Op;

class FaultyWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultyWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, FaultInjectionFileSystem& fs)
      : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kWrite);
    return s.ok() ? target()->Append(data, options, dbg) : s;
  }
  IOStatus Append(const Slice& data, const IOOptions& options, const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kWrite);
    return s.ok() ? target()->Append(data, options, info, dbg) : s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kWrite);
    return s.ok() ? target()->PositionedAppend(data, offset, options, dbg) : s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const DataVerificationInfo& info, IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kWrite);
    return s.ok() ? target()->PositionedAppend(data, offset, options, info, dbg) : s;
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kSync);
    return s.ok() ? target()->Sync(options, dbg) : s;
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kSync);
    return s.ok() ? target()->Fsync(options, dbg) : s;
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kSync);
    return s.ok() ? target()->RangeSync(offset, nbytes, options, dbg) : s;
  }

 private:
  FaultInjectionFileSystem& fs_;
};

class FaultyRandomAccessFile : public rocksdb::FSRandomAccessFileOwnerWrapper {
 public:
  FaultyRandomAccessFile(std::unique_ptr<rocksdb::FSRandomAccessFile> file,
                         FaultInjectionFileSystem& fs)
      : FSRandomAccessFileOwnerWrapper(std::move(file)), fs_(fs) {}

  IOStatus Read(uint64_t offset, size_t n, const IOOptions& options, Slice* result, char* scratch,
                IODebugContext* dbg) const override {
    IOStatus s = fs_.MaybeFail(Op::kRead);
    if (!s.ok()) {
      *result = Slice();
      return s;
    }
    return target()->Read(offset, n, options, result, scratch, dbg);
  }
  IOStatus MultiRead(FSReadRequest* reqs, size_t num_reqs, const IOOptions& options,
                     IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kRead);
    if (!s.ok()) {
      for (size_t i = 0; i < num_reqs; ++i) {
        reqs[i].status = s;
        reqs[i].result = Slice();
      }
      return s;
    }
    return target()->MultiRead(reqs, num_reqs, options, dbg);
  }
  IOStatus ReadAsync(FSReadRequest& req, const IOOptions& opts,
                     std::function<void(const FSReadRequest&, void*)> cb, void* cb_arg,
                     void** io_handle, rocksdb::IOHandleDeleter* del_fn,
                     IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kRead);
    if (!s.ok()) {
      // Fails synchronously: RocksDB then falls back to (failing) synchronous reads.
      return s;
    }
    return target()->ReadAsync(req, opts, std::move(cb), cb_arg, io_handle, del_fn, dbg);
  }

 private:
  FaultInjectionFileSystem& fs_;
};

class FaultySequentialFile : public rocksdb::FSSequentialFileOwnerWrapper {
 public:
  FaultySequentialFile(std::unique_ptr<rocksdb::FSSequentialFile> file,
                       FaultInjectionFileSystem& fs)
      : FSSequentialFileOwnerWrapper(std::move(file)), fs_(fs) {}

  IOStatus Read(size_t n, const IOOptions& options, Slice* result, char* scratch,
                IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kRead);
    if (!s.ok()) {
      *result = Slice();
      return s;
    }
    return target()->Read(n, options, result, scratch, dbg);
  }
  IOStatus PositionedRead(uint64_t offset, size_t n, const IOOptions& options, Slice* result,
                          char* scratch, IODebugContext* dbg) override {
    IOStatus s = fs_.MaybeFail(Op::kRead);
    if (!s.ok()) {
      *result = Slice();
      return s;
    }
    return target()->PositionedRead(offset, n, options, result, scratch, dbg);
  }

 private:
  FaultInjectionFileSystem& fs_;
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kWrite:
      return "write";
    case Op::kSync:
      return "sync";
    case Op::kRead:
      return "read";
  }
  return "?";
}

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
    : FileSystemWrapper(std::move(base)) {}

void FaultInjectionFileSystem::Fail(Op op, Error error, uint64_t after, bool retryable) {
  Switch& s = switch_of(op);
  s.error.store(static_cast<uint8_t>(error), std::memory_order_relaxed);
  s.retryable.store(retryable, std::memory_order_relaxed);
  s.allowance.store(after, std::memory_order_relaxed);
  // Release: a file thread that sees `on` also sees the error, retryable and allowance above.
  s.on.store(true, std::memory_order_release);
}

void FaultInjectionFileSystem::Heal(Op op) {
  switch_of(op).on.store(false, std::memory_order_release);
}

void FaultInjectionFileSystem::HealAll() {
  for (Op op : {Op::kWrite, Op::kSync, Op::kRead}) Heal(op);
}

void FaultInjectionFileSystem::SetFreeSpace(uint64_t bytes) {
  free_bytes_.store(bytes, std::memory_order_relaxed);
  fake_free_.store(true, std::memory_order_release);
}

void FaultInjectionFileSystem::ClearFreeSpace() {
  fake_free_.store(false, std::memory_order_release);
}

rocksdb::IOStatus FaultInjectionFileSystem::GetFreeSpace(const std::string& path,
                                                         const rocksdb::IOOptions& options,
                                                         uint64_t* diskfree,
                                                         rocksdb::IODebugContext* dbg) {
  if (fake_free_.load(std::memory_order_acquire)) {
    *diskfree = free_bytes_.load(std::memory_order_relaxed);
    return rocksdb::IOStatus::OK();
  }
  return target()->GetFreeSpace(path, options, diskfree, dbg);
}

bool FaultInjectionFileSystem::failing(Op op) const {
  return switch_of(op).on.load(std::memory_order_acquire);
}

uint64_t FaultInjectionFileSystem::failures(Op op) const {
  return switch_of(op).failures.load(std::memory_order_relaxed);
}

IOStatus FaultInjectionFileSystem::InjectedError(Op op) const {
  const Switch& s = switch_of(op);
  const std::string what = std::string("kvpool fault injection: ") + OpName(op) + " refused";
  IOStatus st = static_cast<Error>(s.error.load(std::memory_order_relaxed)) == Error::kNoSpace
                    ? IOStatus::NoSpace(what)
                    : IOStatus::IOError(what);
  st.SetRetryable(s.retryable.load(std::memory_order_relaxed));
  return st;
}

FaultInjectionFileSystem::~FaultInjectionFileSystem() {
  for (Op op : {Op::kWrite, Op::kSync, Op::kRead}) Resume(op);
}

void FaultInjectionFileSystem::Stall(Op op) {
  std::lock_guard<std::mutex> lock(stall_mu_);
  stalling_[static_cast<int>(op)] = true;
}

void FaultInjectionFileSystem::Resume(Op op) {
  {
    std::lock_guard<std::mutex> lock(stall_mu_);
    stalling_[static_cast<int>(op)] = false;
  }
  resumed_.notify_all();
}

uint64_t FaultInjectionFileSystem::stalled(Op op) const {
  std::lock_guard<std::mutex> lock(stall_mu_);
  return waiting_[static_cast<int>(op)];
}

IOStatus FaultInjectionFileSystem::MaybeFail(Op op) {
  {
    std::unique_lock<std::mutex> lock(stall_mu_);
    const int i = static_cast<int>(op);
    if (stalling_[i]) {
      ++waiting_[i];
      resumed_.wait(lock, [&] { return !stalling_[i]; });
      --waiting_[i];
    }
  }
  Switch& s = switch_of(op);
  // Acquire: pairs with the release in Fail().
  if (!s.on.load(std::memory_order_acquire)) return IOStatus::OK();
  uint64_t left = s.allowance.load(std::memory_order_relaxed);
  while (left > 0) {
    if (s.allowance.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
      return IOStatus::OK();
    }
  }
  s.failures.fetch_add(1, std::memory_order_relaxed);
  return InjectedError(op);
}

IOStatus FaultInjectionFileSystem::NewSequentialFile(
    const std::string& fname, const rocksdb::FileOptions& opts,
    std::unique_ptr<rocksdb::FSSequentialFile>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSSequentialFile> file;
  IOStatus s = target()->NewSequentialFile(fname, opts, &file, dbg);
  if (s.ok()) result->reset(new FaultySequentialFile(std::move(file), *this));
  return s;
}

IOStatus FaultInjectionFileSystem::NewRandomAccessFile(
    const std::string& fname, const rocksdb::FileOptions& opts,
    std::unique_ptr<rocksdb::FSRandomAccessFile>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSRandomAccessFile> file;
  IOStatus s = target()->NewRandomAccessFile(fname, opts, &file, dbg);
  if (s.ok()) result->reset(new FaultyRandomAccessFile(std::move(file), *this));
  return s;
}

IOStatus FaultInjectionFileSystem::NewWritableFile(const std::string& fname,
                                                   const rocksdb::FileOptions& opts,
                                                   std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                   IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> file;
  IOStatus s = target()->NewWritableFile(fname, opts, &file, dbg);
  if (s.ok()) result->reset(new FaultyWritableFile(std::move(file), *this));
  return s;
}

IOStatus FaultInjectionFileSystem::ReopenWritableFile(
    const std::string& fname, const rocksdb::FileOptions& opts,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> file;
  IOStatus s = target()->ReopenWritableFile(fname, opts, &file, dbg);
  if (s.ok()) result->reset(new FaultyWritableFile(std::move(file), *this));
  return s;
}

IOStatus FaultInjectionFileSystem::ReuseWritableFile(
    const std::string& fname, const std::string& old_fname, const rocksdb::FileOptions& opts,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> file;
  IOStatus s = target()->ReuseWritableFile(fname, old_fname, opts, &file, dbg);
  if (s.ok()) result->reset(new FaultyWritableFile(std::move(file), *this));
  return s;
}

}  // namespace kvpool::testing
