// PeerKey::content checked on the bytes received (see peer_content.h).
#include "remote/peer_content.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorlift/content.h"

namespace tensorlift::remote {

Status CheckContent(const LoadedCheckpoint& loaded, const std::string& want,
                    const Manifest* manifest, const std::string& who) {
  const std::vector<LoadedTensor>& tensors = loaded.tensors();
  std::vector<TensorContent> got(tensors.size());
  if (const ContentIdentity* c = loaded.content(); c != nullptr) {
    got = c->tensors;  // The load hashed them as they landed.
  } else {
    std::atomic<size_t> next{0};
    std::mutex mu;
    Status failed = Status::Ok();
    auto work = [&] {
      std::vector<std::byte> host;
      for (size_t i; (i = next.fetch_add(1)) < tensors.size();) {
        const LoadedTensor& t = tensors[i];
        const void* data = t.data;
        if (t.device != DeviceType::kCpu && t.nbytes > 0) {
          host.resize(t.nbytes);
          Status st = loaded.CopyToHost(t.name, host.data());
          if (!st.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            failed = st;
            return;
          }
          data = host.data();
        }
        got[i] = {t.name, t.dtype, t.shape, t.nbytes, TensorContentHash(data, t.nbytes)};
      }
    };
    const unsigned threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    TL_RETURN_IF_ERROR(failed);
  }
  if (manifest != nullptr) {
    for (const TensorContent& t : got) {
      const ManifestTensor* m = manifest->Find(t.name);
      if (m && m->xxh128 && *m->xxh128 != t.hash) {
        return CorruptionError(who + ": tensor '" + t.name + "': the bytes received hash to " +
                               t.hash.Hex() + ", the seed published " + m->xxh128->Hex() +
                               " (content " + want + " asked for)");
      }
    }
  }
  const std::string root = ContentRoot(got).Hex();
  if (root != want) {
    return CorruptionError(who + ": the bytes received have content root " + root + ", expected " +
                           want);
  }
  return Status::Ok();
}

}  // namespace tensorlift::remote
