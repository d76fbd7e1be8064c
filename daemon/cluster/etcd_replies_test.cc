// etcd's replies and peers' member records of the wrong shape are errors, never exceptions or
// undefined behaviour (each case below was a crash or UBSan report before fuzz_etcd_replies).

#include "daemon/cluster/etcd_replies.h"

#include <gtest/gtest.h>

#include "daemon/cluster/membership.h"

namespace kvpool::daemon::cluster {
namespace {

TEST(EtcdReplies, AReplyThatIsNotAnObjectIsCorruption) {
  for (const char* body : {"[]", "5", "\"x\"", "null", "{", ""}) {
    EXPECT_EQ(ParseReplyBody(body).status().code(), StatusCode::kCorruption) << body;
  }
}

TEST(EtcdReplies, FieldsOfTheWrongTypeAreErrorsNotExceptions) {
  auto j = ParseReplyBody(R"({"header": [1], "kvs": [5], "succeeded": false,
                              "responses": [{"response_range": 3}], "result": "x"})");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(HeaderRevision(*j), 0);
  EXPECT_EQ(ParseRangeReply(*j).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseTxnReply(*j).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseLeaseGrantReply(*j).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseKeepAliveReply(*j, 1).status().code(), StatusCode::kNotFound);
  auto error = ParseReplyBody(R"({"code": 5, "error": 7})");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(ErrorOfReply("e", 404, *error).code(), StatusCode::kNotFound);
  auto huge = ParseReplyBody(R"({"code": 18446744073709551615})");
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(ErrorOfReply("e", 400, *huge).code(), StatusCode::kFailedPrecondition);
}

TEST(EtcdReplies, WatchLinesOfTheWrongShape) {
  EXPECT_EQ(ParseWatchMessage("[1]").kind, WatchMessage::Kind::kInvalid);
  EXPECT_EQ(ParseWatchMessage(R"({"result": {"events": [7]}})").kind,
            WatchMessage::Kind::kEvents);  // an event without a kv: an empty key
  WatchMessage m = ParseWatchMessage(
      R"({"result": {"events": [{"type": 3, "kv": {"key": "YQ==", "mod_revision": "9"}}]}})");
  ASSERT_EQ(m.kind, WatchMessage::Kind::kEvents);
  ASSERT_EQ(m.update.events.size(), 1u);
  EXPECT_EQ(m.update.events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(m.update.events[0].kv.key, "a");
  EXPECT_EQ(m.update.revision, 9);
  EXPECT_EQ(ParseWatchMessage(R"({"result": {"events": [{"kv": {"key": 5}}]}})").kind,
            WatchMessage::Kind::kInvalid);
}

TEST(MemberRecords, AFloatWhereAnIntegerBelongsIsCorruption) {
  const std::string record =
      R"({"auth":"3q2+7w==","capacity_bytes":1e47,"cluster":"prod","control_address":"a:1",)"
      R"("instance":"i","node_id":"n","started_at_ms":1,"ucx_worker_address":"","used_bytes":0,)"
      R"("version":1})";
  EXPECT_EQ(DecodeMemberRecord(record).status().code(), StatusCode::kCorruption);
  std::string negative = record;
  negative.replace(negative.find("1e47"), 4, "-1");
  EXPECT_EQ(DecodeMemberRecord(negative).status().code(), StatusCode::kCorruption);
  std::string good = record;
  good.replace(good.find("1e47"), 4, "1073741824");
  auto r = DecodeMemberRecord(good);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->capacity_bytes, 1073741824u);
}

}  // namespace
}  // namespace kvpool::daemon::cluster
