// AccessControl: the namespaces file's access rules resolved (credential files, users, groups)
// and each kind of hello admitted, challenged or refused as daemon/access_control.h says.

#include "daemon/access_control.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/hello_auth.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvpool::daemon {
namespace {

using Outcome = HelloVerdict::Outcome;
using kvpool::testing::TempDir;

constexpr const char* kTenantSecret = "tenant-a-secret-0123456789";
constexpr const char* kAdminSecret = "admin-secret-0123456789abcdef";
constexpr const char* kClusterSecret = "cluster-secret-0123456789";

class AccessControlTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // A credential file holding `secret` (and a newline), mode `mode`.
  std::string SecretFile(const std::string& name, const std::string& secret, mode_t mode = 0600) {
    const std::string path = dir_.Join(name);
    std::ofstream(path) << secret << "\n";
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  // Parses and resolves `yaml`.
  Result<AccessRules> Rules(const std::string& yaml) {
    KVPOOL_ASSIGN_OR_RETURN(NamespacesConfig config, ParseNamespacesConfig(yaml, "ns.yaml"));
    return ResolveAccess(config);
  }

  // The rules every admission case below runs under: tenant-a has a secret, tenant-b admits
  // this process's user, tenant-c this process's primary group, and the admin has a secret.
  std::string DeclaredYaml() {
    return "access: declared\n"
           "admin: {credential_file: " +
           SecretFile("admin", kAdminSecret) +
           "}\n"
           "namespaces:\n"
           "  tenant-a: {credential_file: " +
           SecretFile("tenant-a", kTenantSecret) +
           "}\n"
           "  tenant-b: {unix_users: [" +
           std::to_string(getuid()) +
           "]}\n"
           "  tenant-c: {unix_groups: [" +
           std::to_string(getgid()) + "]}\n";
  }

  static HelloClaim Local(std::string_view ns, const transport::PeerCredentials* who) {
    HelloClaim c;
    c.namespace_name = ns;
    c.local = true;
    c.credentials = who;
    return c;
  }

  TempDir dir_{"kvpool-access"};
  const std::string challenge_ = NewHelloChallenge();
  // Neither this process's user nor in its groups (ids far above any real account).
  const transport::PeerCredentials stranger_{1, 4000000001u, 4000000001u, {}};
  const transport::PeerCredentials me_{1, getuid(), getgid(), {}};
};

TEST_F(AccessControlTest, CredentialFilesAreReadTrimmedAndMustBePrivateAndLongEnough) {
  auto rules = Rules("namespaces:\n  a: {credential_file: " + SecretFile("a", kTenantSecret) +
                     "}\n  open-one: {eviction: lru}\n");
  ASSERT_OK(rules);
  ASSERT_TRUE(rules->namespaces.at("a").has_value());
  EXPECT_EQ(rules->namespaces.at("a")->secret, kTenantSecret);  // the newline is not part of it
  EXPECT_FALSE(rules->namespaces.at("open-one").has_value());
  EXPECT_TRUE(rules->guarded());

  auto world =
      Rules("namespaces:\n  a: {credential_file: " + SecretFile("w", kTenantSecret, 0644) + "}\n");
  ASSERT_FALSE(world.ok());
  EXPECT_NE(world.status().message().find("ns.yaml:2: namespace 'a': credential_file "),
            std::string::npos)
      << world.status().message();
  EXPECT_NE(world.status().message().find("(chmod 600 or 640 "), std::string::npos);
  // Writable by its group: refused too (a member could replace the secret).
  auto group_writable =
      Rules("namespaces:\n  a: {credential_file: " + SecretFile("g", kTenantSecret, 0660) + "}\n");
  ASSERT_FALSE(group_writable.ok());
  // Readable by its group (the kvpool group's operators): fine.
  ASSERT_OK(
      Rules("namespaces:\n  a: {credential_file: " + SecretFile("r", kTenantSecret, 0640) + "}\n"));

  auto short_one =
      Rules("namespaces:\n  a: {credential_file: " + SecretFile("s", "short", 0640) + "}\n");
  ASSERT_FALSE(short_one.ok());
  EXPECT_NE(short_one.status().message().find("holds 5 bytes; a credential needs at least 16"),
            std::string::npos)
      << short_one.status().message();

  auto missing = Rules("namespaces:\n  a: {credential_file: " + dir_.Join("nope") + "}\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
}

TEST_F(AccessControlTest, UsersAndGroupsResolveByNameOrNumberAndUnknownOnesAreErrors) {
  auto rules = Rules("namespaces:\n  a: {unix_users: [root, 12345], unix_groups: 0}\n");
  ASSERT_OK(rules);
  EXPECT_EQ(rules->namespaces.at("a")->uids, (std::vector<uint32_t>{0, 12345}));
  EXPECT_EQ(rules->namespaces.at("a")->gids, (std::vector<uint32_t>{0}));

  auto bad = Rules(
      "namespaces:\n  a: {unix_users: [no-such-user-kvpool]}\n"
      "  b: {unix_groups: [no-such-group-kvpool]}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "ns.yaml:2: namespace 'a': unix_users: no user 'no-such-user-kvpool' on this "
            "machine\nns.yaml:3: namespace 'b': unix_groups: no group 'no-such-group-kvpool' on "
            "this machine");
}

TEST_F(AccessControlTest, WithoutRulesEveryLocalHelloIsAdmittedWithAdminRights) {
  AccessControl access("");
  const HelloVerdict v = access.Admit(Local("anything", &stranger_));
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_TRUE(v.admin);
  EXPECT_FALSE(AccessRules().guarded());
}

TEST_F(AccessControlTest, ANamespaceWithASecretNeedsItsProof) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);

