# Optional backends (MPI, UCX): one way to choose, detect and build them.
#
#   tl_backend_option(UCX "the UCX data plane")
#       the cache variable TENSORLIFT_WITH_UCX = AUTO | ON | OFF; sets
#       TENSORLIFT_HAVE_UCX to OFF and the reason to "TENSORLIFT_WITH_UCX=OFF".
#       The caller then looks for the dependency unless it is OFF.
#   tl_backend_found(UCX <found> "<built with>" "<why missing>")
#       found: TENSORLIFT_HAVE_UCX ON; else a fatal error if it was ON, or
#       the reason for the stub.
#   tl_backend_sources(UCX <target> <real.cc> <none.cc> <REASON_DEFINE>)
#       builds real.cc, or none.cc with REASON_DEFINE="<the reason>" (the
#       stub says at run time why the backend is missing).
macro(tl_backend_option name what)
  set(TENSORLIFT_WITH_${name} AUTO CACHE STRING "Build ${what}: AUTO, ON or OFF")
  set(TENSORLIFT_HAVE_${name} OFF)
  set(_tl_${name}_what "${what}")
  set(_tl_no_${name}_reason "TENSORLIFT_WITH_${name}=OFF")
endmacro()

macro(tl_backend_found name found built_with missing)
  if(${found})
    set(TENSORLIFT_HAVE_${name} ON)
    message(STATUS "tensorlift: building ${_tl_${name}_what} (${built_with})")
  elseif(TENSORLIFT_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "TENSORLIFT_WITH_${name}=ON but ${missing}")
  else()
    set(_tl_no_${name}_reason "${missing}")
    message(STATUS "tensorlift: ${missing}; building without ${_tl_${name}_what}")
  endif()
endmacro()

function(tl_backend_sources name target source none_source reason_define)
  if(TENSORLIFT_HAVE_${name})
    target_sources(${target} PRIVATE ${source})
  else()
    target_sources(${target} PRIVATE ${none_source})
    set_source_files_properties(${none_source} PROPERTIES
      COMPILE_DEFINITIONS "${reason_define}=\"${_tl_no_${name}_reason}\"")
  endif()
endfunction()
