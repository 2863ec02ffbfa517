// Object URLs and S3 settings, found the way AWS's tools find them (see
// s3_settings.h): overrides, then AWS_* variables, then the shared credentials
// and config files of the profile.
//
// The files are INI text: "[section]" headers, "key = value" lines, full-line
// comments ('#' or ';'), and indented "key = value" lines under a key with no
// value (config's nested "s3 =" settings), stored as "s3.key". They are read
// with limits on size, line length and section count; a missing file is no
// error, an unreadable or oversized one is.
#include "objstore/s3_settings.h"

#include <errno.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/posix_file.h"
#include "io/pread.h"
#include "tensorlift/text.h"

namespace tensorlift::objstore {
namespace {

constexpr size_t kMaxConfigFileBytes = size_t{1} << 20;
constexpr size_t kMaxConfigLineBytes = 4096;
constexpr size_t kMaxConfigSections = 4096;
constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxEndpointBytes = 512;
constexpr size_t kMaxRegionBytes = 64;

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(Trim(v)) : std::string();
}

// "a.b.c.d" with four decimal numbers: S3 refuses bucket names shaped like an
// IPv4 address.
bool LooksLikeIpv4(std::string_view s) {
  int parts = 0;
  size_t digits = 0;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      if (++digits > 3) return false;
    } else if (c == '.') {
      if (digits == 0) return false;
      ++parts;
      digits = 0;
    } else {
      return false;
    }
  }
  return digits > 0 && parts == 3;
}

// One INI file: section name -> key -> value.
using IniSections = std::map<std::string, std::map<std::string, std::string>>;

struct IniFile {
  std::string path;     // As opened.
  std::string display;  // For messages: "~/.aws/config" or the path given.
  bool exists = false;
  IniSections sections;
};

Status ParseIni(std::string_view text, IniSections* out) {
  std::map<std::string, std::string>* section = nullptr;
  std::string parent;  // A key with no value: indented lines below it nest.
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.size() > kMaxConfigLineBytes) {
      return InvalidArgumentError("line " + std::to_string(line_no) + " is longer than " +
                                  std::to_string(kMaxConfigLineBytes) + " bytes");
    }
    const bool indented = !line.empty() && IsSpace(line.front());
    line = Trim(line);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return InvalidArgumentError("line " + std::to_string(line_no) +
                                    ": a section header without its closing ']'");
      }
      const std::string name(Trim(line.substr(1, line.size() - 2)));
      if (out->size() >= kMaxConfigSections && out->find(name) == out->end()) {
        return InvalidArgumentError("more than " + std::to_string(kMaxConfigSections) +
                                    " sections");
      }
      section = &(*out)[name];
      parent.clear();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("line " + std::to_string(line_no) +
                                  " is neither '[section]' nor 'key = value'");
    }
    if (section == nullptr) {
      return InvalidArgumentError("line " + std::to_string(line_no) +
                                  ": 'key = value' before any '[section]'");
    }
    std::string key(Trim(line.substr(0, eq)));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; });
    const std::string_view value = Trim(line.substr(eq + 1));
    if (indented && !parent.empty()) {
      (*section)[parent + "." + key] = std::string(value);
      continue;
    }
    parent = value.empty() ? key : std::string();
    (*section)[key] = std::string(value);
  }
  return Status::Ok();
}

// Reads and parses `file.path`; a file that does not exist leaves it empty.
Status LoadIni(IniFile* file) {
  auto result = [&]() -> Status {
    auto opened = PosixFile::OpenForRead(file->path);
    if (!opened.ok()) {
      if (opened.status().code() == StatusCode::kNotFound) return Status::Ok();
      return opened.status();
    }
    struct stat st;
    if (fstat(opened->fd(), &st) != 0) return PosixError("fstat", errno);
    if (!S_ISREG(st.st_mode)) return InvalidArgumentError("not a regular file");
    if (static_cast<uint64_t>(st.st_size) > kMaxConfigFileBytes) {
      return InvalidArgumentError("the file has " + std::to_string(st.st_size) +
                                  " bytes, more than the limit of " +
                                  std::to_string(kMaxConfigFileBytes));
    }
    std::string text(static_cast<size_t>(st.st_size), '\0');
    TL_RETURN_IF_ERROR(ReadExactlyAt(opened->fd(), 0, text.data(), text.size()));
    file->exists = true;
    return ParseIni(text, &file->sections);
  }();
  if (!result.ok()) return result.WithContext(file->display);
  return Status::Ok();
}

