// S3's answers parsed on their own (objstore/s3_answers.h), without a server;
// tests/fuzz/s3_answers_fuzz.cc runs the same parsers on generated input, and
// its findings are replayed here from tests/fuzz/seeds-s3/.
#include "objstore/s3_answers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "../common/assert_ok.h"

namespace tensorlift::objstore {
namespace {

using ::testing::HasSubstr;

std::string ReadSeed(const std::string& name) {
  std::ifstream in(std::string(TENSORLIFT_SOURCE_DIR) + "/tests/fuzz/seeds-s3/" + name,
                   std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::string s(std::istreambuf_iterator<char>(in), {});
  return s.empty() ? s : s.substr(1);  // The first byte picks the fuzz target's parser.
}

TEST(S3AnswersTest, AListingPageWithUrlEncodedKeys) {
  auto page = ParseListPage(ReadSeed("list.bin"));
  ASSERT_OK(page);
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "llama/model-00001-of-00002.safetensors");
  EXPECT_EQ(page->objects[0].size, 4987654321u);
  EXPECT_EQ(page->objects[0].etag, "9b2cf535f27731c974343645a3985328");
  EXPECT_EQ(page->objects[1].key, "llama/a b+c\xE2\x9C\x93.json");
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "1ueGcxLPRx1Tr");
  auto plain = ParseListPage(ReadSeed("list-plain.bin"));
  ASSERT_OK(plain);
  EXPECT_EQ(plain->objects[1].key, "llama/a+b%2Bc%E2%9C%93.json");  // Not encoded: as given.
  EXPECT_FALSE(plain->truncated);
}

TEST(S3AnswersTest, BadListingsAreErrors) {
  EXPECT_THAT(ParseListPage("<Error/>").status().message(),
              HasSubstr("is not a ListBucketResult document"));
  EXPECT_THAT(
      ParseListPage("<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>")
          .status()
          .message(),
      HasSubstr("without a Key or a valid Size"));
  EXPECT_THAT(ParseListPage("<ListBucketResult><EncodingType>url</EncodingType><Contents><Key>%4"
                            "</Key><Size>1</Size></Contents></ListBucketResult>")
                  .status()
                  .message(),
              HasSubstr("badly URL-encoded key"));
  EXPECT_THAT(ParseListPage("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")
                  .status()
                  .message(),
              HasSubstr("without a new NextContinuationToken"));
  EXPECT_EQ(ParseListPage("<ListBucketResult/>", kMaxListedObjects).status().code(),
            StatusCode::kOk);
  EXPECT_EQ(ParseListPage("<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents>"
                          "</ListBucketResult>",
                          kMaxListedObjects)
                .status()
                .code(),
            StatusCode::kResourceExhausted);
}

TEST(S3AnswersTest, ErrorBodies) {
  std::string code, message;
  ParseS3Error(ReadSeed("error.bin"), &code, &message);
  EXPECT_EQ(code, "SignatureDoesNotMatch");
  EXPECT_THAT(message, HasSubstr("does not match the signature"));
  ParseS3Error("not xml", &code, &message);
  EXPECT_EQ(code, "");
  EXPECT_EQ(message, "");
}

// Fuzz finding (2026-11-27): an <Error> body that declares entities made its
// Code and Message grow by expansion (xmlNodeGetContent expands references):
// with libxml2 2.9.14, 977 bytes gave a 1 MB code and a 64 KiB body 60 MB.
// S3 never sends a document type declaration; one is now refused.
TEST(S3AnswersTest, FuzzFindingEntitiesInAnErrorBodyAreRefused) {
  std::string code = "x", message = "x";
  const std::string body = ReadSeed("error-entity.bin");
  ASSERT_THAT(body, HasSubstr("<!ENTITY"));
  ParseS3Error(body, &code, &message);
  EXPECT_EQ(code, "");
  EXPECT_EQ(message, "");
  EXPECT_FALSE(ParseListPage("<!DOCTYPE ListBucketResult []><ListBucketResult/>").ok());
}

TEST(S3AnswersTest, ContentRange) {
  ContentRange cr;
  ASSERT_TRUE(ParseContentRange("bytes 0-1023/4096", &cr));
  EXPECT_TRUE(cr.has_range && cr.has_total);
  EXPECT_EQ(cr.first, 0u);
  EXPECT_EQ(cr.last, 1023u);
  EXPECT_EQ(cr.total, 4096u);
  ASSERT_TRUE(ParseContentRange("bytes */4096", &cr));
  EXPECT_FALSE(cr.has_range);
  ASSERT_TRUE(ParseContentRange("bytes 100-199/*", &cr));
  EXPECT_FALSE(cr.has_total);
  for (const char* bad : {"bytes 5-4/10", "bytes */*", "bytes 1-2", "items 1-2/3", "bytes -1-2/3",
                          "bytes 1-99999999999999999999999/3"}) {
    EXPECT_FALSE(ParseContentRange(bad, &cr)) << bad;
  }
}

TEST(S3AnswersTest, KeysAndText) {
  std::string key;
  EXPECT_TRUE(UrlDecodeKey("a+b%2Bc", &key));
  EXPECT_EQ(key, "a b+c");
  EXPECT_FALSE(UrlDecodeKey("a%2", &key));
  EXPECT_FALSE(UrlDecodeKey("a%zz", &key));
  EXPECT_EQ(Printable("a\nb\x01" + std::string(400, 'c')).substr(0, 4), "a?b?");
  EXPECT_EQ(Printable(std::string(400, 'c')).size(), 303u);
  EXPECT_EQ(StripQuotes("\"abc\""), "abc");
}

}  // namespace
}  // namespace tensorlift::objstore
