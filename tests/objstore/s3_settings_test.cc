// Object URLs and S3 settings: parsing, the AWS_* variables, the shared
// credentials and config files, profiles and addressing. No network.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "objstore/s3_client.h"

namespace tensorlift::objstore {
namespace {

using ::testing::HasSubstr;

TEST(ObjectUrlTest, Recognizes) {
  EXPECT_TRUE(IsObjectUrl("s3://bucket/key"));
  EXPECT_TRUE(IsObjectUrl("gs://bucket"));
  EXPECT_FALSE(IsObjectUrl("/tmp/s3://x"));
  EXPECT_FALSE(IsObjectUrl("http://bucket/key"));
  EXPECT_FALSE(IsObjectUrl("S3://bucket/key"));
}

TEST(ObjectUrlTest, ParsesValid) {
  auto u = ParseObjectUrl("s3://my-bucket.v2/models/llama/model.safetensors");
  ASSERT_OK(u);
  EXPECT_EQ(u->scheme, "s3");
  EXPECT_EQ(u->bucket, "my-bucket.v2");
  EXPECT_EQ(u->key, "models/llama/model.safetensors");
  EXPECT_EQ(u->ToString(), "s3://my-bucket.v2/models/llama/model.safetensors");

  u = ParseObjectUrl("gs://bucket_1");
  ASSERT_OK(u);
  EXPECT_EQ(u->scheme, "gs");
  EXPECT_EQ(u->bucket, "bucket_1");
  EXPECT_EQ(u->key, "");

  u = ParseObjectUrl("s3://abc/");
  ASSERT_OK(u);
  EXPECT_EQ(u->key, "");
  u = ParseObjectUrl("s3://abc/dir/with space+plus/é");
  ASSERT_OK(u);
  EXPECT_EQ(u->key, "dir/with space+plus/é");
  // Legacy S3 buckets may have uppercase letters.
  EXPECT_OK(ParseObjectUrl("s3://OldBucket/x"));
}

TEST(ObjectUrlTest, RejectsBadUrls) {
  for (const char* url : {"s3://", "s3:///key", "s3://ab/key", "s3://-bucket/k", "s3://bucket-/k",
                          "s3://a..b/k", "s3://a.-b/k", "s3://192.168.1.2/k", "s3://buck et/k",
                          "s3://bücket/k", "file:///x", "s3:/bucket/key", "s3://bucket!/k"}) {
    auto u = ParseObjectUrl(url);
    ASSERT_FALSE(u.ok()) << url;
    EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(u.status().message(), HasSubstr(url)) << url;
  }
  EXPECT_FALSE(ParseObjectUrl("s3://" + std::string(64, 'a') + "/k").ok());
  EXPECT_TRUE(ParseObjectUrl("s3://" + std::string(63, 'a') + "/k").ok());
  EXPECT_FALSE(ParseObjectUrl("s3://bucket/" + std::string(1025, 'k')).ok());
  EXPECT_FALSE(ParseObjectUrl(std::string("s3://bucket/a\nb")).ok());
}

TEST(ObjectUrlTest, BucketNames) {
  EXPECT_TRUE(IsValidBucketName("abc"));
  EXPECT_TRUE(IsValidBucketName("a.b.c"));
  EXPECT_TRUE(IsValidBucketName("1.2.3"));
  EXPECT_FALSE(IsValidBucketName("1.2.3.4"));
  EXPECT_TRUE(IsDnsSafeBucketName("my-bucket-1"));
  EXPECT_FALSE(IsDnsSafeBucketName("my.bucket"));
  EXPECT_FALSE(IsDnsSafeBucketName("MyBucket"));
  EXPECT_FALSE(IsDnsSafeBucketName("my_bucket"));
}

// Saves the variables the resolver reads, clears them, and restores them.
class SettingsTest : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"AWS_ACCESS_KEY_ID",
                                          "AWS_SECRET_ACCESS_KEY",
                                          "AWS_SESSION_TOKEN",
                                          "AWS_REGION",
                                          "AWS_DEFAULT_REGION",
                                          "AWS_ENDPOINT_URL_S3",
                                          "AWS_ENDPOINT_URL",
                                          "AWS_PROFILE",
                                          "AWS_CA_BUNDLE",
                                          "AWS_CONFIG_FILE",
                                          "AWS_SHARED_CREDENTIALS_FILE",
                                          "HOME"};

  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_[v] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(v);
    }
    // No real ~/.aws: HOME is the scratch dir (with no .aws in it).
    setenv("HOME", dir_.path().c_str(), 1);
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  void Set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }
  // Points AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE at new files.
  void Credentials(const std::string& text) {
    Set("AWS_SHARED_CREDENTIALS_FILE", dir_.Write("credentials", text));
  }
  void Config(const std::string& text) { Set("AWS_CONFIG_FILE", dir_.Write("config", text)); }

  test::ScratchDir dir_{"s3_settings"};
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(SettingsTest, AnonymousWhenNothingIsSet) {
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_TRUE(s->anonymous);
  EXPECT_EQ(s->credential_source, "none (unsigned)");
  EXPECT_EQ(s->region, "us-east-1");
  EXPECT_EQ(s->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(s->path_style);  // AWS: virtual-hosted.
  EXPECT_TRUE(s->access_key.empty());
}

TEST_F(SettingsTest, FromEnvironment) {
  Set("AWS_ACCESS_KEY_ID", "AKID");
  Set("AWS_SECRET_ACCESS_KEY", "SECRET");
  Set("AWS_SESSION_TOKEN", "TOKEN");
  Set("AWS_DEFAULT_REGION", "eu-west-3");
  Set("AWS_CA_BUNDLE", "/etc/ca.pem");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_FALSE(s->anonymous);
  EXPECT_EQ(s->access_key, "AKID");
  EXPECT_EQ(s->secret_key, "SECRET");
  EXPECT_EQ(s->session_token, "TOKEN");
  EXPECT_EQ(s->credential_source, "environment");
  EXPECT_EQ(s->region, "eu-west-3");
  EXPECT_EQ(s->endpoint, "https://s3.eu-west-3.amazonaws.com");
  EXPECT_EQ(s->ca_bundle, "/etc/ca.pem");

  Set("AWS_REGION", "ap-south-1");  // Beats AWS_DEFAULT_REGION.
  s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->region, "ap-south-1");
}