IniFile AwsFile(const char* env_var, const char* default_name) {
  IniFile file;
  file.path = Env(env_var);
  if (!file.path.empty()) {
    file.display = file.path;
    return file;
  }
  const std::string home = Env("HOME");
  if (home.empty()) return file;  // No home: no default file.
  file.path = home + "/.aws/" + default_name;
  file.display = std::string("~/.aws/") + default_name;
  return file;
}

const std::map<std::string, std::string>* FindSection(const IniFile& file,
                                                      const std::string& name) {
  auto it = file.sections.find(name);
  return it == file.sections.end() ? nullptr : &it->second;
}

std::string Lookup(const std::map<std::string, std::string>* section, const std::string& key) {
  if (section == nullptr) return "";
  auto it = section->find(key);
  return it == section->end() ? "" : it->second;
}

// "http(s)://host[:port]" with no path, query or user part; a trailing '/'
// is dropped.
Result<std::string> NormalizeEndpoint(std::string_view endpoint, std::string_view from) {
  std::string e(Trim(endpoint));
  while (!e.empty() && e.back() == '/') e.pop_back();
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("S3 endpoint " + QuoteName(endpoint) + " (from " +
                                std::string(from) + ") " + std::string(why));
  };
  if (e.size() > kMaxEndpointBytes) return bad("is too long");
  size_t host_start;
  if (e.rfind("https://", 0) == 0) {
    host_start = 8;
  } else if (e.rfind("http://", 0) == 0) {
    host_start = 7;
  } else {
    return bad("does not start with http:// or https://");
  }
  if (e.size() == host_start) return bad("has no host");
  for (size_t i = host_start; i < e.size(); ++i) {
    const char c = e[i];
    if (!(IsAlnum(c) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_')) {
      return bad("must be scheme://host[:port], without a path, user or query");
    }
  }
  return e;
}

Status ValidateRegion(const std::string& region, std::string_view from) {
  const bool ok =
      !region.empty() && region.size() <= kMaxRegionBytes &&
      std::all_of(region.begin(), region.end(), [](char c) { return IsLowerAlnum(c) || c == '-'; });
  if (!ok) {
    return InvalidArgumentError("S3 region " + QuoteName(region) + " (from " + std::string(from) +
                                ") is not lowercase letters, digits and '-'");
  }
  return Status::Ok();
}

bool IsAwsEndpoint(std::string_view endpoint) {
  const size_t start = endpoint.find("://");
  std::string_view host = endpoint.substr(start == std::string_view::npos ? 0 : start + 3);
  host = host.substr(0, host.find(':'));
  auto ends_with = [&](std::string_view suffix) {
    return host.size() > suffix.size() && host.substr(host.size() - suffix.size()) == suffix;
  };
  return ends_with(".amazonaws.com") || ends_with(".amazonaws.com.cn");
}

struct Keys {
  std::string access, secret, token;
};

// The key pair of `section` in `file`, or nullopt when it has none. Half a
// pair is an error.
Result<std::optional<Keys>> KeysFromSection(const std::map<std::string, std::string>* section,
                                            std::string_view where) {
  Keys keys{Lookup(section, "aws_access_key_id"), Lookup(section, "aws_secret_access_key"),
            Lookup(section, "aws_session_token")};
  if (keys.access.empty() && keys.secret.empty()) return std::optional<Keys>();
  if (keys.access.empty() || keys.secret.empty()) {
    return InvalidArgumentError(
        std::string(where) + " has " +
        (keys.access.empty() ? "aws_secret_access_key" : "aws_access_key_id") + " but not " +
        (keys.access.empty() ? "aws_access_key_id" : "aws_secret_access_key"));
  }
  return std::optional<Keys>(std::move(keys));
}

}  // namespace

bool IsObjectUrl(std::string_view path) {
  return path.rfind("s3://", 0) == 0 || path.rfind("gs://", 0) == 0;
}

bool IsValidBucketName(std::string_view bucket) {
  // S3's rules: 3 to 63 characters of lowercase letters, digits, '.' and '-',
  // starting and ending with a letter or digit, no "..", not an IPv4
  // address. Also accepted: the uppercase letters and '_' of legacy S3
  // buckets and GCS, and GCS's dotted names up to 222 characters.
  const bool dotted = bucket.find('.') != std::string_view::npos;
  if (bucket.size() < 3 || bucket.size() > (dotted ? 222u : 63u)) return false;
  if (!IsAlnum(bucket.front()) || !IsAlnum(bucket.back())) return false;
  size_t label = 0;
  for (size_t i = 0; i < bucket.size(); ++i) {
    const char c = bucket[i];
    if (c == '.') {
      if (bucket[i - 1] == '.' || bucket[i - 1] == '-' || bucket[i + 1] == '-') return false;
      label = 0;
      continue;
    }
    if (!(IsAlnum(c) || c == '-' || c == '_') || ++label > 63) return false;
  }
  return !LooksLikeIpv4(bucket);
}

