// SessionStore over a RocksStore whose file system (tests/support/fault_injection_fs.h) fails the
// WAL's sync or write on demand. A save is synced before it returns (DESIGN.md, "Persistence and
// recovery": sessions survive kill -9), so a sync the device refuses must reach the caller as an
// error, and the record saved before must still be there, whole, in this process and after a
// restart.

#include "daemon/session_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "daemon/session_handlers.h"
#include "tests/support/fault_injection_fs.h"
#include "tests/support/temp_dir.h"

namespace kvpool::daemon {
namespace {

using ::kvpool::testing::FaultInjectionFileSystem;
using Op = FaultInjectionFileSystem::Op;

constexpr NamespaceId kNs = 7;

wire::SessionRecord Record(const std::string& id, uint64_t tokens, const std::string& user) {
  wire::SessionRecord r;
  r.set_session_id(id);
  for (uint64_t i = 0; i < tokens / 16; ++i)
    r.add_keys(std::string(32, static_cast<char>('a' + i)));
  r.set_token_count(tokens);
  (*r.mutable_metadata())["user"] = user;
  r.set_created_unix_ms(1700000000000);
  r.set_updated_unix_ms(1700000000000 + static_cast<int64_t>(tokens));
  r.set_total_bytes(tokens * 1024);
  return r;
}

bool Same(const wire::SessionRecord& a, const wire::SessionRecord& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

class SessionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok()) << dir_.status().ToString();
    fs_ = std::make_shared<FaultInjectionFileSystem>();
    Open();
  }

  void Open() {
    tiers::RocksStoreOptions o;
    o.path = dir_.Join("rocksdb");
    o.block_cache_bytes = 8 << 20;
    o.file_system = fs_;
    Result<std::unique_ptr<tiers::RocksStore>> store = tiers::RocksStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    sessions_ = std::make_unique<SessionStore>(*store_);
  }
  void Close() {
    sessions_.reset();
    store_.reset();
  }
  // A daemon restart on a working disk.
  void Restart() {
    Close();
    fs_->HealAll();
    Open();
  }

  // The record of `id` as stored now; fails the test when it is missing or damaged.
  wire::SessionRecord Stored(const std::string& id) {
    Result<wire::SessionRecord> r = sessions_->Get(kNs, id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : wire::SessionRecord();
  }

  ::kvpool::testing::TempDir dir_{"kvpool-session-store-test"};
  std::shared_ptr<FaultInjectionFileSystem> fs_;
  std::unique_ptr<tiers::RocksStore> store_;
  std::unique_ptr<SessionStore> sessions_;
};

TEST_F(SessionStoreTest, SaveGetListDelete) {
  const wire::SessionRecord a = Record("chat-a", 64, "alice");
  const wire::SessionRecord b = Record("chat-b", 32, "bob");
  ASSERT_TRUE(sessions_->Put(kNs, a).ok());
  ASSERT_TRUE(sessions_->Put(kNs, b).ok());
  ASSERT_TRUE(sessions_->Put(kNs + 1, Record("chat-a", 16, "other tenant")).ok());
  EXPECT_TRUE(Same(Stored("chat-a"), a));
  bool truncated = true;
  Result<std::vector<wire::SessionRecord>> listed =
      sessions_->List(kNs, "chat-", "", 10, &truncated);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_FALSE(truncated);
  EXPECT_TRUE(Same((*listed)[0], a));
  EXPECT_TRUE(Same((*listed)[1], b));
  ASSERT_TRUE(sessions_->Delete(kNs, "chat-a").ok());
  EXPECT_TRUE(sessions_->Get(kNs, "chat-a").status().IsNotFound());
  EXPECT_TRUE(sessions_->Delete(kNs, "chat-a").IsNotFound());
  EXPECT_EQ(sessions_->Put(kNs, Record("", 16, "x")).code(), StatusCode::kInvalidArgument);

  // Saves are synced: a restart finds them.
  Restart();
  EXPECT_TRUE(Same(Stored("chat-b"), b));
  EXPECT_TRUE(sessions_->Get(kNs, "chat-a").status().IsNotFound());
}

TEST_F(SessionStoreTest, DeletionRecordsAreKeptButNotListed) {
  ASSERT_TRUE(sessions_->Put(kNs, Record("chat-a", 64, "alice")).ok());
  wire::SessionRecord tombstone;
  tombstone.set_session_id("chat-b");
  tombstone.set_deleted(true);
  tombstone.set_version(7);
  ASSERT_TRUE(sessions_->Put(kNs, tombstone).ok());
  // Get answers it (a load compares versions with it); List skips it.
  Result<wire::SessionRecord> got = sessions_->Get(kNs, "chat-b");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->deleted());
  EXPECT_EQ(got->version(), 7u);
  bool truncated = true;
  auto listed = sessions_->List(kNs, "", "", 10, &truncated);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].session_id(), "chat-a");
}

