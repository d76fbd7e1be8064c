#include "daemon/cluster/etcd_replies.h"

#include <algorithm>
#include <charconv>

#include "daemon/cluster/base64.h"

namespace kvpool::daemon::cluster {
namespace {

using json = nlohmann::json;

// The field of an object; null when `j` is not an object or has no such field.
const json* Field(const json& j, const char* name) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

bool JsonBool(const json& j, const char* field) {
  const json* f = Field(j, field);
  return f != nullptr && f->is_boolean() && f->get<bool>();
}

std::string JsonText(const json& j, const char* field, std::string fallback) {
  const json* f = Field(j, field);
  return f != nullptr && f->is_string() ? f->get<std::string>() : std::move(fallback);
}

const json& EmptyObject() {
  static const json* const empty = new json(json::object());
  return *empty;
}

const json& Object(const json& j, const char* field) {
  const json* f = Field(j, field);
  return f != nullptr && f->is_object() ? *f : EmptyObject();
}

Result<KeyValue> ParseKeyValue(const json& j) {
  if (!j.is_object()) return Status::Corruption("etcd kv is not an object");
  KeyValue kv;
  for (auto [field, out] : {std::pair{"key", &kv.key}, std::pair{"value", &kv.value}}) {
    const json* f = Field(j, field);
    if (f == nullptr) continue;  // proto3 JSON omits empty bytes
    if (!f->is_string()) return Status::Corruption(std::string("etcd kv ") + field + " not text");
    KVPOOL_ASSIGN_OR_RETURN(*out, Base64Decode(f->get_ref<const std::string&>()));
  }
  kv.create_revision = JsonInt(j, "create_revision");
  kv.mod_revision = JsonInt(j, "mod_revision");
  kv.version = JsonInt(j, "version");
  kv.lease = JsonInt(j, "lease");
  return kv;
}

// gRPC status codes as etcd's gateway reports them in {"code": N}.
Status FromGrpcCode(int64_t code, const std::string& message) {
  switch (code) {
    case 3:
      return Status::InvalidArgument("etcd: " + message);
    case 5:
      return Status::NotFound("etcd: " + message);
    case 6:
      return Status::AlreadyExists("etcd: " + message);
    case 7:
    case 16:
      return Status::PermissionDenied("etcd: " + message);
    case 8:
      return Status::ResourceExhausted("etcd: " + message);
    case 4:
    case 14:
      return Status::Unavailable("etcd: " + message);
    default:
      return Status::FailedPrecondition("etcd: " + message);
  }
}

}  // namespace

int64_t JsonInt(const json& j, const char* field) {
  const json* f = Field(j, field);
  if (f == nullptr) return 0;
  if (f->is_number_integer()) {
    // An unsigned above int64's range is not a revision, lease or count etcd would send.
    if (f->is_number_unsigned() && f->get<uint64_t>() > uint64_t(INT64_MAX)) return 0;
    return f->get<int64_t>();
  }
  if (f->is_string()) {
    const std::string& s = f->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return 0;
}

int64_t HeaderRevision(const json& j) { return JsonInt(Object(j, "header"), "revision"); }

Result<json> ParseReplyBody(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption("reply is not JSON");
  if (!j.is_object()) return Status::Corruption("reply is not a JSON object");
  return j;
}

Status ErrorOfReply(const std::string& where, unsigned http_status, const json& j) {
  const json* code = Field(j, "code");
  if (code != nullptr && code->is_number_integer()) {
    return FromGrpcCode(JsonInt(j, "code"), JsonText(j, "error", JsonText(j, "message", "?")));
  }
  if (http_status >= 500) {
    return Status::Unavailable("etcd " + where + ": HTTP " + std::to_string(http_status));
  }
  return Status::FailedPrecondition("etcd " + where + ": HTTP " + std::to_string(http_status));
}

Result<RangeResult> ParseRangeReply(const json& j) {
  RangeResult out;
  out.revision = HeaderRevision(j);
  const json* kvs = Field(j, "kvs");
  if (kvs != nullptr) {
    if (!kvs->is_array()) return Status::Corruption("etcd range kvs is not a list");
    for (const auto& e : *kvs) {
      KVPOOL_ASSIGN_OR_RETURN(auto kv, ParseKeyValue(e));
      out.kvs.push_back(std::move(kv));
    }
  }
  return out;
}

Result<PutIfAbsentResult> ParseTxnReply(const json& j) {
  PutIfAbsentResult out;
  out.created = JsonBool(j, "succeeded");
  out.revision = HeaderRevision(j);
  if (out.created) return out;
  const json* responses = Field(j, "responses");
  if (responses == nullptr || !responses->is_array() || responses->empty() ||
      !(*responses)[0].is_object()) {
    return Status::Corruption("etcd txn reply without the failure branch's range");
  }
  KVPOOL_ASSIGN_OR_RETURN(auto range, ParseRangeReply(Object((*responses)[0], "response_range")));
  // The key can vanish between the compare and the read only in another transaction; none
  // runs between them (a txn is atomic), so an empty range here would be an etcd bug.
  if (range.kvs.empty()) return Status::Corruption("etcd txn: compare failed on an absent key");
  out.existing = std::move(range.kvs.front());
  return out;
}

Result<LeaseGrant> ParseLeaseGrantReply(const json& j) {
  const std::string error = JsonText(j, "error", "");
  if (!error.empty()) return Status::FailedPrecondition("etcd lease grant: " + error);
  LeaseGrant out{JsonInt(j, "ID"), JsonInt(j, "TTL")};
  if (out.id == 0 || out.ttl_seconds <= 0) return Status::Corruption("etcd lease grant: no ID/TTL");
  return out;
}

Result<int64_t> ParseKeepAliveReply(const json& j, int64_t lease) {
  if (const json* error = Field(j, "error")) {
    return Status::Unavailable("etcd lease keepalive: " +
                               error->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  const int64_t ttl = JsonInt(Object(j, "result"), "TTL");
  if (ttl <= 0) return Status::NotFound("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

WatchMessage ParseWatchMessage(std::string_view line) {
  WatchMessage m;
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    m.reason = "not a JSON object";
    return m;
  }
  if (const json* error = Field(j, "error")) {
    m.kind = WatchMessage::Kind::kError;
    m.reason = error->dump(-1, ' ', false, json::error_handler_t::replace);
    return m;
  }
  const json& result = Object(j, "result");
  if (JsonBool(result, "canceled")) {
    m.revision = JsonInt(result, "compact_revision");
    m.kind = m.revision > 0 ? WatchMessage::Kind::kCompacted : WatchMessage::Kind::kCanceled;
    m.reason = JsonText(result, "cancel_reason", "?");
    return m;
  }
  m.revision = HeaderRevision(result);
  if (JsonBool(result, "created")) {
    m.kind = WatchMessage::Kind::kCreated;
    return m;
  }
  const json* events = Field(result, "events");
  if (events == nullptr || !events->is_array() || events->empty()) {
    m.kind = WatchMessage::Kind::kProgress;
    return m;
  }
  for (const auto& e : *events) {
    auto kv = ParseKeyValue(Object(e, "kv"));
    if (!kv.ok()) {
      m.kind = WatchMessage::Kind::kInvalid;
      m.reason = "bad event: " + kv.status().ToString();
      return m;
    }
    const bool is_delete = JsonText(e, "type", "PUT") == "DELETE";
    m.update.revision = std::max(m.update.revision, kv->mod_revision);
    m.update.events.push_back(
        WatchEvent{is_delete ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut, std::move(*kv)});
  }
  m.kind = WatchMessage::Kind::kEvents;
  return m;
}

}  // namespace kvpool::daemon::cluster
