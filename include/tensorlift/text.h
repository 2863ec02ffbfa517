// Rendering untrusted strings (tensor names, metadata, paths) for people and
// for machines.
#ifndef TENSORLIFT_TEXT_H_
#define TENSORLIFT_TEXT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tensorlift {

// Appends `s` as a JSON string literal, escaped as serde_json does it (the
// reference writer's bytes): '"', '\\' and control characters; \b \f \n \r \t
// in short form, the others as \u00xx. Non-ASCII stays raw UTF-8.
void AppendJsonString(std::string_view s, std::string* out);
std::string JsonString(std::string_view s);

// `name` in single quotes with control characters escaped as \xNN and cut
// after 200 bytes with "...", so a hostile name cannot flood or corrupt a
// terminal line.
std::string QuoteName(std::string_view name);

// "[2, 3, 4]".
std::string ShapeString(std::span<const uint64_t> shape);

}  // namespace tensorlift

#endif  // TENSORLIFT_TEXT_H_