// A page at a time: ids after the last one of the page before, and `truncated` only where
// another live record follows (deletion records after the page do not count).
TEST_F(SessionStoreTest, ListPagesAfterAnIdAndIsTruncatedOnlyBeforeALiveRecord) {
  for (const char* id : {"s1", "s2", "s3", "s4"})
    ASSERT_TRUE(sessions_->Put(kNs, Record(id, 16, "u")).ok());
  wire::SessionRecord tombstone;
  tombstone.set_session_id("s5");
  tombstone.set_deleted(true);
  ASSERT_TRUE(sessions_->Put(kNs, tombstone).ok());
  ASSERT_TRUE(sessions_->Put(kNs + 1, Record("s9", 16, "other tenant")).ok());
  auto ids = [&](std::string_view after, uint32_t limit, bool* truncated) {
    std::vector<std::string> out;
    auto listed = sessions_->List(kNs, "s", after, limit, truncated);
    EXPECT_TRUE(listed.ok());
    for (const auto& r : *listed) out.push_back(r.session_id());
    return out;
  };
  bool truncated = false;
  EXPECT_EQ(ids("", 2, &truncated), (std::vector<std::string>{"s1", "s2"}));
  EXPECT_TRUE(truncated);
  EXPECT_EQ(ids("s2", 2, &truncated), (std::vector<std::string>{"s3", "s4"}));
  EXPECT_FALSE(truncated) << "only a deletion record follows";
  EXPECT_EQ(ids("s25", 10, &truncated), (std::vector<std::string>{"s3", "s4"}));
  EXPECT_TRUE(ids("s4", 10, &truncated).empty());
  EXPECT_FALSE(truncated);
}

// The device refuses the WAL's sync: the save reports it, and the session still reads as before.
// The refused record reached the WAL file unsynced, so after a restart the session is either
// version (as after any failed fsync), but always whole.
TEST_F(SessionStoreTest, SaveWhoseSyncFailsReportsItAndKeepsThePreviousRecord) {
  const wire::SessionRecord v1 = Record("chat-42", 64, "alice");
  const wire::SessionRecord v2 = Record("chat-42", 128, "alice");
  ASSERT_TRUE(sessions_->Put(kNs, v1).ok());

  fs_->Fail(Op::kSync);
  const Status st = sessions_->Put(kNs, v2);
  EXPECT_FALSE(st.ok()) << "a save whose sync failed was reported as saved";
  EXPECT_GT(fs_->failures(Op::kSync), 0u);
  EXPECT_TRUE(Same(Stored("chat-42"), v1)) << "the previous record changed";

  Restart();
  const wire::SessionRecord after = Stored("chat-42");
  EXPECT_TRUE(Same(after, v1) || Same(after, v2)) << after.DebugString();
  // A working disk takes saves again.
  const wire::SessionRecord v3 = Record("chat-42", 192, "alice");
  ASSERT_TRUE(sessions_->Put(kNs, v3).ok());
  EXPECT_TRUE(Same(Stored("chat-42"), v3));
}

// The device refuses the WAL write itself: nothing of the new record reaches the disk, so the
// previous record is what the session reads, now and after a restart.
TEST_F(SessionStoreTest, SaveWhoseWalWriteFailsKeepsThePreviousRecord) {
  const wire::SessionRecord v1 = Record("chat-7", 48, "bob");
  ASSERT_TRUE(sessions_->Put(kNs, v1).ok());

  fs_->Fail(Op::kWrite, FaultInjectionFileSystem::Error::kNoSpace);
  const Status st = sessions_->Put(kNs, Record("chat-7", 96, "bob"));
  EXPECT_FALSE(st.ok());
  EXPECT_GT(fs_->failures(Op::kWrite), 0u);
  EXPECT_TRUE(Same(Stored("chat-7"), v1));
  // A save after the first failure fails too (RocksDB stops writes once its WAL failed) and
  // leaves the record alone.
  EXPECT_FALSE(sessions_->Put(kNs, Record("chat-7", 112, "bob")).ok());
  EXPECT_TRUE(Same(Stored("chat-7"), v1));

  Restart();
  EXPECT_TRUE(Same(Stored("chat-7"), v1));
}

// A delete is synced too: when the sync fails the caller hears of it.
TEST_F(SessionStoreTest, DeleteWhoseSyncFailsReportsIt) {
  const wire::SessionRecord v1 = Record("chat-9", 32, "carol");
  ASSERT_TRUE(sessions_->Put(kNs, v1).ok());
  fs_->Fail(Op::kSync);
  EXPECT_FALSE(sessions_->Delete(kNs, "chat-9").ok());
  EXPECT_TRUE(Same(Stored("chat-9"), v1));
}

// Which records a node may send to homes that may hold none of the session (read repair, the
// offers after a membership change): deletions, and saves younger than a deletion record's life.
TEST(SessionRepairTest, OnlySavesYoungerThanADeletionRecordsLifeAreRestored) {
  const int64_t now = int64_t{1800000000000};
  const int64_t ttl = SessionHandlers::kTombstoneTtl.count();
  wire::SessionRecord r;
  r.set_session_id("chat");
  r.set_updated_unix_ms(now - 1000);
  EXPECT_TRUE(SessionHandlers::MayRestore(r, now));
  r.set_updated_unix_ms(now - ttl);
  EXPECT_TRUE(SessionHandlers::MayRestore(r, now));
  r.set_updated_unix_ms(now - ttl - 1);  // its deletion record may be gone by now
  EXPECT_FALSE(SessionHandlers::MayRestore(r, now));
  r.set_deleted(true);  // a deletion only ever deletes
  EXPECT_TRUE(SessionHandlers::MayRestore(r, now));
}

}  // namespace
}  // namespace kvpool::daemon