bool IsDnsSafeBucketName(std::string_view bucket) {
  return IsValidBucketName(bucket) && bucket.size() <= 63 &&
         std::all_of(bucket.begin(), bucket.end(),
                     [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

Result<ObjectUrl> ParseObjectUrl(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("object URL " + QuoteName(url) + " " + std::string(why));
  };
  ObjectUrl out;
  if (url.rfind("s3://", 0) == 0) {
    out.scheme = "s3";
  } else if (url.rfind("gs://", 0) == 0) {
    out.scheme = "gs";
  } else {
    return bad("does not start with s3:// or gs://");
  }
  std::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  if (bucket.empty()) return bad("has no bucket name");
  if (!IsValidBucketName(bucket)) {
    return bad("has an invalid bucket name " + QuoteName(bucket) +
               " (3 to 63 letters, digits, '.', '-' or '_', starting and ending with a letter "
               "or digit, no '..', not an IP address)");
  }
  out.bucket = std::string(bucket);
  if (slash != std::string_view::npos) out.key = std::string(rest.substr(slash + 1));
  if (out.key.size() > kMaxKeyBytes) {
    return bad("has a key of " + std::to_string(out.key.size()) + " bytes, more than S3's " +
               std::to_string(kMaxKeyBytes));
  }
  for (char c : out.key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return bad("has a control character in its key");
    }
  }
  return out;
}

namespace {

// S3Settings' credentials (and credential_source): the caller's, else the
// variables, else the profile's in the credentials file, then the config
// file; none: unsigned, unless the profile needs what is not built.
Status ResolveCredentials(const S3Overrides& overrides,
                          const std::map<std::string, std::string>* cred_section,
                          const std::string& cred_where,
                          const std::map<std::string, std::string>* config_section,
                          const std::string& config_where, S3Settings* out) {
  S3Settings& s = *out;
  if (overrides.anonymous) {
    s.anonymous = true;
    s.credential_source = "none (unsigned)";
  } else if (!overrides.access_key.empty() || !overrides.secret_key.empty()) {
    if (overrides.access_key.empty() || overrides.secret_key.empty()) {
      return InvalidArgumentError(
          std::string("S3 credentials: ") +
          (overrides.access_key.empty() ? "a secret key" : "an access key") +
          " was given without " +
          (overrides.access_key.empty() ? "an access key" : "a secret key"));
    }
    s.access_key = overrides.access_key;
    s.secret_key = overrides.secret_key;
    s.session_token = overrides.session_token;
    s.credential_source = "given";
  } else {
    const std::string env_access = Env("AWS_ACCESS_KEY_ID");
    const std::string env_secret = Env("AWS_SECRET_ACCESS_KEY");
    if (!env_access.empty() != !env_secret.empty()) {
      return InvalidArgumentError(
          std::string("S3 credentials: ") +
          (env_access.empty() ? "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not"
                              : "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"));
    }
    TL_ASSIGN_OR_RETURN(std::optional<Keys> from_credentials,
                        KeysFromSection(cred_section, cred_where));
    TL_ASSIGN_OR_RETURN(std::optional<Keys> from_config,
                        KeysFromSection(config_section, config_where));
    const bool profile_first = !overrides.profile.empty();
    if (!env_access.empty() && !(profile_first && (from_credentials || from_config))) {
      s.access_key = env_access;
      s.secret_key = env_secret;
      s.session_token = Env("AWS_SESSION_TOKEN");
      s.credential_source = "environment";
    } else if (from_credentials) {
      s.access_key = from_credentials->access;
      s.secret_key = from_credentials->secret;
      s.session_token = from_credentials->token;
      s.credential_source = cred_where;
    } else if (from_config) {
      s.access_key = from_config->access;
      s.secret_key = from_config->secret;
      s.session_token = from_config->token;
      s.credential_source = config_where;
    } else {
      // Credentials that need more than the files (roles, SSO, processes)
      // are not supported; say so instead of sending unsigned requests.
      for (const char* key : {"role_arn", "credential_process", "sso_start_url", "sso_session",
                              "web_identity_token_file"}) {
        for (const auto& [section, where] :
             {std::pair{cred_section, &cred_where}, std::pair{config_section, &config_where}}) {
          if (!Lookup(section, key).empty()) {
            return UnimplementedError(*where + " gets its credentials through '" + key +
                                      "', which tensorlift does not support; export "
                                      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead");
          }
        }
      }
      s.anonymous = true;
      s.credential_source = "none (unsigned)";
    }
  }
  return Status::Ok();
}

}  // namespace

Result<S3Settings> ResolveS3Settings(std::string_view scheme, const S3Overrides& overrides) {
  if (scheme != "s3" && scheme != "gs") {
    return InvalidArgumentError("object storage scheme " + QuoteName(scheme) +
                                " is not \"s3\" or \"gs\"");
  }
  const bool gs = scheme == "gs";
  S3Settings s;

  // The profile, and the two files it is looked up in.
  std::string profile = overrides.profile;
  std::string profile_from = "given";
  if (profile.empty()) {
    profile = Env("AWS_PROFILE");
    profile_from = "AWS_PROFILE";
  }
  const bool profile_named = !profile.empty();
  if (!profile_named) profile = "default";
  IniFile credentials = AwsFile("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  IniFile config = AwsFile("AWS_CONFIG_FILE", "config");
  if (!credentials.path.empty()) TL_RETURN_IF_ERROR(LoadIni(&credentials));
  if (!config.path.empty()) TL_RETURN_IF_ERROR(LoadIni(&config));
  const auto* cred_section = FindSection(credentials, profile);
  const std::string config_name = profile == "default" ? "default" : "profile " + profile;
  const auto* config_section = FindSection(config, config_name);
  if (profile_named && cred_section == nullptr && config_section == nullptr) {
    auto name = [](const IniFile& f) {
      return f.display.empty() ? std::string("(no file: HOME is not set)") : f.display;
    };
    return NotFoundError("AWS profile " + QuoteName(profile) + " (from " + profile_from +
                         ") is in neither " + name(credentials) + " nor " + name(config) + " [" +
                         config_name + "]");
  }
  const std::string cred_where = credentials.display + " [" + profile + "]";
  const std::string config_where = config.display + " [" + config_name + "]";

  // Credentials. A profile given as an override beats the variables, as
  // --profile does for the AWS CLI.
  TL_RETURN_IF_ERROR(
      ResolveCredentials(overrides, cred_section, cred_where, config_section, config_where, &s));

  // Region. gs: the AWS variables and files name AWS regions; "auto" unless given.
  std::string region_from = "given";
  s.region = overrides.region;
  if (s.region.empty() && !gs) {
    s.region = Env("AWS_REGION");
    region_from = "AWS_REGION";
    if (s.region.empty()) {
      s.region = Env("AWS_DEFAULT_REGION");
      region_from = "AWS_DEFAULT_REGION";
    }
    if (s.region.empty()) {
      s.region = Lookup(config_section, "region");
      region_from = config_where;
    }
  }
  if (s.region.empty()) {
    s.region = gs ? "auto" : "us-east-1";
    region_from = "the default";
  }
  TL_RETURN_IF_ERROR(ValidateRegion(s.region, region_from));

  // Endpoint. gs: likewise, only an override replaces Google's.
  std::string endpoint = overrides.endpoint;
  std::string endpoint_from = "given";
  if (endpoint.empty() && !gs) {
    for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
      endpoint = Env(var);
      endpoint_from = var;
      if (!endpoint.empty()) break;
    }
    for (const char* key : {"s3.endpoint_url", "endpoint_url"}) {
      if (!endpoint.empty()) break;
      endpoint = Lookup(config_section, key);
      endpoint_from = config_where;
    }
  }
  const bool custom_endpoint = !endpoint.empty();
  if (!custom_endpoint) {
    endpoint = gs ? "https://storage.googleapis.com" : "https://s3." + s.region + ".amazonaws.com";
    endpoint_from = "the default";
  }
  TL_ASSIGN_OR_RETURN(s.endpoint, NormalizeEndpoint(endpoint, endpoint_from));

  // Addressing: path-style unless the endpoint is AWS's (the client also
  // uses path-style for buckets that are not DNS-safe).
  std::string addressing = overrides.addressing;
  if (addressing.empty() || addressing == "auto") {
    const std::string from_config = gs ? "" : Lookup(config_section, "s3.addressing_style");
    addressing = from_config.empty() ? "auto" : from_config;
  }
  if (addressing == "path") {
    s.path_style = true;
  } else if (addressing == "virtual") {
    s.path_style = false;
  } else if (addressing == "auto") {
    s.path_style = !IsAwsEndpoint(s.endpoint);
  } else {
    return InvalidArgumentError("S3 addressing " + QuoteName(addressing) +
                                " is not \"auto\", \"path\" or \"virtual\"");
  }

  s.ca_bundle = Env("AWS_CA_BUNDLE");
  if (s.ca_bundle.empty()) s.ca_bundle = Lookup(config_section, "ca_bundle");
  return s;
}

}  // namespace tensorlift::objstore
