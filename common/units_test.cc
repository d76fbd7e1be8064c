// ParseBytes and FormatBytes: the sizes people type into flags and read in output.

#include "common/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace kvpool {
namespace {

uint64_t Parsed(const std::string& text) {
  Result<uint64_t> r = ParseBytes(text);
  EXPECT_TRUE(r.ok()) << "'" << text << "': " << r.status().ToString();
  return r.ok() ? *r : UINT64_MAX;
}

void ExpectRejected(const std::string& text) {
  Result<uint64_t> r = ParseBytes(text);
  EXPECT_FALSE(r.ok()) << "'" << text << "' parsed as " << (r.ok() ? *r : 0);
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_FALSE(r.status().message().empty()) << text;
  }
}

TEST(UnitsTest, ParsesBinaryUnits) {
  EXPECT_EQ(Parsed("4GiB"), 4ull << 30);
  EXPECT_EQ(Parsed("512MiB"), 512ull << 20);
  EXPECT_EQ(Parsed("64KiB"), 64ull << 10);
  EXPECT_EQ(Parsed("2TiB"), 2ull << 40);
  EXPECT_EQ(Parsed("4G"), 4ull << 30);
  EXPECT_EQ(Parsed("512M"), 512ull << 20);
  EXPECT_EQ(Parsed("64K"), 64ull << 10);
  EXPECT_EQ(Parsed("1T"), 1ull << 40);
  EXPECT_EQ(Parsed("0.5GiB"), 512ull << 20);
  EXPECT_EQ(Parsed("1.5MiB"), 1536ull << 10);
}

TEST(UnitsTest, ParsesDecimalUnits) {
  EXPECT_EQ(Parsed("1.5GB"), 1500000000ull);
  EXPECT_EQ(Parsed("10KB"), 10000ull);
  EXPECT_EQ(Parsed("3MB"), 3000000ull);
  EXPECT_EQ(Parsed("2TB"), 2000000000000ull);
}

TEST(UnitsTest, ParsesPlainBytes) {
  EXPECT_EQ(Parsed("100"), 100u);
  EXPECT_EQ(Parsed("100B"), 100u);
  EXPECT_EQ(Parsed("100 b"), 100u);
  EXPECT_EQ(Parsed("0"), 0u);
  EXPECT_EQ(Parsed("18446744073"), 18446744073ull);
}

TEST(UnitsTest, IgnoresSurroundingSpaceAndCase) {
  EXPECT_EQ(Parsed(" 2 G "), 2ull << 30);
  EXPECT_EQ(Parsed("\t64 KiB\n"), 64ull << 10);
  EXPECT_EQ(Parsed("4gib"), 4ull << 30);
  EXPECT_EQ(Parsed("4GIB"), 4ull << 30);
  EXPECT_EQ(Parsed("1.5gb"), 1500000000ull);
}

TEST(UnitsTest, RejectsEmptyAndBlank) {
  ExpectRejected("");
  ExpectRejected("   ");
  ExpectRejected("\t\n");
}

TEST(UnitsTest, RejectsUnknownUnits) {
  ExpectRejected("4XB");
  ExpectRejected("4GiBs");
  ExpectRejected("4 bytes");
  ExpectRejected("4Gi");
  ExpectRejected("4 G B");
  ExpectRejected("4e3");
  ExpectRejected("12abc");
}

TEST(UnitsTest, RejectsNonNumbersAndNegatives) {
  ExpectRejected("GiB");
  ExpectRejected("abc");
  ExpectRejected("-1");
  ExpectRejected("-4GiB");
  ExpectRejected("- 4GiB");
  ExpectRejected("+4GiB");
  ExpectRejected("nan");
  ExpectRejected("inf");
}

TEST(UnitsTest, RejectsMalformedNumbers) {
  ExpectRejected(".");
  ExpectRejected(".GiB");
  ExpectRejected("1..5G");
  ExpectRejected("1.2.3");
}

TEST(UnitsTest, RejectsOverflow) {
  ExpectRejected("20000000000000000000");  // > 2^64
  ExpectRejected("99999999TiB");
  ExpectRejected("16777216TiB");                // exactly 2^64
  ExpectRejected("1" + std::string(400, '0'));  // not even a finite double
  ExpectRejected("1" + std::string(400, '0') + "GiB");
  // Large but representable values still parse.
  EXPECT_EQ(Parsed("1048575TiB"), 1048575ull << 40);
}

TEST(UnitsTest, FormatsSmallValuesInBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

// Splits "1.50 GiB" into value and unit.
void SplitFormatted(const std::string& s, double* value, std::string* unit) {
  const size_t space = s.find(' ');
  ASSERT_NE(space, std::string::npos) << s;
  *value = std::strtod(s.substr(0, space).c_str(), nullptr);
  *unit = s.substr(space + 1);
}

TEST(UnitsTest, FormatsWithTheLargestFittingBinaryUnit) {
  struct Case {
    uint64_t bytes;
    double value;
    const char* unit;
  };
  const std::vector<Case> cases = {
      {1024, 1.0, "KiB"},           {64ull << 10, 64.0, "KiB"}, {1536ull << 10, 1.5, "MiB"},
      {512ull << 20, 512.0, "MiB"}, {3ull << 29, 1.5, "GiB"},   {4ull << 30, 4.0, "GiB"},
      {2ull << 40, 2.0, "TiB"},     {3ull << 50, 3.0, "PiB"},
  };
  for (const Case& c : cases) {
    const std::string s = FormatBytes(c.bytes);
    double value;
    std::string unit;
    SplitFormatted(s, &value, &unit);
    EXPECT_EQ(unit, c.unit) << s;
    EXPECT_DOUBLE_EQ(value, c.value) << s;
  }
  // The largest value still formats (in the largest unit).
  double value;
  std::string unit;
  SplitFormatted(FormatBytes(UINT64_MAX), &value, &unit);
  EXPECT_EQ(unit, "PiB");
  EXPECT_NEAR(value, 16384.0, 0.1);
}

TEST(UnitsTest, FormattedValuesParseBackClosely) {
  for (uint64_t bytes :
       {1ull, 999ull, 4096ull, 65537ull, 123456789ull, 5ull << 30, (7ull << 40) + 12345}) {
    const std::string s = FormatBytes(bytes);
    Result<uint64_t> back = ParseBytes(s);
    ASSERT_TRUE(back.ok()) << s << ": " << back.status().ToString();
    const double rel = std::abs(static_cast<double>(*back) - static_cast<double>(bytes)) /
                       static_cast<double>(bytes);
    EXPECT_LT(rel, 0.01) << bytes << " -> " << s << " -> " << *back;
  }
}

}  // namespace
}  // namespace kvpool
