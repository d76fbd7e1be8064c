#include "daemon/session_store.h"

#include <glog/logging.h>
#include <rocksdb/db.h>

#include <algorithm>
#include <memory>

namespace kvpool::daemon {
namespace {

std::string NsPrefix(NamespaceId ns) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(ns >> 24);
  s[1] = static_cast<char>(ns >> 16);
  s[2] = static_cast<char>(ns >> 8);
  s[3] = static_cast<char>(ns);
  return s;
}

}  // namespace

std::string SessionStore::Key(NamespaceId ns, std::string_view session_id) {
  return NsPrefix(ns) + std::string(session_id);
}

Status SessionStore::ValidateId(std::string_view session_id) {
  if (session_id.empty() || session_id.size() > 256) {
    return Status::InvalidArgument("session id must be 1-256 bytes");
  }
  if (session_id.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("session id may not contain NUL");
  }
  return Status::OK();
}

Status SessionStore::Put(NamespaceId ns, const wire::SessionRecord& record) {
  KVPOOL_RETURN_IF_ERROR(ValidateId(record.session_id()));
  std::string value;
  if (!record.SerializeToString(&value)) return Status::Internal("cannot serialize session");
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return KVPOOL_ROCKS_STATUS(
      store_.db()->Put(wo, store_.sessions(), Key(ns, record.session_id()), value));
}

Result<wire::SessionRecord> SessionStore::Get(NamespaceId ns, std::string_view session_id) const {
  KVPOOL_RETURN_IF_ERROR(ValidateId(session_id));
  std::string value;
  rocksdb::Status s =
      store_.db()->Get(rocksdb::ReadOptions(), store_.sessions(), Key(ns, session_id), &value);
  if (s.IsNotFound()) return Status::NotFound("no session '" + std::string(session_id) + "'");
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(s));
  wire::SessionRecord record;
  if (!record.ParseFromString(value)) {
    return Status::Corruption("session '" + std::string(session_id) + "' is damaged on disk");
  }
  return record;
}

Status SessionStore::Delete(NamespaceId ns, std::string_view session_id) {
  if (Status st = Get(ns, session_id).status(); !st.ok() && st.code() != StatusCode::kCorruption) {
    return st;
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return KVPOOL_ROCKS_STATUS(store_.db()->Delete(wo, store_.sessions(), Key(ns, session_id)));
}

Result<std::vector<wire::SessionRecord>> SessionStore::List(NamespaceId ns, std::string_view prefix,
                                                            std::string_view start_after,
                                                            uint32_t limit, bool* truncated) const {
  std::vector<wire::SessionRecord> out;
  *truncated = false;
  const std::string start = Key(ns, prefix);
  const std::string after = Key(ns, start_after);
  std::unique_ptr<rocksdb::Iterator> it(
      store_.db()->NewIterator(rocksdb::ReadOptions(), store_.sessions()));
  it->Seek(std::max(start, after));
  if (!start_after.empty() && it->Valid() && it->key() == rocksdb::Slice(after)) it->Next();
  for (; it->Valid() && it->key().starts_with(start); it->Next()) {
    wire::SessionRecord record;
    if (!record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      LOG(ERROR) << "skipping a damaged session record";
      continue;
    }
    if (record.deleted()) continue;  // a tombstone
    if (out.size() >= limit) {       // another live one
      *truncated = true;
      break;
    }
    out.push_back(std::move(record));
  }
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(it->status()));
  return out;
}

Status SessionStore::ForEach(
    const std::function<void(NamespaceId, const wire::SessionRecord&)>& visit) const {
  // A page of records at a time, read with an iterator released before they are visited: a
  // visitor that talks to peers for a while pins no RocksDB read view (nor the files under it).
  constexpr size_t kPage = 256;
  constexpr size_t kPageBytes = 16 << 20;  // a page ends at this many bytes of records too
  std::string after;                       // the last key read
  for (bool more = true; more;) {
    std::vector<std::pair<NamespaceId, wire::SessionRecord>> page;
    size_t page_bytes = 0;
    {
      std::unique_ptr<rocksdb::Iterator> it(
          store_.db()->NewIterator(rocksdb::ReadOptions(), store_.sessions()));
      if (after.empty()) {
        it->SeekToFirst();
      } else {
        it->Seek(after);
        if (it->Valid() && it->key() == rocksdb::Slice(after)) it->Next();
      }
      for (; it->Valid() && page.size() < kPage && page_bytes < kPageBytes; it->Next()) {
        const rocksdb::Slice k = it->key();
        after.assign(k.data(), k.size());
        page_bytes += it->value().size();
        wire::SessionRecord record;
        if (k.size() < 5 ||
            !record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
          LOG(ERROR) << "skipping a damaged session record";
          continue;
        }
        const auto* p = reinterpret_cast<const uint8_t*>(k.data());
        const NamespaceId ns = static_cast<NamespaceId>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
        page.emplace_back(ns, std::move(record));
      }
      KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(it->status()));
      more = it->Valid();
    }
    for (const auto& [ns, record] : page) visit(ns, record);
  }
  return Status::OK();
}

uint64_t SessionStore::StoredBytes(const wire::SessionRecord& record) {
  return Key(0, record.session_id()).size() + record.ByteSizeLong();
}

}  // namespace kvpool::daemon
