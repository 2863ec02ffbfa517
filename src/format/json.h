// Small helpers over simdjson's DOM shared by the parsers of untrusted JSON
// (the safetensors header, the peer manifest).
#ifndef TENSORLIFT_FORMAT_JSON_H_
#define TENSORLIFT_FORMAT_JSON_H_

#include <simdjson.h>

#include <string_view>

namespace tensorlift::json {

// A typed view of an element whose type the caller has checked. (Binding the
// result of value_unsafe() on a temporary simdjson_result would dangle.)
template <typename T>
T As(simdjson::dom::element el) {
  T out{};
  [[maybe_unused]] auto err = el.get(out);
  return out;
}

// "an array", "an integer", ...: a JSON type for messages.
inline std::string_view TypeName(simdjson::dom::element_type t) {
  using simdjson::dom::element_type;
  switch (t) {
    case element_type::ARRAY:
      return "an array";
    case element_type::OBJECT:
      return "an object";
    case element_type::INT64:
    case element_type::UINT64:
      return "an integer";
    case element_type::DOUBLE:
      return "a floating point number";
    case element_type::STRING:
      return "a string";
    case element_type::BOOL:
      return "a boolean";
    case element_type::NULL_VALUE:
      return "null";
  }
  return "a value";
}

}  // namespace tensorlift::json

#endif  // TENSORLIFT_FORMAT_JSON_H_