  HelloClaim c = Local("tenant-a", &stranger_);
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kProve);  // no challenge issued yet
  c.challenge = challenge_;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kProve);  // challenged, no proof yet

  const std::string right = HelloProof(kTenantSecret, challenge_, "tenant-a");
  c.proof = right;
  HelloVerdict v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_FALSE(v.admin);  // the admin has a credential of its own

  const std::string wrong = HelloProof("some-other-secret-0123", challenge_, "tenant-a");
  c.proof = wrong;
  v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kRefused);
  EXPECT_EQ(v.reason, "wrong credential for namespace 'tenant-a'");

  // A proof is bound to the namespace it was made for and to the challenge.
  const std::string for_b = HelloProof(kTenantSecret, challenge_, "tenant-b");
  c.proof = for_b;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);
  const std::string old = HelloProof(kTenantSecret, NewHelloChallenge(), "tenant-a");
  c.proof = old;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);

  // The same over TCP: the namespace's credential is enough (a remote worker's).
  HelloClaim tcp;
  tcp.namespace_name = "tenant-a";
  tcp.challenge = challenge_;
  tcp.proof = right;
  EXPECT_EQ(access.Admit(tcp).outcome, Outcome::kAdmitted);
}

TEST_F(AccessControlTest, UnixUsersAndGroupsAreAdmittedWithoutAProofOnTheUnixSocketOnly) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);

  EXPECT_EQ(access.Admit(Local("tenant-b", &me_)).outcome, Outcome::kAdmitted);
  EXPECT_EQ(access.Admit(Local("tenant-c", &me_)).outcome, Outcome::kAdmitted);
  // Someone else: a proof could only be the admin's (tenant-b has no secret).
  EXPECT_EQ(access.Admit(Local("tenant-b", &stranger_)).outcome, Outcome::kProve);
  // The binding means nothing over TCP, or without the kernel's word on the peer.
  HelloClaim tcp = Local("tenant-b", &me_);
  tcp.local = false;
  EXPECT_NE(access.Admit(tcp).outcome, Outcome::kAdmitted);
  EXPECT_NE(access.Admit(Local("tenant-b", nullptr)).outcome, Outcome::kAdmitted);
  // tenant-b's user is not tenant-a's.
  EXPECT_NE(access.Admit(Local("tenant-a", &me_)).outcome, Outcome::kAdmitted);
}

TEST_F(AccessControlTest, DeclaredAccessRefusesUndeclaredNamespacesExceptToTheAdmin) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);

  HelloClaim c = Local("tenant-z", &me_);
  HelloVerdict v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kProve);  // only the admin's secret could open it
  EXPECT_NE(v.detail.find("namespace 'tenant-z' is not declared on this daemon (ns.yaml)"),
            std::string::npos)
      << v.detail;
  c.challenge = challenge_;
  const std::string tenant_proof = HelloProof(kTenantSecret, challenge_, "tenant-z");
  c.proof = tenant_proof;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);

  const std::string admin_proof = HelloProof(kAdminSecret, challenge_, "tenant-z");
  c.proof = admin_proof;
  c.admin = true;
  v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_TRUE(v.admin);
}

