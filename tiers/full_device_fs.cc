#include "tiers/full_device_fs.h"

#include <glog/logging.h>

#include <utility>

namespace kvpool::tiers {
namespace {

using rocksdb::DataVerificationInfo;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

class File : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(std::unique_ptr<rocksdb::FSWritableFile> file, FullDeviceFileSystem& fs)
      : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Append(data, options, dbg));
  }
  IOStatus Append(const Slice& data, const IOOptions& options, const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    return fs_.Translate(target()->Append(data, options, info, dbg));
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    return fs_.Translate(target()->PositionedAppend(data, offset, options, dbg));
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const DataVerificationInfo& info, IODebugContext* dbg) override {
    return fs_.Translate(target()->PositionedAppend(data, offset, options, info, dbg));
  }
  IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Truncate(size, options, dbg));
  }
  IOStatus Close(const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Close(options, dbg));
  }
  IOStatus Flush(const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Flush(options, dbg));
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Sync(options, dbg));
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return fs_.Translate(target()->Fsync(options, dbg));
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    return fs_.Translate(target()->RangeSync(offset, nbytes, options, dbg));
  }
  IOStatus Allocate(uint64_t offset, uint64_t len, const IOOptions& options,
                    IODebugContext* dbg) override {
    return fs_.Translate(target()->Allocate(offset, len, options, dbg));
  }

 private:
  FullDeviceFileSystem& fs_;
};

}  // namespace

FullDeviceFileSystem::FullDeviceFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
    : FileSystemWrapper(std::move(base)) {}

IOStatus FullDeviceFileSystem::Translate(IOStatus s) {
  if (s.ok() || !s.IsNoSpace()) return s;
  if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) {
    LOG(ERROR) << "the disk tier's device is full (" << s.ToString()
               << "): the disk tier stops taking writes until kvpoold restarts";
  }
  return IOStatus::IOError("no space left on the device (kvpool: full device)", s.ToString());
}

IOStatus FullDeviceFileSystem::Wrap(IOStatus s, std::unique_ptr<rocksdb::FSWritableFile>* result) {
  if (s.ok()) *result = std::make_unique<File>(std::move(*result), *this);
  return Translate(std::move(s));
}

IOStatus FullDeviceFileSystem::NewWritableFile(const std::string& fname,
                                               const rocksdb::FileOptions& opts,
                                               std::unique_ptr<rocksdb::FSWritableFile>* result,
                                               IODebugContext* dbg) {
  return Wrap(target()->NewWritableFile(fname, opts, result, dbg), result);
}

IOStatus FullDeviceFileSystem::ReopenWritableFile(const std::string& fname,
                                                  const rocksdb::FileOptions& opts,
                                                  std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                  IODebugContext* dbg) {
  return Wrap(target()->ReopenWritableFile(fname, opts, result, dbg), result);
}

IOStatus FullDeviceFileSystem::ReuseWritableFile(const std::string& fname,
                                                 const std::string& old_fname,
                                                 const rocksdb::FileOptions& opts,
                                                 std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                 IODebugContext* dbg) {
  return Wrap(target()->ReuseWritableFile(fname, old_fname, opts, result, dbg), result);
}

}  // namespace kvpool::tiers
