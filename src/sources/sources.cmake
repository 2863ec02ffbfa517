# sources: loads that use several sources at once (include/tensorlift/striped.h).
#   striped_load.cc     LoadStriped: the sources that can join, then the one loader over
#                       a striped store
#   striped_store.cc    the store: every read cut into pieces the sources' workers share
#                       (work stealing), each chunk checked where it lands
#   striped_plan.cc     the checkpoint's layout, pieces (whole checksum chunks), checks
#   striped_sources.cc  the sources: local files (O_DIRECT), a bucket, peers, relays
#   relay.cc            a pull that relays: served while it fills, taking from the holders before it
#   peer_entry.cc       LoadFromPeer and LoadFromPeerAndSeed: relaying first where it applies
add_library(tl_sources STATIC
  sources/striped_load.cc
  sources/striped_plan.cc
  sources/striped_sources.cc
  sources/striped_store.cc
  sources/relay.cc
  sources/peer_entry.cc
)
target_link_libraries(tl_sources PUBLIC tl_objstore tl_remote tl_sparse tl_load tl_device tl_format tl_common
                      PRIVATE Threads::Threads)
