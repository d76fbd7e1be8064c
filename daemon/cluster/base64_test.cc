#include "daemon/cluster/base64.h"

#include <gtest/gtest.h>

#include <random>

namespace kvpool::daemon::cluster {
namespace {

TEST(Base64Test, KnownAnswersFromRfc4648) {
  const std::pair<const char*, const char*> cases[] = {{"", ""},
                                                       {"f", "Zg=="},
                                                       {"fo", "Zm8="},
                                                       {"foo", "Zm9v"},
                                                       {"foob", "Zm9vYg=="},
                                                       {"fooba", "Zm9vYmE="},
                                                       {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : cases) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    auto decoded = Base64Decode(encoded);
    ASSERT_TRUE(decoded.ok()) << encoded;
    EXPECT_EQ(*decoded, plain);
  }
}

TEST(Base64Test, RoundTripsEveryByteValueAndLength) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 300; ++n) {
    std::string bytes(n, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    auto decoded = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, bytes);
  }
}

TEST(Base64Test, RejectsMalformedInput) {
  for (const char* bad :
       {"Zg", "Zg=", "Z===", "Zm9v!A==", "Zh==", "Zm9=", "=Zm9", "Zg==Zg==", "Zm 9v", "Zm9v\n"}) {
    EXPECT_FALSE(Base64Decode(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kvpool::daemon::cluster
