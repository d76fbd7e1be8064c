#pragma once
// Standard base64 (RFC 4648, with padding), as etcd's JSON gateway encodes keys and values and
// as a member record carries its UCX worker address.
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::daemon::cluster {

std::string Base64Encode(std::string_view bytes);

// InvalidArgument unless `text` is canonical padded base64 (length a multiple of 4, alphabet
// A-Z a-z 0-9 + /, '=' only as the final one or two characters).
Result<std::string> Base64Decode(std::string_view text);

}  // namespace kvpool::daemon::cluster
