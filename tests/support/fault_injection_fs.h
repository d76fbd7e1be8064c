#pragma once
// FaultInjectionFileSystem: a rocksdb::FileSystem that forwards to a real one (the default: the
// local disk) and, when a test switches it on, fails writes, syncs or reads with an error of its
// own, counting each failure, as LevelDB's fault-injection Env and RocksDB's
// FaultInjectionTestFS do (Debian's librocksdb does not ship the latter). Hand it to a RocksDB
// through RocksStoreOptions::file_system.
//
//   writes: FSWritableFile Append and PositionedAppend (WAL, SST, blob and MANIFEST files)
//   syncs:  FSWritableFile Sync, Fsync and RangeSync
//   reads:  FSRandomAccessFile Read, MultiRead and ReadAsync; FSSequentialFile Read and
//           PositionedRead (WAL and MANIFEST replay at open)
// A failed call reaches nothing underneath: a refused Append writes no byte. A stalled call
// (Stall) goes on to the file once resumed. Opening, renaming
// and deleting files always succeed, and RocksDB's info LOG is never affected.
//
// Thread safety: every method may be called from any thread; RocksDB calls the file methods from
// its own threads while the test flips switches.
// Ownership: shared (std::shared_ptr), as RocksDB's Env holds its FileSystem. The files it opens
// point back to it, so it must outlive every database opened on it (a RocksStore's Env holds it).

#include <rocksdb/file_system.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace kvpool::testing {

class FaultInjectionFileSystem : public rocksdb::FileSystemWrapper {
 public:
  enum class Op : uint8_t { kWrite = 0, kSync = 1, kRead = 2 };
  enum class Error : uint8_t {
    kIoError,  // IOError "kvpool fault injection": a broken device
    kNoSpace,  // IOError(NoSpace): a full device
  };

  explicit FaultInjectionFileSystem(
      std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default());
  ~FaultInjectionFileSystem() override;

  // From now on, after `after` more calls of `op` succeed, every call of `op` fails with `error`
  // until Heal(op). `retryable` marks the IOStatus retryable, which RocksDB treats as a transient
  // error it recovers from by itself once writes succeed again (see ErrorHandler).
  void Fail(Op op, Error error = Error::kIoError, uint64_t after = 0, bool retryable = false);
  void Heal(Op op);
  void HealAll();
  bool failing(Op op) const;
  // How many calls of `op` this file system has failed so far.
  uint64_t failures(Op op) const;

  // From now on every call of `op` waits (a device that stops answering, e.g. a stalled WAL
  // write) until Resume(op); stalled(op) counts the calls waiting now. The destructor resumes.
  void Stall(Op op);
  void Resume(Op op);
  uint64_t stalled(Op op) const;

  // The status a failed call returns (also for tests that compare messages).
  rocksdb::IOStatus InjectedError(Op op) const;

  // From now on GetFreeSpace reports `bytes` (a device filling up); ClearFreeSpace: the real one.
  void SetFreeSpace(uint64_t bytes);
  void ClearFreeSpace();

  // rocksdb::FileSystem
  static const char* kClassName() { return "KvpoolFaultInjectionFileSystem"; }
  const char* Name() const override { return kClassName(); }
  rocksdb::IOStatus NewSequentialFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomAccessFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* result,
                                        rocksdb::IODebugContext* dbg) override;
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

  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* diskfree, rocksdb::IODebugContext* dbg) override;

  // Called by the wrapped files: the error to return for one call of `op`, or OK to go ahead.
  rocksdb::IOStatus MaybeFail(Op op);

 private:
  struct Switch {
    std::atomic<bool> on{false};
    std::atomic<uint64_t> allowance{0};  // calls that still succeed after Fail()
    std::atomic<uint8_t> error{0};       // Error
    std::atomic<bool> retryable{false};
    std::atomic<uint64_t> failures{0};
  };
  Switch& switch_of(Op op) { return switches_[static_cast<int>(op)]; }
  const Switch& switch_of(Op op) const { return switches_[static_cast<int>(op)]; }

  Switch switches_[3];
  // Stall(): which ops wait, and how many calls wait now, under stall_mu_.
  mutable std::mutex stall_mu_;
  std::condition_variable resumed_;
  bool stalling_[3] = {false, false, false};
  uint64_t waiting_[3] = {0, 0, 0};
  std::atomic<bool> fake_free_{false};
  std::atomic<uint64_t> free_bytes_{0};
};

}  // namespace kvpool::testing