TEST_F(AccessControlTest, AdminRightsNeedTheAdminCredential) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);

  // tenant-b's user may act for tenant-b, not as the admin.
  HelloClaim c = Local("tenant-b", &me_);
  c.admin = true;
  HelloVerdict v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kProve);
  EXPECT_NE(v.reason.find("admin requests need the admin credential"), std::string::npos);
  c.challenge = challenge_;
  const std::string tenant_proof = HelloProof(kTenantSecret, challenge_, "tenant-b");
  c.proof = tenant_proof;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);

  // An admin bound to this user: admitted with admin rights, in any namespace.
  auto bound = Rules("access: declared\nadmin: {unix_users: [" + std::to_string(getuid()) +
                     "]}\nnamespaces:\n  t: {unix_users: [4000000002]}\n");
  ASSERT_OK(bound);
  access.Replace(*bound);
  v = access.Admit(Local("t", &me_));
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_TRUE(v.admin);
  // No secret anywhere: nothing to challenge for, so a stranger is refused at once.
  v = access.Admit(Local("t", &stranger_));
  EXPECT_EQ(v.outcome, Outcome::kRefused);
  EXPECT_NE(v.detail.find("namespace 't' needs its credential"), std::string::npos) << v.detail;
}

TEST_F(AccessControlTest, AGuardedNamespaceAndAnUndeclaredOneAnswerAStrangerAlike) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);
  // Trying names must not list the declared tenants: the same outcome and words for a
  // namespace guarded by a credential and one not declared, before and after a wrong proof.
  auto answer = [&](const std::string& ns, const std::string& proof) {
    HelloClaim c = Local(ns, &stranger_);
    c.challenge = challenge_;
    c.proof = proof;
    HelloVerdict v = access.Admit(c);
    std::string reason = v.reason;
    const size_t at = reason.find(ns);
    if (at != std::string::npos) reason.replace(at, ns.size(), "NS");
    return std::make_pair(v.outcome, reason);
  };
  EXPECT_EQ(answer("tenant-a", ""), answer("tenant-zz", ""));
  EXPECT_EQ(answer("tenant-a", "").first, Outcome::kProve);
  const std::string wrong = HelloProof(std::string(32, 'w'), challenge_, "tenant-a");
  const std::string wrong_z = HelloProof(std::string(32, 'w'), challenge_, "tenant-zz");
  EXPECT_EQ(answer("tenant-a", wrong), answer("tenant-zz", wrong_z));
  EXPECT_EQ(answer("tenant-a", wrong).first, Outcome::kRefused);
  // The log still tells them apart.
  EXPECT_NE(access.Admit(Local("tenant-a", &stranger_)).detail.find("needs its credential"),
            std::string::npos);
  EXPECT_NE(access.Admit(Local("tenant-zz", &stranger_)).detail.find("not declared"),
            std::string::npos);
}

TEST_F(AccessControlTest,
       InClusterModeTcpNeedsTheClusterSecretForOpenNamespacesAndPeersMayActForAny) {
  AccessControl access(kClusterSecret);
  auto rules =
      Rules("namespaces:\n  tenant-a: {credential_file: " + SecretFile("a", kTenantSecret) + "}\n");
  ASSERT_OK(rules);
  access.Replace(*rules);

  HelloClaim tcp;
  tcp.namespace_name = "open-ns";
  EXPECT_EQ(access.Admit(tcp).outcome, Outcome::kProve);
  tcp.challenge = challenge_;
  const std::string peer_proof = HelloProof(kClusterSecret, challenge_, "open-ns");
  tcp.proof = peer_proof;
  HelloVerdict v = access.Admit(tcp);
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_TRUE(v.peer);
  EXPECT_TRUE(v.admin);  // no admin section: peer daemons have admin rights

  // A peer replicates into a namespace with a credential of its own.
  tcp.namespace_name = "tenant-a";
  const std::string peer_a = HelloProof(kClusterSecret, challenge_, "tenant-a");
  tcp.proof = peer_a;
  EXPECT_EQ(access.Admit(tcp).outcome, Outcome::kAdmitted);
  // A tenant's credential opens its own namespace only.
  const std::string tenant_open = HelloProof(kTenantSecret, challenge_, "open-ns");
  tcp.namespace_name = "open-ns";
  tcp.proof = tenant_open;
  EXPECT_EQ(access.Admit(tcp).outcome, Outcome::kRefused);

  // Local clients of open namespaces need nothing, as before.
  EXPECT_EQ(access.Admit(Local("open-ns", &stranger_)).outcome, Outcome::kAdmitted);
}

