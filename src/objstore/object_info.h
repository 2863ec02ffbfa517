// An object as a listing names it: what the S3 client (s3_client.h) returns
// and the listing parser (s3_answers.h) fills in, below both.
#ifndef TENSORLIFT_OBJSTORE_OBJECT_INFO_H_
#define TENSORLIFT_OBJSTORE_OBJECT_INFO_H_

#include <cstdint>
#include <string>

namespace tensorlift::objstore {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_OBJECT_INFO_H_
