# sources: loads that use several sources at once (include/tensorlift/striped.h).
#   striped_load.cc     LoadStriped: the local files, a bucket and peers share one
#                       load's ranges (work stealing), each chunk checked where it lands
#   striped_plan.cc     the plan: the wanted tensors, where they land, units and ranges, checks
#   striped_sources.cc  the sources: local files (O_DIRECT), a bucket, peers
add_library(tl_sources STATIC
  sources/striped_load.cc
  sources/striped_plan.cc
  sources/striped_sources.cc
)
target_link_libraries(tl_sources PUBLIC tl_objstore tl_remote tl_sparse tl_load tl_device tl_format tl_common
                      PRIVATE Threads::Threads)
