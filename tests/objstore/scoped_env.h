// Sets an environment variable (or unsets it, for a null value) for the life
// of the object, then puts back what was there: the object-storage tests'
// AWS_* settings.
#ifndef TENSORLIFT_TESTS_OBJSTORE_SCOPED_ENV_H_
#define TENSORLIFT_TESTS_OBJSTORE_SCOPED_ENV_H_

#include <cstdlib>
#include <string>

namespace tensorlift::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_OBJSTORE_SCOPED_ENV_H_
