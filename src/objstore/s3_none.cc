// The S3 client when tensorlift is built without libcurl: Create says why.
#include "objstore/s3_client.h"

namespace tensorlift::objstore {

Result<std::unique_ptr<S3Client>> S3Client::Create(const S3Settings& settings) {
  (void)settings;
  return UnimplementedError(
      "tensorlift was built without the S3 client: " TENSORLIFT_NO_CURL_REASON);
}

Result<std::string> S3ClientVersion() {
  return UnimplementedError("built without the S3 client: " TENSORLIFT_NO_CURL_REASON);
}

}  // namespace tensorlift::objstore
