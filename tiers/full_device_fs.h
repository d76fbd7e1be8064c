#pragma once
// FullDeviceFileSystem: the rocksdb::FileSystem every RocksStore runs on, wrapped around the
// local disk (or a test's file system). It reports a full device (ENOSPC, IOStatus NoSpace) from
// a write, sync or close of a file as a plain I/O error naming the full device.
//
// Why: RocksDB 7.8 (Debian 12's librocksdb) handles a NoSpace failure of a WAL append as an error
// it may go on writing after, and its next append to that WAL trips an assertion
// (WritableFileWriter::AssertFalseAndGetStatusForPrevError: the process aborts; fixed upstream
// in 9.x, "Don't write to WAL after previous WAL write error", facebook/rocksdb#12448). A plain
// I/O error stops the database's writes instead: the disk tier then refuses writes (demotions
// lose their blocks, counted) until kvpoold restarts, and everything else goes on. The disk
// tier's budget (TierManager, DiskPayloadBudget) keeps kvpool from filling its device itself;
// this covers a device something else fills. Found by tiers/disk_fault_test.
//
// Thread safety: as the wrapped file system. Ownership: shared, as RocksDB's Env holds it.

#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace kvpool::tiers {

class FullDeviceFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit FullDeviceFileSystem(std::shared_ptr<rocksdb::FileSystem> base);

  // How many NoSpace failures it turned into I/O errors so far.
  uint64_t full_device_errors() const { return errors_.load(std::memory_order_relaxed); }
  // Called by its files: `s`, with NoSpace turned into an I/O error (and counted).
  rocksdb::IOStatus Translate(rocksdb::IOStatus s);

  static const char* kClassName() { return "KvpoolFullDeviceFileSystem"; }
  const char* Name() const override { return kClassName(); }
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& opts,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;

 private:
  rocksdb::IOStatus Wrap(rocksdb::IOStatus s, std::unique_ptr<rocksdb::FSWritableFile>* result);

  std::atomic<uint64_t> errors_{0};
};

}  // namespace kvpool::tiers
