#pragma once
// Control-plane addresses: "tcp://HOST:PORT" (or "HOST:PORT") and Unix socket paths, and the
// default socket path that kvpoold and every client agree on.
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::transport {

// Splits "tcp://HOST:PORT", "tls://HOST:PORT", "HOST:PORT" or "[V6]:PORT" into host and port.
// InvalidArgument otherwise.
Status ParseHostPort(std::string_view address, std::string* host, uint16_t* port);

// An IP address in the form kvpool compares peers by: an IPv4-mapped IPv6 address
// ("::ffff:10.0.0.7") as IPv4 ("10.0.0.7"), an IPv6 address without its scope ("fe80::1%eth0"
// as "fe80::1"); anything else as given.
std::string CanonicalIp(std::string_view ip);

// A control address over TCP: "tcp://..." or "tls://..." (TLS over TCP).
bool IsTcpAddress(std::string_view address);
bool IsTlsAddress(std::string_view address);

// $KVPOOL_SOCKET when set; else /run/kvpool/kvpool.sock for root (the systemd unit's
// RuntimeDirectory) and /tmp/kvpool-<uid>/kvpool.sock for anyone else.
std::string DefaultSocketPath();

}  // namespace kvpool::transport