TEST_F(SettingsTest, EndpointVariables) {
  Set("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(s->path_style);  // A custom endpoint: path-style.

  Set("AWS_ENDPOINT_URL_S3", "https://minio.example:9443");  // The S3 one first.
  s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->endpoint, "https://minio.example:9443");

  Set("AWS_ENDPOINT_URL_S3", "minio.example:9443");
  s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("AWS_ENDPOINT_URL_S3"));

  Set("AWS_ENDPOINT_URL_S3", "http://host/path");
  EXPECT_FALSE(ResolveS3Settings("s3", {}).ok());
}

TEST_F(SettingsTest, HalfAKeyPairIsAnError) {
  Set("AWS_ACCESS_KEY_ID", "AKID");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("AWS_SECRET_ACCESS_KEY"));

  S3Overrides o;
  o.secret_key = "x";
  EXPECT_FALSE(ResolveS3Settings("s3", o).ok());
}

TEST_F(SettingsTest, OverridesComeFirst) {
  Set("AWS_ACCESS_KEY_ID", "ENVKEY");
  Set("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
  Set("AWS_REGION", "eu-west-1");
  Set("AWS_ENDPOINT_URL", "http://env:1");
  S3Overrides o;
  o.access_key = "K";
  o.secret_key = "S";
  o.session_token = "T";
  o.region = "us-west-2";
  o.endpoint = "http://given:2";
  auto s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "K");
  EXPECT_EQ(s->session_token, "T");
  EXPECT_EQ(s->credential_source, "given");
  EXPECT_EQ(s->region, "us-west-2");
  EXPECT_EQ(s->endpoint, "http://given:2");

  S3Overrides anon;
  anon.anonymous = true;
  s = ResolveS3Settings("s3", anon);
  ASSERT_OK(s);
  EXPECT_TRUE(s->anonymous);
  EXPECT_EQ(s->credential_source, "none (unsigned)");
  EXPECT_TRUE(s->access_key.empty());
}

TEST_F(SettingsTest, DefaultProfileFromFiles) {
  Credentials(
      "# comment\n"
      "[default]\n"
      "aws_access_key_id = FILEKEY\n"
      "aws_secret_access_key=FILESECRET\n"
      "\n"
      "[other]\n"
      "aws_access_key_id = OTHERKEY\n"
      "aws_secret_access_key = OTHERSECRET\n"
      "aws_session_token = OTHERTOKEN\n");
  Config(
      "[default]\n"
      "region = eu-central-1\n"
      "; comment\n"
      "[profile other]\n"
      "region = us-west-1\n"
      "endpoint_url = http://localhost:9000\n");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "FILEKEY");
  EXPECT_EQ(s->secret_key, "FILESECRET");
  EXPECT_THAT(s->credential_source, HasSubstr("credentials [default]"));
  EXPECT_EQ(s->region, "eu-central-1");
  EXPECT_EQ(s->endpoint, "https://s3.eu-central-1.amazonaws.com");

  // The environment beats the files.
  Set("AWS_ACCESS_KEY_ID", "ENVKEY");
  Set("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
  s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "ENVKEY");
  EXPECT_EQ(s->credential_source, "environment");
}

