// tensorlift._tensorlift: the nanobind extension. Bindings only: it uses the
// public C++ API and converts Status codes to Python exceptions in one place
// (Raise, ext_common.h). The pure-Python package (python/tensorlift) builds
// the safetensors- and fastsafetensors-compatible APIs on top.
//
// Buffers reach Python only as DLPack capsules that own a reference to their
// arena, so a tensor stays valid until the last consumer drops it.
//
// The module's parts, one file each: ext_common.cc (errors, conversions),
// ext_checkpoint.cc (Checkpoint, ArenaPool, Loaded), ext_stream.cc
// (LayerStreamer), ext_remote.cc (peers, serving, striped loads),
// ext_format.cc (the format, conversion, the multi-rank rules, utilities).

#include <cstdlib>
#include <string>

#include "ext_common.h"
#include "tensorlift/crash.h"
#include "tensorlift/version.h"

namespace tensorlift::ext {
namespace {

void BindCrashReport(nb::module_& m) {
  m.def("crash_handler_installed", &CrashHandlerInstalled,
        "Whether a fatal signal prints tensorlift's report (include/tensorlift/crash.h): installed "
        "when this module is imported, unless TENSORLIFT_CRASH_HANDLER=0.");
  m.def(
      "_crash_for_test",
      [](const std::string& kind) {
        if (kind == "segv") {
          volatile int* nowhere = nullptr;
          *nowhere = 1;  // NOLINT: the fault is the point.
        } else if (kind == "abort") {
          std::abort();
        } else {
          throw nb::value_error("kind: segv or abort");
        }
      },
      nb::arg("kind"), "Crashes the process (tests of the crash report only).");
}

}  // namespace
}  // namespace tensorlift::ext

NB_MODULE(_tensorlift, m) {
  using namespace tensorlift;
  using namespace tensorlift::ext;
  m.doc() = "tensorlift's C++ core (use the tensorlift package, not this module)";
  m.attr("__version__") = kVersion;
  // A fatal signal in any thread of this process leaves a report on stderr, then
  // goes on to the handler that was there before (Python's faulthandler, when on).
  InstallCrashHandler();
  BindCrashReport(m);
  BindErrors(m);
  BindCheckpoint(m);
  BindArenaPool(m);
  BindLoaded(m);
  BindStreamer(m);
  BindPeerServer(m);
  BindServing(m);
  BindPeerLoading(m);
  BindFormat(m);
  BindMultiRank(m);
  BindUtilities(m);
}
