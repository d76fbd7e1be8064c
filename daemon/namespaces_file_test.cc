#include "daemon/namespaces_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace kvpool::daemon {
namespace {

std::vector<std::string> Lines(const Status& st) {
  std::vector<std::string> lines;
  std::string line;
  for (char c : st.message() + "\n") {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  return lines;
}

std::vector<std::string> Errors(const std::string& yaml, const PolicyNames& base = {}) {
  Result<NamespacesConfig> r = ParseNamespacesConfig(yaml, "namespaces.yaml", base);
  EXPECT_FALSE(r.ok()) << yaml;
  if (r.ok()) return {};
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return Lines(r.status());
}

// The four strategies the file sets (DescribePolicy also names others, e.g. the encoding).
std::string Describe(const tiers::NamespacePolicy& p) {
  return "eviction=" + (p.eviction.empty() ? std::string("default") : p.eviction) +
         " write=" + p.write->name() + " admission=" + p.admission->name() +
         " read-ahead=" + p.read_ahead->name();
}

TEST(NamespacesFileTest, ComposesTheDocumentedExample) {
  Result<NamespacesConfig> r = ParseNamespacesConfig(
      "default: {eviction: lru, write: write-back, admission: all, read_ahead: chain-2}\n"
      "namespaces:\n"
      "  tenant-a: {eviction: s3fifo, admission: after-2-hits}\n"
      "  scratch:  {admission: none}\n",
      "namespaces.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exists);
  EXPECT_TRUE(r->has_default);
  EXPECT_EQ(Describe(r->default_policy),
            "eviction=lru write=write-back admission=all read-ahead=chain-2");
  ASSERT_EQ(r->namespaces.size(), 2u);
  EXPECT_EQ(r->namespaces[0].name, "tenant-a");
  EXPECT_EQ(r->namespaces[0].line, 3);
  EXPECT_EQ(Describe(r->namespaces[0].policy),
            "eviction=s3fifo write=write-back admission=after-2-hits read-ahead=chain-2");
  EXPECT_EQ(r->namespaces[1].name, "scratch");
  // No eviction named: the default pool's order (empty), shared with the other namespaces.
  EXPECT_EQ(Describe(r->namespaces[1].policy),
            "eviction=default write=write-back admission=none read-ahead=chain-2");
}

TEST(NamespacesFileTest, TheShippedExampleIsValid) {
  Result<NamespacesConfig> r = LoadNamespacesFile(KVPOOL_EXAMPLE_NAMESPACES, /*must_exist=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->namespaces.size(), 4u);
  EXPECT_EQ(r->namespaces[2].name, "tenant-b");
  EXPECT_EQ(r->namespaces[2].policy.host_quota_bytes, 2ull << 30);
  EXPECT_EQ(r->namespaces[2].policy.disk_quota_bytes, 50ull << 30);
  EXPECT_EQ(r->namespaces[3].name, "llama-8b");
  ASSERT_NE(r->namespaces[3].policy.encoding, nullptr);
  EXPECT_EQ(r->namespaces[3].policy.encoding->name(), "int8");
}

TEST(NamespacesFileTest, NamespacesInheritTheFilesDefault) {
  Result<NamespacesConfig> r = ParseNamespacesConfig(
      "default:\n"
      "  write: write-through-after-3\n"
      "  read_ahead: none\n"
      "namespaces:\n"
      "  a: {eviction: lfu}\n"
      "  b:\n"
      "  c: {}\n",
      "f.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->namespaces.size(), 3u);
  EXPECT_EQ(Describe(r->namespaces[0].policy),
            "eviction=lfu write=write-through-after-3 admission=all read-ahead=none");
  EXPECT_EQ(Describe(r->namespaces[1].policy),
            "eviction=default write=write-through-after-3 admission=all read-ahead=none");
  EXPECT_EQ(r->namespaces[2].names, PolicyNames{});
}

TEST(NamespacesFileTest, DefaultLiesOverTheBase) {
  // The base is the flags' (--write_policy); the file's default wins for what it names.
  PolicyNames base;
  base.write = "write-through";
  Result<NamespacesConfig> r =
      ParseNamespacesConfig("default: {read_ahead: chain-4}\n", "f.yaml", base);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Describe(r->default_policy),
            "eviction=lru write=write-through admission=all read-ahead=chain-4");
  r = ParseNamespacesConfig("default: {write: write-back}\n", "f.yaml", base);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->default_policy.write->name(), "write-back");
}

TEST(NamespacesFileTest, EmptyOrCommentOnlyFileIsTheDefaults) {
  for (const char* text : {"", "# nothing yet\n", "namespaces:\n", "default:\nnamespaces: {}\n"}) {
    Result<NamespacesConfig> r = ParseNamespacesConfig(text, "f.yaml");
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_TRUE(r->namespaces.empty());
    EXPECT_EQ(Describe(r->default_policy),
              "eviction=lru write=write-back admission=all read-ahead=chain-2");
  }
}

TEST(NamespacesFileTest, UnknownStrategyNamesListTheKnownOnesWithFileAndLine) {
  std::vector<std::string> e = Errors(
      "default: {eviction: lru}\n"
      "namespaces:\n"
      "  ok: {eviction: lfu}\n"
      "  tenant-a:\n"
      "    admission: after-2-hits\n"
      "\n"
      "    eviction: arc\n"
      "  b: {write: write-sometimes, read_ahead: chain-0}\n");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0],
            "namespaces.yaml:7: namespace 'tenant-a': unknown eviction order 'arc' (known: lru, "
            "s3fifo, lfu)");
  EXPECT_EQ(e[1].rfind("namespaces.yaml:8: namespace 'b': unknown write policy 'write-sometimes' "
                       "(known: write-back, write-through, write-through-after-N)",
                       0),
            0u)
      << e[1];
  EXPECT_EQ(e[2].rfind("namespaces.yaml:8: namespace 'b': read-ahead 'chain-0': expected chain-N "
                       "with N >= 1",
                       0),
            0u)
      << e[2];
}

TEST(NamespacesFileTest, UnknownKeysAndBadTypesOneLineEach) {
  std::vector<std::string> e = Errors(
      "defaults: {eviction: lru}\n"              // 1: unknown top-level key
      "default: [lru]\n"                         // 2: not a mapping
      "namespaces:\n"                            // 3
      "  a: {evict: lru}\n"                      // 4: unknown key
      "  b: {read-ahead: chain-2}\n"             // 5: near miss
      "  c: {eviction: [lru, lfu]}\n"            // 6: a list
      "  d: {write: }\n"                         // 7: no value
      "  e: lru\n"                               // 8: a scalar for a mapping
      "  f: {eviction: lru, eviction: lfu}\n");  // 9: twice
  ASSERT_EQ(e.size(), 8u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "namespaces.yaml:1: unknown key 'defaults' (known: default, namespaces, access, "
            "admin)");
  EXPECT_EQ(e[1],
            "namespaces.yaml:2: default: expected a mapping of eviction, write, admission, "
            "read_ahead, encoding, layout, lossy, host_quota, disk_quota, gpu_quota, got a list");
  EXPECT_EQ(e[2],
            "namespaces.yaml:4: namespace 'a': unknown key 'evict' (known: eviction, write, "
            "admission, read_ahead, encoding, layout, lossy, host_quota, disk_quota, gpu_quota, "
            "credential_file, unix_users, unix_groups)");
  EXPECT_EQ(e[3],
            "namespaces.yaml:5: namespace 'b': unknown key 'read-ahead' (did you mean "
            "'read_ahead'?)");
  EXPECT_EQ(e[4], "namespaces.yaml:6: namespace 'c': eviction must be a strategy name, got a list");
  EXPECT_EQ(e[5], "namespaces.yaml:7: namespace 'd': write must be a strategy name, got nothing");
  EXPECT_EQ(e[6],
            "namespaces.yaml:8: namespace 'e': expected a mapping of eviction, write, admission, "
            "read_ahead, encoding, layout, lossy, host_quota, disk_quota, gpu_quota, "
            "credential_file, unix_users, unix_groups, got 'lru'");
  EXPECT_EQ(e[7], "namespaces.yaml:9: namespace 'f': 'eviction' given twice (first on line 9)");
}

TEST(NamespacesFileTest, QuotasArePerNamespaceSizes) {
  Result<NamespacesConfig> c = ParseNamespacesConfig(
      "namespaces:\n"
      "  a: {host_quota: 4GiB, eviction: lru}\n"
      "  b: {disk_quota: 512MiB, gpu_quota: 2GiB}\n"
      "  c: {}\n",
      "namespaces.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->namespaces.size(), 3u);
  EXPECT_EQ(c->namespaces[0].policy.host_quota_bytes, 4ull << 30);
  EXPECT_EQ(c->namespaces[0].policy.disk_quota_bytes, 0u);
  EXPECT_EQ(c->namespaces[1].policy.disk_quota_bytes, 512ull << 20);
  EXPECT_EQ(c->namespaces[1].policy.gpu_quota_bytes, 2ull << 30);
  EXPECT_EQ(c->namespaces[0].policy.gpu_quota_bytes, 0u);
  EXPECT_EQ(c->namespaces[2].policy.host_quota_bytes, 0u);
  EXPECT_EQ(c->namespaces[2].policy.disk_quota_bytes, 0u);
  EXPECT_EQ(c->default_policy.host_quota_bytes, 0u);
}

TEST(NamespacesFileTest, DefaultQuotasBoundEveryNamespaceThatGivesNone) {
  Result<NamespacesConfig> c = ParseNamespacesConfig(
      "default: {host_quota: 2GiB, disk_quota: 10GiB}\n"
      "namespaces:\n"
      "  big: {host_quota: 8GiB}\n"
      "  plain: {eviction: lfu}\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->default_policy.host_quota_bytes, 2ull << 30);
  EXPECT_EQ(c->default_policy.disk_quota_bytes, 10ull << 30);
  EXPECT_EQ(c->namespaces[0].policy.host_quota_bytes, 8ull << 30);
  EXPECT_EQ(c->namespaces[0].policy.disk_quota_bytes, 10ull << 30);
  EXPECT_EQ(c->namespaces[1].policy.host_quota_bytes, 2ull << 30);
  EXPECT_EQ(c->namespaces[1].policy.disk_quota_bytes, 10ull << 30);
}

TEST(NamespacesFileTest, BadQuotasAndCapacitiesAreRefusedNotIgnored) {
  std::vector<std::string> e = Errors(
      "default: {host_quota: none}\n"
      "namespaces:\n"
      "  a: {host_quota: lots, disk_quota: 0}\n"
      "  b:\n"
      "    disk_capacity: 100GiB\n"
      "  c: {gpu_capacity: 1GiB, disk_quota: [1]}\n"
      "quotas: {a: 1GiB}\n");
  ASSERT_EQ(e.size(), 7u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "namespaces.yaml:1: default: host_quota must be a size above zero such as 512MiB or "
            "20GiB, got 'none'");
  EXPECT_EQ(e[1],
            "namespaces.yaml:3: namespace 'a': host_quota must be a size above zero such as "
            "512MiB or 20GiB, got 'lots'");
  EXPECT_EQ(e[2],
            "namespaces.yaml:3: namespace 'a': disk_quota must be a size above zero such as "
            "512MiB or 20GiB, got '0'");
  EXPECT_EQ(e[3].rfind("namespaces.yaml:5: namespace 'b': 'disk_capacity' is not supported", 0), 0u)
      << e[3];
  EXPECT_EQ(e[4].rfind("namespaces.yaml:6: namespace 'c': 'gpu_capacity' is not supported", 0), 0u)
      << e[4];
  EXPECT_EQ(e[5].rfind("namespaces.yaml:6: namespace 'c': disk_quota must be a size", 0), 0u)
      << e[5];
  EXPECT_EQ(e[6].rfind("namespaces.yaml:7: 'quotas' is not supported", 0), 0u) << e[6];
}

TEST(NamespacesFileTest, EncodingOnDemotionNeedsALayoutAndConsentToLossyCopies) {
  Result<NamespacesConfig> c = ParseNamespacesConfig(
      "namespaces:\n"
      "  llama:\n"
      "    encoding: int8\n"
      "    lossy: true\n"
      "    layout: {layers: 32, kv_heads: 8, head_dim: 128, tokens: 16, dtype: bf16}\n"
      "  plain: {}\n",
      "namespaces.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->namespaces.size(), 2u);
  ASSERT_NE(c->namespaces[0].policy.encoding, nullptr);
  EXPECT_EQ(c->namespaces[0].policy.encoding->name(), "int8");
  EXPECT_EQ(c->namespaces[0].policy.encoding->raw_bytes(), 32u * 2 * 16 * 8 * 128 * 2);
  EXPECT_EQ(c->namespaces[1].policy.encoding, nullptr) << "raw unless asked";

  std::vector<std::string> e = Errors(
      "namespaces:\n"
      "  a: {encoding: int8, layout: {layers: 2, kv_heads: 2, head_dim: 64, tokens: 16, "
      "dtype: fp16}}\n"                                                      // 2: no lossy
      "  b: {encoding: fp8-e4m3, lossy: true}\n"                             // 3: no layout
      "  c: {encoding: zstd}\n"                                              // 4: unknown
      "  d: {lossy: maybe}\n"                                                // 5: not a bool
      "  e: {layout: {layers: 2, kv_heads: 2, head_dim: 64, dtype: fp8}}\n"  // 6: dtype, tokens
      "  f: {encoding: int4-g64, lossy: true, layout: {layers: 1, kv_heads: 1, head_dim: 48, "
      "tokens: 4, dtype: fp16}}\n");  // 7: head_dim
  ASSERT_EQ(e.size(), 6u) << ::testing::PrintToString(e);
  EXPECT_NE(e[0].find("namespaces.yaml:4: namespace 'c': unknown encoding on demotion 'zstd'"),
            std::string::npos)
      << e[0];
  EXPECT_NE(e[1].find("namespaces.yaml:5: namespace 'd': lossy must be true or false"),
            std::string::npos)
      << e[1];
  EXPECT_NE(e[2].find("namespaces.yaml:6: namespace 'e': layout dtype must be fp16, bf16 or fp32"),
            std::string::npos)
      << e[2];
  EXPECT_NE(e[3].find("namespaces.yaml:2: namespace 'a': encoding 'int8' is lossy: add "
                      "'lossy: true'"),
            std::string::npos)
      << e[3];
  EXPECT_NE(e[4].find("namespaces.yaml:3: namespace 'b': encoding 'fp8-e4m3' needs the "
                      "namespace's block 'layout'"),
            std::string::npos)
      << e[4];
  EXPECT_NE(e[5].find("namespaces.yaml:7: namespace 'f':"), std::string::npos) << e[5];
}

TEST(NamespacesFileTest, BadAndDuplicateNamespaceNamesUseTheRegistrysRules) {
  std::vector<std::string> e = Errors(
      "namespaces:\n"
      "  'tenant a': {}\n"
      "  ok-1: {}\n"
      "  ok-1: {eviction: lfu}\n"
      "  ? [x]\n"
      "  : {}\n"
      "  '': {}\n"
      "  " +
      std::string(129, 'n') + ": {}\n");
  ASSERT_EQ(e.size(), 5u) << ::testing::PrintToString(e);
  EXPECT_EQ(
      e[0],
      "namespaces.yaml:2: namespace name 'tenant a' may only hold letters, digits and . _ - :");
  EXPECT_EQ(e[1], "namespaces.yaml:4: namespace 'ok-1' given twice (first on line 3)");
  EXPECT_EQ(e[2], "namespaces.yaml:5: namespaces: expected a namespace name, got a list");
  EXPECT_EQ(e[3], "namespaces.yaml:7: namespace '': namespace name must be 1-128 characters");
  EXPECT_EQ(e[4].rfind("namespaces.yaml:8: namespace 'nnn", 0), 0u) << e[4];
}

TEST(NamespacesFileTest, ContradictoryCompositionsNameTheNamespace) {
  // write-through into a disk that admits nothing, directly and through the default.
  std::vector<std::string> e = Errors(
      "default: {write: write-through}\n"
      "namespaces:\n"
      "  fine: {}\n"
      "  scratch: {admission: none}\n"
      "  wb: {admission: none, write: write-back}\n");
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "namespaces.yaml:4: namespace 'scratch': write policy 'write-through' writes blocks "
            "to disk that admission 'none' does not take");

  e = Errors("default: {write: write-through, admission: none}\nnamespaces: {a: {}}\n");
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0].rfind("namespaces.yaml:1: default: write policy 'write-through'", 0), 0u) << e[0];

  // The flags' write policy (the base) against the file's default admission.
  PolicyNames base;
  base.write = "write-through";
  e = Errors("default: {admission: none}\n", base);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rfind("namespaces.yaml:1: default: write policy 'write-through'", 0), 0u) << e[0];
}

TEST(NamespacesFileTest, SyntaxErrorsAndWrongDocumentsHaveALine) {
  std::vector<std::string> e = Errors("default: {eviction: lru\nnamespaces:\n  a: {}\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("YAML syntax error"), std::string::npos) << e[0];
  EXPECT_EQ(e[0].rfind("namespaces.yaml:", 0), 0u) << e[0];

  e = Errors("namespaces:\n  a: {eviction: lru}\n   b: x\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rfind("namespaces.yaml:3: YAML syntax error", 0), 0u) << e[0];

  e = Errors("- default\n- namespaces\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0],
            "namespaces.yaml:1: expected a mapping with 'default' and 'namespaces', got a list");

  e = Errors("namespaces: [a, b]\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rfind("namespaces.yaml:1: namespaces: expected a mapping", 0), 0u) << e[0];
}

TEST(NamespacesFileTest, MissingFileIsTheDefaultsOnlyWhenOptional) {
  const std::string path =
      ::testing::TempDir() + "/no-such-namespaces-" + std::to_string(getpid()) + ".yaml";
  Result<NamespacesConfig> r = LoadNamespacesFile(path, /*must_exist=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->exists);
  EXPECT_TRUE(r->namespaces.empty());
  r = LoadNamespacesFile(path, /*must_exist=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path), std::string::npos);

  r = LoadNamespacesFile(::testing::TempDir(), /*must_exist=*/false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);

  {
    std::ofstream out(path);
    out << "namespaces:\n  a: {eviction: nope}\n";
  }
  r = LoadNamespacesFile(path, /*must_exist=*/false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Lines(r.status()).at(0).rfind(path + ":2: namespace 'a': unknown eviction order", 0),
            0u)
      << r.status().message();
  std::remove(path.c_str());
}

TEST(NamespacesFileTest, AccessKeysSayWhoMayActForANamespaceAndForTheAdmin) {
  Result<NamespacesConfig> r = ParseNamespacesConfig(
      "access: declared\n"
      "admin: {unix_users: [root], credential_file: /etc/kvpool/credentials/admin}\n"
      "namespaces:\n"
      "  tenant-a: {eviction: lfu, credential_file: /etc/kvpool/credentials/a}\n"
      "  tenant-b: {unix_users: vllm, unix_groups: [inference, 1001]}\n",
      "namespaces.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->declared_only);
  ASSERT_TRUE(r->admin.has_value());
  EXPECT_EQ(r->admin->credential_file, "/etc/kvpool/credentials/admin");
  EXPECT_EQ(r->admin->unix_users, std::vector<std::string>{"root"});
  EXPECT_EQ(r->admin->line, 2);
  ASSERT_EQ(r->namespaces.size(), 2u);
  EXPECT_EQ(r->namespaces[0].access.credential_file, "/etc/kvpool/credentials/a");
  EXPECT_EQ(Describe(r->namespaces[0].policy),
            "eviction=lfu write=write-back admission=all read-ahead=chain-2");
  EXPECT_EQ(r->namespaces[1].access.unix_users, std::vector<std::string>{"vllm"});
  EXPECT_EQ(r->namespaces[1].access.unix_groups, (std::vector<std::string>{"inference", "1001"}));
  EXPECT_EQ(r->namespaces[1].access.line, 5);

  // Without `access`, the file is open to other namespaces and has no admin section.
  Result<NamespacesConfig> open = ParseNamespacesConfig("namespaces:\n  a: {}\n", "x.yaml");
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_FALSE(open->declared_only);
  EXPECT_FALSE(open->admin.has_value());
  EXPECT_TRUE(open->namespaces[0].access.empty());
}

TEST(NamespacesFileTest, BadAccessKeysAreRefusedOneLineEach) {
  const std::vector<std::string> e = Errors(
      "access: closed\n"                         // 1: not open or declared
      "default: {credential_file: /x}\n"         // 2: not in the default
      "admin: {users: [root]}\n"                 // 3: unknown admin key
      "namespaces:\n"                            // 4
      "  a: {credential_file: relative/path}\n"  // 5: not absolute
      "  b: {unix_users: []}\n"                  // 6: empty
      "  c: {unix_groups: [{x: 1}]}\n");         // 7: not a name
  ASSERT_EQ(e.size(), 6u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "namespaces.yaml:1: access must be 'open' (any namespace may be named) or "
            "'declared' (only the namespaces of this file), got 'closed'");
  EXPECT_EQ(e[1],
            "namespaces.yaml:2: default: credential_file says who may act for one namespace; "
            "give it under that namespace (or in the admin section)");
  EXPECT_EQ(e[2],
            "namespaces.yaml:3: admin: unknown key 'users' (known: credential_file, unix_users, "
            "unix_groups)");
  EXPECT_EQ(e[3],
            "namespaces.yaml:5: namespace 'a': credential_file must be an absolute path, got "
            "'relative/path'");
  EXPECT_EQ(e[4],
            "namespaces.yaml:6: namespace 'b': unix_users must be a list of user names or ids "
            "such as [vllm], got a list");
  EXPECT_EQ(e[5],
            "namespaces.yaml:7: namespace 'c': unix_groups must list group names or ids, got a "
            "mapping");
}

TEST(NamespacesFileTest, DeclaredAccessNeedsAnAdminAndACredentialForEveryNamespace) {
  const std::vector<std::string> e = Errors(
      "access: declared\n"
      "namespaces:\n"
      "  a: {unix_users: [root]}\n"
      "  b: {eviction: lru}\n");
  ASSERT_EQ(e.size(), 2u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "namespaces.yaml:4: namespace 'b' has no credential: under 'access: declared' each "
            "namespace needs a credential_file, unix_users or unix_groups");
  EXPECT_EQ(e[1],
            "namespaces.yaml:1: access: declared needs an 'admin' section (who may run admin "
            "requests), e.g. admin: {unix_users: [root]}");
}

}  // namespace
}  // namespace kvpool::daemon