TEST_F(AccessControlTest, AClientHoldingASecretIsAdmittedOnlyThroughAProofTheDaemonAnswers) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);
  const std::string client_challenge = NewHelloChallenge();

  // tenant-b admits this user without a proof, but a client that holds a secret (it sent a
  // challenge of its own) must prove it, and the daemon answers under the same secret.
  HelloClaim c = Local("tenant-b", &me_);
  c.client_challenge = client_challenge;
  HelloVerdict v = access.Admit(c);
  EXPECT_EQ(v.outcome, Outcome::kProve);
  c.challenge = challenge_;
  const std::string admin_proof = HelloProof(kAdminSecret, challenge_, "tenant-b");
  c.proof = admin_proof;
  v = access.Admit(c);
  ASSERT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_TRUE(VerifyHelloServerProof(kAdminSecret, client_challenge, "tenant-b", v.server_proof));
  EXPECT_FALSE(VerifyHelloServerProof(kTenantSecret, client_challenge, "tenant-b", v.server_proof));

  // A proof of a secret the daemon does not hold admits nothing, even where no proof was needed.
  const std::string stray = HelloProof("a-secret-nobody-configured-01", challenge_, "tenant-b");
  c.proof = stray;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);

  // A daemon without any secret cannot answer: refused at once, saying why.
  AccessControl open("");
  HelloClaim o = Local("anything", &me_);
  o.client_challenge = client_challenge;
  v = open.Admit(o);
  EXPECT_EQ(v.outcome, Outcome::kRefused);
  EXPECT_NE(v.reason.find("this daemon has none that could admit it"), std::string::npos)
      << v.reason;
}

TEST_F(AccessControlTest, ChallengesOfAnotherLengthProveNothing) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);
  HelloClaim c = Local("tenant-a", &stranger_);
  const std::string longer = challenge_ + "-server";
  c.challenge = longer;
  const std::string proof = HelloProof(kTenantSecret, longer, "tenant-a");
  c.proof = proof;
  EXPECT_EQ(access.Admit(c).outcome, Outcome::kRefused);
}

TEST_F(AccessControlTest, WithoutAnAdminSectionATenantIsNoAdminWhereNamespacesAreGuarded) {
  // kvpoold runs as uid 4242 here; tenant-b is uid 4243's (neither is root).
  const uint32_t daemon_uid = 4242;
  const transport::PeerCredentials tenant_b{1, 4243, 4243, {}};
  AccessControl access("", daemon_uid);
  auto rules =
      Rules("namespaces:\n  tenant-a: {credential_file: " + SecretFile("a", kTenantSecret) +
            "}\n  tenant-b: {unix_users: [" + std::to_string(tenant_b.uid) + "]}\n");
  ASSERT_OK(rules);
  access.Replace(*rules);

  // A tenant proving its own namespace's secret over TCP, or bound to it by its Unix user.
  HelloClaim tcp;
  tcp.namespace_name = "tenant-a";
  tcp.challenge = challenge_;
  const std::string proof = HelloProof(kTenantSecret, challenge_, "tenant-a");
  tcp.proof = proof;
  HelloVerdict v = access.Admit(tcp);
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_FALSE(v.admin);
  tcp.admin = true;
  EXPECT_EQ(access.Admit(tcp).outcome, Outcome::kRefused);
  v = access.Admit(Local("tenant-b", &tenant_b));
  EXPECT_EQ(v.outcome, Outcome::kAdmitted);
  EXPECT_FALSE(v.admin);
  // kvpoold's own user and root on the Unix socket are the operator.
  const transport::PeerCredentials daemon_user{1, daemon_uid, getgid(), {}};
  const transport::PeerCredentials root{1, 0, 0, {}};
  EXPECT_TRUE(access.Admit(Local("open-ns", &daemon_user)).admin);
  EXPECT_TRUE(access.Admit(Local("open-ns", &root)).admin);
  EXPECT_NE(access.Describe().find("only from root and uid " + std::to_string(daemon_uid)),
            std::string::npos)
      << access.Describe();

  // Nothing guarded: every local process may do everything anyway.
  access.Replace(AccessRules());
  EXPECT_TRUE(access.Admit(Local("tenant-b", &tenant_b)).admin);
}

TEST_F(AccessControlTest, ReplaceSwapsTheRulesAtOnce) {
  AccessControl access("");
  auto rules = Rules(DeclaredYaml());
  ASSERT_OK(rules);
  access.Replace(*rules);
  EXPECT_NE(access.Admit(Local("tenant-z", &me_)).outcome, Outcome::kAdmitted);
  EXPECT_EQ(access.Describe(),
            "declared namespaces only, 3 with a credential, admin requests need the admin "
            "credential");
  access.Replace(AccessRules());
  EXPECT_EQ(access.Admit(Local("tenant-z", &me_)).outcome, Outcome::kAdmitted);
}

}  // namespace
}  // namespace kvpool::daemon
