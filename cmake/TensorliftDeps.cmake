# Third-party dependencies, all from Debian's -dev packages (scripts/setup.sh
# installs them). Nothing is vendored.
find_package(PkgConfig REQUIRED)
find_package(simdjson REQUIRED CONFIG)
find_package(Threads REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

if(TENSORLIFT_BUILD_TOOLS)
  find_package(CLI11 REQUIRED CONFIG)
endif()
if(TENSORLIFT_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(TENSORLIFT_BUILD_BENCH)
  find_package(benchmark REQUIRED CONFIG)
endif()
