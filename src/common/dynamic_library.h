// A shared library opened at run time (dlopen): the optional GPU libraries
// (cuFile, NCCL) are loaded this way, so that tensorlift builds and runs
// without them and says why when one is missing.
#ifndef TENSORLIFT_COMMON_DYNAMIC_LIBRARY_H_
#define TENSORLIFT_COMMON_DYNAMIC_LIBRARY_H_

#include <string>
#include <string_view>

#include "tensorlift/status.h"

namespace tensorlift {

class DynamicLibrary {
 public:
  // dlopen of $env_var when set (and not empty), else of default_name.
  // Unavailable("<what> not found: dlopen(<name>): <dlerror>" + hint) on
  // failure; the hint (how to install it, or to set env_var) is left out
  // when the caller named the library through env_var. `global`: RTLD_GLOBAL
  // (for libraries whose own plugins look up their symbols, as Open MPI's).
  static Result<DynamicLibrary> Open(const char* env_var, const std::string& default_name,
                                     std::string_view what, std::string_view hint,
                                     bool global = false);
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;
  // dlclose, unless Keep() was called.
  ~DynamicLibrary();

  // *out = the symbol `symbol`, or Unavailable("<what> lacks symbol <symbol>").
  template <typename F>
  Status Symbol(const char* symbol, F* out) const {
    void* p = nullptr;
    TL_RETURN_IF_ERROR(Find(symbol, &p));
    *out = reinterpret_cast<F>(p);
    return Status::Ok();
  }
  // The library stays loaded for the life of the process (its functions are in use).
  void Keep() { keep_ = true; }
  // The name it was opened by.
  const std::string& name() const { return name_; }
  // The file that holds `symbol` (an address in a loaded library), or "" if
  // dladdr cannot say: where a library opened by soname was found.
  static std::string Where(const void* symbol);

 private:
  DynamicLibrary(void* handle, std::string name, std::string what)
      : handle_(handle), name_(std::move(name)), what_(std::move(what)) {}
  Status Find(const char* symbol, void** out) const;

  void* handle_ = nullptr;
  std::string name_;
  std::string what_;
  bool keep_ = false;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMON_DYNAMIC_LIBRARY_H_
