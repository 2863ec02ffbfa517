// Request signing: HMAC-SHA256 test vectors, sign/verify, every rejection,
// and token files.
#include "remote/auth.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {
namespace {

using ::testing::HasSubstr;

TEST(HmacTest, Rfc4231Vectors) {
  // Test case 2.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: key 20 x 0x0b, "Hi There".
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 6: a key longer than the block size.
  EXPECT_EQ(HmacSha256Hex(std::string(131, '\xaa'),
                          "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Empty key and message are fine.
  EXPECT_EQ(HmacSha256Hex("", "").size(), 64u);
}

TEST(NonceTest, RandomAndHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string n = RandomNonce();
    ASSERT_EQ(n.size(), 32u);
    EXPECT_EQ(n.find_first_not_of("0123456789abcdef"), std::string::npos);
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SignTest, HeaderShape) {
  const std::string h = SignRequest("tok", "GET", "/manifest?rank=0", 1700000000, "abcd");
  EXPECT_EQ(h, "v1:1700000000:abcd:" +
                   HmacSha256Hex("tok", "v1\nGET\n/manifest?rank=0\n1700000000\nabcd"));
}

TEST(VerifyTest, AcceptsSignedRequest) {
  RequestVerifier v("secret");
  const int64_t now = 1700000000;
  EXPECT_TRUE(v.Verify(SignRequest("secret", "GET", "/manifest", now, RandomNonce()), "GET",
                       "/manifest", now)
                  .ok());
  // Within the skew, either side.
  EXPECT_TRUE(
      v.Verify(SignRequest("secret", "GET", "/m", now - 60, RandomNonce()), "GET", "/m", now).ok());
  EXPECT_TRUE(
      v.Verify(SignRequest("secret", "GET", "/m", now + 60, RandomNonce()), "GET", "/m", now).ok());
}

void ExpectDenied(const Status& s, const std::string& why) {
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(why));
}

TEST(VerifyTest, RejectsWrongTokenOrAlteredRequest) {
  RequestVerifier v("secret");
  const int64_t now = 1700000000;
  ExpectDenied(v.Verify(SignRequest("Secret", "GET", "/m", now, "n1"), "GET", "/m", now),
               "bad MAC");
  ExpectDenied(v.Verify(SignRequest("secret", "GET", "/m", now, "n2"), "POST", "/m", now),
               "bad MAC");
  ExpectDenied(
      v.Verify(SignRequest("secret", "GET", "/m?rank=0", now, "n3"), "GET", "/m?rank=1", now),
      "bad MAC");
  // A valid MAC moved to another timestamp.
  std::string h = SignRequest("secret", "GET", "/m", now, "n4");
  h.replace(3, 10, std::to_string(now + 1));
  ExpectDenied(v.Verify(h, "GET", "/m", now), "bad MAC");
  // One flipped MAC digit.
  h = SignRequest("secret", "GET", "/m", now, "n5");
  h.back() = h.back() == '0' ? '1' : '0';
  ExpectDenied(v.Verify(h, "GET", "/m", now), "bad MAC");
  // The rejected nonces were not remembered: the right request still works.
  EXPECT_OK(v.Verify(SignRequest("secret", "GET", "/m", now, "n5"), "GET", "/m", now));
}

TEST(VerifyTest, RejectsStale) {
  RequestVerifier v("secret", 30);
  const int64_t now = 1700000000;
  ExpectDenied(v.Verify(SignRequest("secret", "GET", "/m", now - 31, "a"), "GET", "/m", now),
               "stale");
  ExpectDenied(v.Verify(SignRequest("secret", "GET", "/m", now + 31, "b"), "GET", "/m", now),
               "stale");
  ExpectDenied(v.Verify(SignRequest("secret", "GET", "/m", 0, "c"), "GET", "/m", now), "stale");
}

TEST(VerifyTest, RejectsReplay) {
  RequestVerifier v("secret", 60);
  const int64_t now = 1700000000;
  const std::string h = SignRequest("secret", "GET", "/m", now, "once");
  EXPECT_OK(v.Verify(h, "GET", "/m", now));
  ExpectDenied(v.Verify(h, "GET", "/m", now), "replayed");
  ExpectDenied(v.Verify(h, "GET", "/m", now + 60), "replayed");
  ExpectDenied(v.Verify(h, "GET", "/m", now + 61), "stale");
  // The same nonce from a fresh request after the window: not a replay.
  EXPECT_TRUE(
      v.Verify(SignRequest("secret", "GET", "/m", now + 200, "once"), "GET", "/m", now + 200).ok());
}

TEST(VerifyTest, PrunesOldNonces) {
  RequestVerifier v("secret", 10);
  int64_t now = 1700000000;
  // Many requests over a long time; old nonces are pruned, new ones still
  // refuse replays.
  std::string last;
  for (int i = 0; i < 3000; ++i) {
    now += i % 10 == 0 ? 1 : 0;
    last = SignRequest("secret", "GET", "/m", now, "n" + std::to_string(i));
    ASSERT_OK(v.Verify(last, "GET", "/m", now)) << i;
  }
  ExpectDenied(v.Verify(last, "GET", "/m", now), "replayed");
}

TEST(VerifyTest, RejectsMalformed) {
  RequestVerifier v("secret");
  const int64_t now = 1700000000;
  const std::string mac = HmacSha256Hex("secret", "x");
  ExpectDenied(v.Verify("", "GET", "/m", now), "missing");
  ExpectDenied(v.Verify("garbage", "GET", "/m", now), "malformed");
  ExpectDenied(v.Verify("v2:1700000000:n:" + mac, "GET", "/m", now), "version");
  ExpectDenied(v.Verify("v1::n:" + mac, "GET", "/m", now), "timestamp");
  ExpectDenied(v.Verify("v1:-5:n:" + mac, "GET", "/m", now), "timestamp");
  ExpectDenied(v.Verify("v1:17000000x0:n:" + mac, "GET", "/m", now), "timestamp");
  ExpectDenied(v.Verify("v1:99999999999999999999999:n:" + mac, "GET", "/m", now), "timestamp");
  ExpectDenied(v.Verify("v1:1700000000::" + mac, "GET", "/m", now), "nonce");
  ExpectDenied(v.Verify("v1:1700000000:a\nb:" + mac, "GET", "/m", now), "nonce");
  ExpectDenied(v.Verify("v1:1700000000:" + std::string(200, 'a') + ":" + mac, "GET", "/m", now),
               "nonce");
  ExpectDenied(v.Verify("v1:1700000000:n:" + mac.substr(1), "GET", "/m", now), "MAC must be 64");
  ExpectDenied(v.Verify("v1:1700000000:n:" + mac + ":", "GET", "/m", now), "MAC must be 64");
  std::string upper = mac;
  for (char& c : upper) c = static_cast<char>(toupper(c));
  ExpectDenied(v.Verify("v1:1700000000:n:" + upper, "GET", "/m", now), "MAC must be 64");
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch_.path(); }
  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
    close(fd);
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  test::ScratchDir scratch_{"tl_auth_test"};
  std::string dir_;
};

TEST_F(TokenFileTest, ReadsTrimmed) {
  auto t = ReadTokenFile(Write("tok", "  s3cret token\n\n", 0600));
  ASSERT_OK(t);
  EXPECT_EQ(*t, "s3cret token");
  auto r = ReadTokenFile(Write("ro", "abc", 0400));
  ASSERT_OK(r);
  EXPECT_EQ(*r, "abc");
}

TEST_F(TokenFileTest, RejectsLooseModes) {
  for (mode_t mode : {0640, 0604, 0644, 0620, 0666}) {
    const std::string path = Write("loose" + std::to_string(mode), "abc", mode);
    auto t = ReadTokenFile(path);
    ASSERT_FALSE(t.ok()) << std::oct << mode;
    EXPECT_EQ(t.status().code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(t.status().message(), HasSubstr("chmod 600"));
    EXPECT_THAT(t.status().message(), HasSubstr(path));
  }
}

TEST_F(TokenFileTest, RejectsMissingEmptyAndLarge) {
  auto missing = ReadTokenFile(dir_ + "/nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto empty = ReadTokenFile(Write("empty", " \n\t", 0600));
  EXPECT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));
  auto large = ReadTokenFile(Write("large", std::string(4097, 'x'), 0600));
  EXPECT_FALSE(large.ok());
  EXPECT_THAT(large.status().message(), HasSubstr("4097"));
  auto max = ReadTokenFile(Write("max", std::string(4096, 'x'), 0600));
  EXPECT_OK(max);
  auto dir = ReadTokenFile(dir_);
  EXPECT_FALSE(dir.ok());
}

}  // namespace
}  // namespace tensorlift::remote
