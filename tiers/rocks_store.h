#pragma once
// RocksStore: the daemon's one RocksDB database under --data-dir, with the column families
// kvpool uses:
//   default     daemon identity and the namespace registry (small records)
//   blocks      disk-tier block bodies, BlobDB on: values live in blob files, the LSM only
//               holds keys and blob references
//   block_meta  one small record per disk block (size, checksum, parent); the index is
//               rebuilt from this family at start without reading any block body
//   sessions    persisted sessions
// A block's body and its meta record are always written and deleted in one WriteBatch.
//
// Thread safety: RocksDB is thread-safe; so is this wrapper.
// Ownership: owns the DB and, when options name a file system, the Env built on it; both live
// until the destructor.

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class FileSystem;
class SstFileManager;
class Status;
}  // namespace rocksdb

namespace kvpool::tiers {

// Converts a RocksDB status at the boundary, with file and line.
Status FromRocks(const rocksdb::Status& s, const char* file, int line);
#define KVPOOL_ROCKS_STATUS(expr) ::kvpool::tiers::FromRocks((expr), __FILE__, __LINE__)

struct RocksStoreOptions {
  std::string path;  // the database directory, e.g. <data-dir>/rocksdb
  // Values at least this large go to blob files. Default: 4 KiB.
  uint64_t min_blob_size = 4096;
  // Block cache for the LSM (keys, metadata). Default: 64 MiB.
  uint64_t block_cache_bytes = 64ull << 20;
  // Background compaction and flush threads. Default: 2.
  int background_threads = 2;
  // The file system RocksDB does all its file I/O through: the seam for fault-injection tests
  // (tests/support/fault_injection_fs.h). Null: the local disk (rocksdb::FileSystem::Default()).
  // Default: null.
  std::shared_ptr<rocksdb::FileSystem> file_system;
};

class RocksStore {
 public:
  // Opens or creates the database. IoError with RocksDB's reason when it cannot (another
  // kvpoold holds the lock, a bad directory, a corrupt manifest).
  static Result<std::unique_ptr<RocksStore>> Open(const RocksStoreOptions& options);
  ~RocksStore();  // flushes the memtables and closes

  rocksdb::DB* db() const { return db_.get(); }
  rocksdb::ColumnFamilyHandle* defaults() const { return default_cf_; }
  rocksdb::ColumnFamilyHandle* blocks() const { return blocks_cf_; }
  rocksdb::ColumnFamilyHandle* block_meta() const { return meta_cf_; }
  rocksdb::ColumnFamilyHandle* sessions() const { return sessions_cf_; }

  // Flushes memtables to SST files (used at shutdown).
  Status Flush();
  // Bytes of the database's SST and blob files as its SstFileManager tracks them (files that
  // compaction or blob garbage collection made obsolete count until they are deleted), and of
  // its WAL (as much as its memtables hold): the space the disk tier really takes on its device.
  uint64_t FilesBytes() const;
  // Memory the database holds: its memtables, the block cache's contents and its table readers.
  uint64_t MemoryBytes() const;
  // Bytes the file system holding the database has left; nullopt when it cannot tell.
  std::optional<uint64_t> FreeBytes() const;
  // The block cache's capacity, as RocksDB reports it (the one cache every family shares).
  uint64_t BlockCacheCapacity() const;

 private:
  RocksStore();
  // An integer property (rocksdb::DB::Properties) summed over the four families.
  uint64_t SumOverFamilies(const std::string& property) const;

  // Declared before db_: the DB is closed before the Env it runs on is destroyed.
  std::unique_ptr<rocksdb::Env> env_;
  // Tracks the sizes of the SST and blob files.
  std::shared_ptr<rocksdb::SstFileManager> sst_files_;
  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* default_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* blocks_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* sessions_cf_ = nullptr;
};

}  // namespace kvpool::tiers
