// WriteDown and ReadUp over a real RocksDB block store: raw blocks come back byte for byte,
// encoded ones as the kernels' own round trip of the same bytes, and a copy whose record does
// not match what the index expects is refused, never served.

#include "tiers/tier_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "kernels/block_layout.h"
#include "kernels/dtype.h"
#include "tests/support/temp_dir.h"
#include "tiers/disk_tier.h"
#include "tiers/rocks_store.h"
#include "tiers/test_kv_blocks.h"

namespace kvpool::tiers {
namespace {

BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng(n * 7919 + 3);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

class TierCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    RocksStoreOptions o;
    o.path = dir_.Join("rocksdb");
    o.block_cache_bytes = 8 << 20;
    Result<std::unique_ptr<RocksStore>> s = RocksStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    disk_ = std::make_unique<DiskTier>(*store_);
  }

  static DiskWrite WriteOf(NamespaceId ns, const BlockKey& key, const std::vector<uint8_t>& b) {
    DiskWrite w;
    w.ns = ns;
    w.key = key;
    w.meta.size = b.size();
    w.meta.checksum = BlockChecksum(b.data(), b.size());
    w.data = b.data();
    return w;
  }

  ::kvpool::testing::TempDir dir_{"kvpool-tier-copy"};
  std::unique_ptr<RocksStore> store_;
  std::unique_ptr<DiskTier> disk_;
};

TEST_F(TierCopyTest, RawAndEncodedBlocksComeBackAsPutOrAsTheKernelsRoundTrip) {
  const kernels::BlockLayout raw = SmallLayout();
  Result<std::shared_ptr<const DemotionEncoding>> int8 = CreateDemotionEncoding("int8", raw);
  ASSERT_TRUE(int8.ok()) << int8.status().ToString();
  const std::vector<uint8_t> a = KvBytes(raw, 1);
  const std::vector<uint8_t> b = KvBytes(raw, 2);
  std::vector<DiskWrite> writes = {WriteOf(1, KeyOf(1), a), WriteOf(1, KeyOf(2), b)};
  const std::vector<const DemotionEncoding*> encodings = {nullptr, int8->get()};
  ASSERT_TRUE(WriteDown(*disk_, writes, encodings, /*sync=*/true).ok());
  EXPECT_EQ(writes[0].meta.encoding, 0);
  EXPECT_EQ(writes[1].meta.encoding, static_cast<uint8_t>(kernels::Encoding::kInt8));
  EXPECT_EQ(writes[1].meta.stored_size, (*int8)->encoded_bytes());
  EXPECT_LT(writes[1].meta.stored_size, b.size());

  // Raw: byte for byte, and the checksum is the one put.
  std::vector<uint8_t> out(a.size());
  uint64_t checksum = 0;
  const DiskCopy raw_copy{1, KeyOf(1), a.size(), writes[0].meta.checksum, 0};
  ASSERT_TRUE(ReadUp(*disk_, raw_copy, out.data(), &checksum).ok());
  EXPECT_EQ(out, a);
  EXPECT_EQ(checksum, BlockChecksum(a.data(), a.size()));

  // Encoded: what the encoding's own Encode then Decode makes of the same bytes.
  std::vector<uint8_t> encoded((*int8)->encoded_bytes());
  std::vector<uint8_t> reference(b.size());
  ASSERT_TRUE((*int8)->Encode(b.data(), encoded.data()).ok());
  ASSERT_TRUE((*int8)->Decode(encoded.data(), reference.data()).ok());
  const DiskCopy encoded_copy{1, KeyOf(2), b.size(), writes[1].meta.checksum,
                              static_cast<uint8_t>(kernels::Encoding::kInt8)};
  ASSERT_TRUE(ReadUp(*disk_, encoded_copy, out.data(), &checksum).ok());
  EXPECT_EQ(out, reference);
  EXPECT_NE(out, b) << "int8 is lossy: the bytes are approximate";
  EXPECT_EQ(checksum, BlockChecksum(reference.data(), reference.size()));

  // As stored: the encoded body itself, with the record that decodes it.
  std::unique_ptr<uint8_t[]> body;
  Result<DiskBlockMeta> meta = ReadEncoded(*disk_, encoded_copy, &body);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ASSERT_EQ(meta->stored_size, encoded.size());
  EXPECT_EQ(std::memcmp(body.get(), encoded.data(), encoded.size()), 0);
  EXPECT_EQ(meta->layout.encoding, kernels::Encoding::kInt8);
  EXPECT_EQ(ReadEncoded(*disk_, raw_copy, &body).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TierCopyTest, ACopyThatDoesNotMatchTheIndexIsRefused) {
  const kernels::BlockLayout raw = SmallLayout();
  Result<std::shared_ptr<const DemotionEncoding>> int8 = CreateDemotionEncoding("int8", raw);
  ASSERT_TRUE(int8.ok());
  const std::vector<uint8_t> a = KvBytes(raw, 3);
  std::vector<DiskWrite> writes = {WriteOf(1, KeyOf(3), a)};
  const std::vector<const DemotionEncoding*> encodings = {int8->get()};
  ASSERT_TRUE(WriteDown(*disk_, writes, encodings, true).ok());
  std::vector<uint8_t> out(a.size());
  uint64_t checksum = 0;

  // The index believes it another encoding, or another size: Corruption, nothing decoded.
  DiskCopy wrong_encoding{1, KeyOf(3), a.size(), 0,
                          static_cast<uint8_t>(kernels::Encoding::kFp8E4M3)};
  EXPECT_EQ(ReadUp(*disk_, wrong_encoding, out.data(), &checksum).code(), StatusCode::kCorruption);
  DiskCopy wrong_size{1, KeyOf(3), a.size() / 2, 0, static_cast<uint8_t>(kernels::Encoding::kInt8)};
  EXPECT_EQ(ReadUp(*disk_, wrong_size, out.data(), &checksum).code(), StatusCode::kCorruption);
  // Read as raw: the stored body is the encoded one, so its size and checksum do not verify.
  DiskCopy as_raw{1, KeyOf(3), a.size(), BlockChecksum(a.data(), a.size()), 0};
  EXPECT_FALSE(ReadUp(*disk_, as_raw, out.data(), &checksum).ok());
  // Another namespace, or a key never written: NotFound.
  EXPECT_EQ(ReadUp(*disk_, DiskCopy{2, KeyOf(3), a.size(), 0, 0}, out.data(), &checksum).code(),
            StatusCode::kNotFound);

  // One encoding per write or none.
  const std::vector<const DemotionEncoding*> two = {nullptr, nullptr};
  EXPECT_EQ(WriteDown(*disk_, writes, two, false).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool::tiers
