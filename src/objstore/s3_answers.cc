// Parsers for S3's answers (see s3_answers.h). XML goes through libxml2
// with no network access and no entity substitution, bounded in size.
#include "objstore/s3_answers.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <charconv>
#include <memory>
#include <mutex>

namespace tensorlift::objstore {

namespace {

struct XmlDocDeleter {
  void operator()(xmlDoc* d) const { xmlFreeDoc(d); }
};
using XmlDoc = std::unique_ptr<xmlDoc, XmlDocDeleter>;

// S3 never sends a document type declaration. One would let a server declare
// entities that expand on reading (xmlNodeGetContent expands references):
// with libxml2 2.9.14, 977 bytes became a 1 MB "error code" and a 64 KiB body
// 60 MB (found by tests/fuzz/s3_answers_fuzz.cc). Such documents are refused
// before libxml2 parses them, and any DTD it still finds is refused after.
XmlDoc ParseXml(std::string_view body) {
  if (body.empty() || body.size() > kMaxListBodyBytes) return nullptr;
  if (body.find("<!DOCTYPE") != std::string_view::npos) return nullptr;
  InitXml();
  XmlDoc doc(xmlReadMemory(body.data(), static_cast<int>(body.size()), "s3-response.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
  if (doc && (doc->intSubset != nullptr || doc->extSubset != nullptr)) return nullptr;
  return doc;
}

bool NameIs(const xmlNode* n, const char* name) {
  return n->type == XML_ELEMENT_NODE && xmlStrcmp(n->name, BAD_CAST name) == 0;
}

const xmlNode* Child(const xmlNode* parent, const char* name) {
  for (const xmlNode* c = parent->children; c != nullptr; c = c->next) {
    if (NameIs(c, name)) return c;
  }
  return nullptr;
}

std::string Text(const xmlNode* n) {
  if (n == nullptr) return "";
  xmlChar* s = xmlNodeGetContent(n);
  if (s == nullptr) return "";
  std::string out(reinterpret_cast<const char*>(s));
  xmlFree(s);
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void InitXml() {
  static std::once_flag once;
  std::call_once(once, [] { xmlInitParser(); });
}

std::string Printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (char c : s.substr(0, max_bytes)) out += (c >= ' ' && c < 0x7f) ? c : '?';
  if (s.size() > max_bytes) out += "...";
  return out;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool UrlDecodeKey(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      *out += ' ';
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) return false;
      const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi < 0 || lo < 0) return false;
      *out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      *out += s[i];
    }
  }
  return true;
}

std::string StripQuotes(std::string_view s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return std::string(s);
}

bool ParseContentRange(std::string_view v, ContentRange* out) {
  *out = ContentRange();
  if (v.substr(0, 6) != "bytes ") return false;
  v.remove_prefix(6);
  const size_t slash = v.find('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view range = v.substr(0, slash), total = v.substr(slash + 1);
  if (range != "*") {
    const size_t dash = range.find('-');
    if (dash == std::string_view::npos || !ParseU64(range.substr(0, dash), &out->first) ||
        !ParseU64(range.substr(dash + 1), &out->last) || out->last < out->first) {
      return false;
    }
    out->has_range = true;
  }
  if (total != "*") {
    if (!ParseU64(total, &out->total)) return false;
    out->has_total = true;
  }
  return out->has_range || out->has_total;
}

void ParseS3Error(std::string_view body, std::string* code, std::string* message) {
  code->clear();
  message->clear();
  XmlDoc doc = ParseXml(body);
  if (!doc) return;
  const xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr || !NameIs(root, "Error")) return;
  *code = Text(Child(root, "Code"));
  *message = Text(Child(root, "Message"));
}

Result<ListPage> ParseListPage(std::string_view body, size_t listed_before) {
  XmlDoc doc = ParseXml(body);
  const xmlNode* root = doc ? xmlDocGetRootElement(doc.get()) : nullptr;
  if (root == nullptr || !NameIs(root, "ListBucketResult")) {
    return IOError("the answer (" + std::to_string(body.size()) +
                   " bytes) is not a ListBucketResult document");
  }
  ListPage page;
  const bool url_encoded = Text(Child(root, "EncodingType")) == "url";
  for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
    if (!NameIs(c, "Contents")) continue;
    const xmlNode* key = Child(c, "Key");
    const xmlNode* size = Child(c, "Size");
    ObjectInfo info;
    const std::string raw_key = Text(key);
    if (key == nullptr || size == nullptr || !ParseU64(Text(size), &info.size)) {
      return IOError("an entry without a Key or a valid Size (key '" + Printable(raw_key) + "')");
    }
    if (!url_encoded) {
      info.key = raw_key;
    } else if (!UrlDecodeKey(raw_key, &info.key)) {
      return IOError("a badly URL-encoded key '" + Printable(raw_key) + "'");
    }
    info.etag = StripQuotes(Text(Child(c, "ETag")));
    if (listed_before + page.objects.size() >= kMaxListedObjects) {
      return ResourceExhaustedError("more than " + std::to_string(kMaxListedObjects) + " objects");
    }
    page.objects.push_back(std::move(info));
  }
  if (Text(Child(root, "IsTruncated")) != "true") return page;
  page.truncated = true;
  page.next_token = Text(Child(root, "NextContinuationToken"));
  if (page.next_token.empty() || page.next_token.size() > kMaxContinuationToken) {
    return IOError("a truncated listing without a new NextContinuationToken");
  }
  return page;
}

}  // namespace tensorlift::objstore