TEST_F(SettingsTest, NamedProfile) {
  Credentials(
      "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
      "[other]\naws_access_key_id = OTHERKEY\naws_secret_access_key = OTHERSECRET\n"
      "aws_session_token = OTHERTOKEN\n");
  Config(
      "[profile other]\nregion = us-west-1\nendpoint_url = http://localhost:9000\n"
      "s3 =\n  addressing_style = virtual\n");
  Set("AWS_PROFILE", "other");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "OTHERKEY");
  EXPECT_EQ(s->session_token, "OTHERTOKEN");
  EXPECT_THAT(s->credential_source, HasSubstr("credentials [other]"));
  EXPECT_EQ(s->region, "us-west-1");
  EXPECT_EQ(s->endpoint, "http://localhost:9000");
  EXPECT_FALSE(s->path_style);  // The nested s3 addressing_style.

  // A profile given as an override beats AWS_PROFILE, and beats env keys.
  Set("AWS_ACCESS_KEY_ID", "ENVKEY");
  Set("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
  S3Overrides o;
  o.profile = "default";
  s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "D");
  // AWS_PROFILE does not beat the env keys.
  s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "ENVKEY");
}

TEST_F(SettingsTest, CredentialsInConfigFile) {
  Config("[profile cfg]\naws_access_key_id = CK\naws_secret_access_key = CS\n");
  S3Overrides o;
  o.profile = "cfg";
  auto s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "CK");
  EXPECT_THAT(s->credential_source, HasSubstr("config [profile cfg]"));
}

TEST_F(SettingsTest, MissingProfileNamesTheFiles) {
  Credentials("[default]\naws_access_key_id = D\naws_secret_access_key = DS\n");
  Set("AWS_PROFILE", "nope");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("'nope'"));
  EXPECT_THAT(s.status().message(), HasSubstr(dir_.File("credentials")));
  EXPECT_THAT(s.status().message(), HasSubstr("~/.aws/config"));
}

TEST_F(SettingsTest, DefaultFilesUnderHome) {
  ASSERT_EQ(mkdir(dir_.File(".aws").c_str(), 0700), 0);
  dir_.Write(".aws/credentials", "[default]\naws_access_key_id = HK\naws_secret_access_key = HS\n");
  dir_.Write(".aws/config", "[default]\nregion = sa-east-1\n");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->access_key, "HK");
  EXPECT_EQ(s->credential_source, "~/.aws/credentials [default]");
  EXPECT_EQ(s->region, "sa-east-1");
}

TEST_F(SettingsTest, BadFiles) {
  Credentials("[default\naws_access_key_id = x\n");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(dir_.File("credentials")));
  EXPECT_THAT(s.status().message(), HasSubstr("line 1"));

  Credentials("aws_access_key_id = x\n");
  EXPECT_FALSE(ResolveS3Settings("s3", {}).ok());

  Credentials("[default]\n" + std::string(5000, 'a') + " = b\n");
  EXPECT_FALSE(ResolveS3Settings("s3", {}).ok());

  Credentials("[default]\naws_access_key_id = only-half\n");
  s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("aws_secret_access_key"));

  Credentials(std::string(2 << 20, '#'));
  s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("limit"));
}

TEST_F(SettingsTest, UnsupportedCredentialKinds) {
  Config("[default]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = base\n");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.status().message(), HasSubstr("role_arn"));
}

TEST_F(SettingsTest, Gcs) {
  Set("AWS_ACCESS_KEY_ID", "GOOG1HMAC");
  Set("AWS_SECRET_ACCESS_KEY", "hmac-secret");
  Set("AWS_REGION", "eu-west-1");             // AWS's: not used for gs.
  Set("AWS_ENDPOINT_URL", "http://minio:1");  // Likewise.
  auto s = ResolveS3Settings("gs", {});
  ASSERT_OK(s);
  EXPECT_EQ(s->endpoint, "https://storage.googleapis.com");
  EXPECT_EQ(s->region, "auto");
  EXPECT_TRUE(s->path_style);
  EXPECT_EQ(s->access_key, "GOOG1HMAC");

  S3Overrides o;
  o.endpoint = "http://fake-gcs:4443";
  o.region = "us";
  s = ResolveS3Settings("gs", o);
  ASSERT_OK(s);
  EXPECT_EQ(s->endpoint, "http://fake-gcs:4443");
  EXPECT_EQ(s->region, "us");

  EXPECT_FALSE(ResolveS3Settings("az", {}).ok());
}

TEST_F(SettingsTest, Addressing) {
  S3Overrides o;
  o.addressing = "path";
  auto s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_TRUE(s->path_style);

  o.addressing = "virtual";
  o.endpoint = "http://127.0.0.1:9000";
  s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_FALSE(s->path_style);

  o.addressing = "auto";
  o.endpoint = "https://s3.eu-west-1.amazonaws.com";
  s = ResolveS3Settings("s3", o);
  ASSERT_OK(s);
  EXPECT_FALSE(s->path_style);

  o.addressing = "sideways";
  s = ResolveS3Settings("s3", o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("sideways"));
}

TEST_F(SettingsTest, BadRegion) {
  Set("AWS_REGION", "us-east-1.evil.com/");
  auto s = ResolveS3Settings("s3", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("AWS_REGION"));
}

}  // namespace
}  // namespace tensorlift::objstore
