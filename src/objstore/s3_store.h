// The S3 client a load uses, built from the public ObjectStoreOptions: for
// other sources that read buckets (the striper, sources/striped_load.cc).
#ifndef TENSORLIFT_OBJSTORE_S3_STORE_H_
#define TENSORLIFT_OBJSTORE_S3_STORE_H_

#include <memory>

#include "objstore/s3_client.h"
#include "tensorlift/objstore.h"
#include "tensorlift/status.h"

namespace tensorlift::objstore {

// The client for `url` with `store`'s settings (checked: InvalidArgument
// naming the bad one) over the environment's, and its transfer settings
// (connections bounded by max_in_flight_bytes / request_bytes, retries).
Result<std::unique_ptr<S3Client>> ClientForStore(const ObjectUrl& url,
                                                 const ObjectStoreOptions& store);

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_S3_STORE_H_
