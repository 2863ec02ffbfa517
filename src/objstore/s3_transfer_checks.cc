// The S3 client's checks of every answer (see s3_transfers.h): a 2xx
// answer's status, Content-Range and Content-Length against the request
// before a byte is stored; what an error answer means (retry, or which
// permanent error, naming the object, the endpoint and the credentials'
// source); and how an attempt ended.

// libcurl is opened at run time (curl_api.h): every curl_* call below goes
// through the table LoadCurl fills.
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include <string>

#include "objstore/curl_api.h"
#include "objstore/s3_answers.h"
#include "objstore/s3_transfers.h"
#include "tensorlift/text.h"

namespace tensorlift::objstore {
namespace {

bool IsTransientCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

Status S3Transfers::ShortObject(const Transfer& t, bool size_known, uint64_t size) const {
  const std::string name = Name(t.bucket, t.key);
  if (size_known) {
    return OutOfRangeError("short object: " + name + " is " + std::to_string(size) +
                           " bytes, but bytes " + t.RangeText() + " were requested");
  }
  return OutOfRangeError("short object: " + name + " ends before the requested bytes " +
                         t.RangeText() + " (size not reported)");
}

Status S3Transfers::CheckStart(Transfer& t) {
  if (t.method == Method::kHead) return Status::Ok();
  if (!t.ranged) {
    if (t.body != nullptr && t.have_content_length && t.content_length > t.limit) {
      return ResourceExhaustedError(t.what + ": the object is " + std::to_string(t.content_length) +
                                    " bytes, more than the limit of " + std::to_string(t.limit));
    }
    return Status::Ok();
  }
  const uint64_t end = t.offset + t.bytes;
  if (t.have_content_range) {
    ContentRange cr;
    if (!ParseContentRange(t.content_range, &cr) || !cr.has_range) {
      return IOError(t.what + ": the server answered with an unreadable Content-Range '" +
                     Printable(t.content_range) + "'");
    }
    if (cr.first == t.offset && cr.last + 1 < end && cr.has_total && cr.last + 1 == cr.total) {
      return ShortObject(t, true, cr.total);
    }
    if (cr.first != t.offset || cr.last + 1 != end) {
      return IOError(t.what + ": the server answered with Content-Range '" +
                     Printable(t.content_range) + "', not the requested range");
    }
    if (t.have_content_length && t.content_length != t.bytes) {
      return IOError(t.what + ": the server answered with Content-Length " +
                     std::to_string(t.content_length) + " for " + std::to_string(t.bytes) +
                     " requested bytes");
    }
    return Status::Ok();
  }
  if (t.status == 206) return IOError(t.what + ": the server answered 206 without Content-Range");
  // 200 without Content-Range: the body is the whole object.
  if (t.have_content_length && t.content_length < end) {
    return ShortObject(t, true, t.content_length);
  }
  if (t.offset != 0 || (t.have_content_length && t.content_length != t.bytes)) {
    return IOError(t.what + ": the server ignored the Range header and sent the whole object" +
                   (t.have_content_length ? " (" + std::to_string(t.content_length) + " bytes)"
                                          : std::string()));
  }
  return Status::Ok();
}

Status S3Transfers::HttpError(Transfer& t, Outcome* outcome, std::string* retry_reason) {
  std::string code, message;
  ParseS3Error(t.error_body, &code, &message);
  std::string detail = "HTTP " + std::to_string(t.status);
  if (!code.empty()) detail += " " + Printable(code, 64);
  if (!message.empty()) detail += ": " + Printable(message);
  const std::string& endpoint = settings_.endpoint;
  *outcome = Outcome::kFail;
  if (t.status == 429 || t.status == 500 || t.status == 502 || t.status == 503 || t.status == 504 ||
      code == "SlowDown" || code == "RequestTimeout" || code == "InternalError") {
    *outcome = Outcome::kRetry;
    *retry_reason = detail;
    return Status::Ok();
  }
  // Unsigned requests to a store that wants signatures: rclone answers 400
  // UnsupportedAlgorithm, others 400 MissingSecurityHeader or 403.
  const bool unsigned_refused =
      settings_.anonymous && t.status == 400 &&
      (code == "UnsupportedAlgorithm" || code == "MissingSecurityHeader" || code == "AccessDenied");
  if (t.status == 401 || t.status == 403 || unsigned_refused) {
    std::string hint;
    if (settings_.anonymous) {
      hint =
          "; the request was unsigned: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
          "AWS_PROFILE for a private bucket";
    }
    return PermissionDeniedError(t.what + ": access denied (" + detail + "); credentials from " +
                                 settings_.credential_source + ", endpoint " + endpoint +
                                 ", region " + settings_.region + hint);
  }
  if (t.status == 404) {
    if (code == "NoSuchBucket") {
      return NotFoundError("bucket " + QuoteName(t.bucket) + " does not exist at " + endpoint +
                           " (" + detail + ")");
    }
    if (t.key.empty())
      return NotFoundError(t.what + ": not found at " + endpoint + " (" + detail + ")");
    return NotFoundError(Name(t.bucket, t.key) + " does not exist at " + endpoint + " (" + detail +
                         ")");
  }
  if (t.status == 416) {
    ContentRange cr;
    const bool known =
        t.have_content_range && ParseContentRange(t.content_range, &cr) && cr.has_total;
    t.size_unknown = !known;
    return ShortObject(t, known, cr.total);
  }
  if (!t.bucket_region.empty() && t.bucket_region != settings_.region &&
      (t.status == 301 || t.status == 307 || t.status == 400)) {
    return InvalidArgumentError("bucket " + QuoteName(t.bucket) + " is in region " +
                                Printable(t.bucket_region, 64) + ", not " + settings_.region +
                                " (set AWS_REGION=" + Printable(t.bucket_region, 64) + "; " +
                                detail + ")");
  }
  if (t.status == 301 || t.status == 307 || t.status == 400) {
    return InvalidArgumentError(t.what + ": " + detail + " (endpoint " + endpoint + ", region " +
                                settings_.region + ", credentials from " +
                                settings_.credential_source + ")");
  }
  return IOError(t.what + ": " + detail + " from " + endpoint);
}

Outcome S3Transfers::Finish(Transfer& t, CURLcode result, Status* error,
                            std::string* retry_reason) {
  if (!t.abort.ok()) {
    *error = t.abort;
    return Outcome::kFail;
  }
  if (result != CURLE_OK) {
    std::string why = curl_easy_strerror(result);
    if (t.errbuf[0] != '\0') why += " (" + Printable(t.errbuf) + ")";
    if (IsTransientCurlError(result)) {
      *retry_reason = why;
      return Outcome::kRetry;
    }
    *error = UnavailableError(t.what + " from " + settings_.endpoint + ": " + why);
    return Outcome::kFail;
  }
  if (t.status < 200 || t.status > 299) {
    Outcome outcome;
    *error = HttpError(t, &outcome, retry_reason);
    return outcome;
  }
  if (!t.checked) {  // No body came: check the headers now.
    t.checked = true;
    *error = CheckStart(t);
    if (!error->ok()) return Outcome::kFail;
  }
  const bool short_ranged = t.ranged && t.received != t.bytes;
  const bool short_body = !t.ranged && t.method == Method::kGet && t.have_content_length &&
                          t.received != t.content_length;
  if (short_ranged || short_body) {
    *retry_reason = "short body: " + std::to_string(t.received) + " of " +
                    std::to_string(t.ranged ? t.bytes : t.content_length) + " bytes";
    return Outcome::kRetry;
  }
  return Outcome::kDone;
}

}  // namespace tensorlift::objstore
