// The check of PeerKey::content against what a peer load received.
// Private to remote/.
#ifndef TENSORLIFT_REMOTE_PEER_CONTENT_H_
#define TENSORLIFT_REMOTE_PEER_CONTENT_H_

#include <string>

#include "remote/manifest.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// PeerKey::content: the identity of the tensors `loaded` holds, recomputed
// from their bytes (on up to 4 threads; device tensors through a host copy),
// against `want`. `manifest` (a single whole-tensor source's; may be null)
// names the tensor whose bytes differ from what the source published.
// kCorruption naming `who`, the tensor or the roots on a mismatch.
Status CheckContent(const LoadedCheckpoint& loaded, const std::string& want,
                    const Manifest* manifest, const std::string& who);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_CONTENT_H_
