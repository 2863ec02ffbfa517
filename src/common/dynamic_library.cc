#include "common/dynamic_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

namespace tensorlift {

Result<DynamicLibrary> DynamicLibrary::Open(const char* env_var, const std::string& default_name,
                                            std::string_view what, std::string_view hint,
                                            bool global) {
  const char* env = env_var != nullptr ? std::getenv(env_var) : nullptr;
  const bool named = env != nullptr && env[0] != '\0';
  const std::string name = named ? env : default_name;
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (handle == nullptr) {
    const char* err = dlerror();
    return UnavailableError(std::string(what) + " not found: dlopen(" + name +
                            "): " + (err ? err : "unknown error") +
                            (named ? std::string() : std::string(hint)));
  }
  return DynamicLibrary(handle, name, std::string(what));
}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      name_(std::move(other.name_)),
      what_(std::move(other.what_)),
      keep_(other.keep_) {}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr && !keep_) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
    what_ = std::move(other.what_);
    keep_ = other.keep_;
  }
  return *this;
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr && !keep_) dlclose(handle_);
}

std::string DynamicLibrary::Where(const void* symbol) {
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

Status DynamicLibrary::Find(const char* symbol, void** out) const {
  dlerror();
  void* p = dlsym(handle_, symbol);
  if (p == nullptr) {
    const char* err = dlerror();
    return UnavailableError(what_ + " lacks symbol " + symbol +
                            (err ? std::string(": ") + err : std::string()));
  }
  *out = p;
  return Status::Ok();
}

}  // namespace tensorlift
