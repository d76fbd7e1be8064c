#include "tiers/rocks_store.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/table.h>

#include <filesystem>
#include <vector>

#include "tiers/full_device_fs.h"

namespace kvpool::tiers {

Status FromRocks(const rocksdb::Status& s, const char* file, int line) {
  if (s.ok()) return Status::OK();
  std::string msg = SourceLocation(file, line) + "rocksdb: " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  if (s.IsNoSpace()) return Status::ResourceExhausted(msg);
  if (s.IsBusy() || s.IsTimedOut()) return Status::Unavailable(msg);
  return Status::IoError(msg);
}

RocksStore::RocksStore() = default;

Result<std::unique_ptr<RocksStore>> RocksStore::Open(const RocksStoreOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return Status::IoError("cannot create " + options.path + ": " + ec.message());
  }
  std::unique_ptr<RocksStore> store(new RocksStore());
  rocksdb::DBOptions db_options;
  // An Env whose file operations go to the file system (the local disk, or a test's) through
  // FullDeviceFileSystem, and whose threads and clock are the default Env's.
  store->env_ = rocksdb::NewCompositeEnv(std::make_shared<FullDeviceFileSystem>(
      options.file_system != nullptr ? options.file_system : rocksdb::FileSystem::Default()));
  db_options.env = store->env_.get();
  store->sst_files_.reset(
      rocksdb::NewSstFileManager(store->env_.get(), store->env_->GetFileSystem()));
  db_options.sst_file_manager = store->sst_files_;
  store->path_ = options.path;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.IncreaseParallelism(options.background_threads);
  db_options.max_background_jobs = options.background_threads;
  db_options.keep_log_file_num = 5;

  // Tuned for point lookups as ColumnFamilyOptions::OptimizeForPointLookup does, but by hand:
  // that call replaces the whole table factory, block cache included (ours silently became 8 MiB).
  // One block cache for every column family.
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  table.data_block_hash_table_util_ratio = 0.75;

  rocksdb::ColumnFamilyOptions small;
  small.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  small.memtable_prefix_bloom_size_ratio = 0.02;
  small.memtable_whole_key_filtering = true;

  rocksdb::ColumnFamilyOptions blobs = small;
  blobs.enable_blob_files = true;
  blobs.min_blob_size = options.min_blob_size;
  blobs.blob_file_size = 256ull << 20;
  blobs.enable_blob_garbage_collection = true;
  blobs.blob_garbage_collection_age_cutoff = 0.25;
  blobs.write_buffer_size = 64ull << 20;

  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, small},
      {"blocks", blobs},
      {"block_meta", small},
      {"sessions", small},
  };
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, cfs, &handles, &raw);
  if (!s.ok()) {
    return KVPOOL_ROCKS_STATUS(s).WithContext("opening RocksDB at " + options.path);
  }
  store->db_.reset(raw);
  store->default_cf_ = handles[0];
  store->blocks_cf_ = handles[1];
  store->meta_cf_ = handles[2];
  store->sessions_cf_ = handles[3];
  return store;
}

RocksStore::~RocksStore() {
  if (!db_) return;
  Status st = Flush();
  if (!st.ok()) LOG(WARNING) << "flush at close: " << st.ToString();
  // Every handle DB::Open returned, the default family's included, must be destroyed before
  // the DB is deleted (RocksDB asserts it in ~ColumnFamilySet).
  for (auto* h : {default_cf_, blocks_cf_, meta_cf_, sessions_cf_}) {
    if (h) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  db_->Close().PermitUncheckedError();
}

Status RocksStore::Flush() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return KVPOOL_ROCKS_STATUS(db_->Flush(fo, {default_cf_, blocks_cf_, meta_cf_, sessions_cf_}));
}

uint64_t RocksStore::SumOverFamilies(const std::string& property) const {
  uint64_t total = 0;
  for (auto* h : {default_cf_, blocks_cf_, meta_cf_, sessions_cf_}) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, property, &v)) total += v;
  }
  return total;
}

uint64_t RocksStore::FilesBytes() const {
  // The WAL holds what the memtables hold until they are flushed: their size stands for it.
  return sst_files_->GetTotalSize() +
         SumOverFamilies(rocksdb::DB::Properties::kCurSizeAllMemTables);
}

uint64_t RocksStore::MemoryBytes() const {
  uint64_t cache = 0;  // one cache for every family
  db_->GetIntProperty(blocks_cf_, rocksdb::DB::Properties::kBlockCacheUsage, &cache);
  return SumOverFamilies(rocksdb::DB::Properties::kCurSizeAllMemTables) +
         SumOverFamilies(rocksdb::DB::Properties::kEstimateTableReadersMem) + cache;
}

std::optional<uint64_t> RocksStore::FreeBytes() const {
  uint64_t free = 0;
  if (!env_->GetFreeSpace(path_, &free).ok()) return std::nullopt;
  return free;
}

uint64_t RocksStore::BlockCacheCapacity() const {
  uint64_t v = 0;
  return db_->GetIntProperty(blocks_cf_, rocksdb::DB::Properties::kBlockCacheCapacity, &v) ? v : 0;
}

}  // namespace kvpool::tiers
