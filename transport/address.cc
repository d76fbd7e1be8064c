#include "transport/address.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>

namespace kvpool::transport {

Status ParseHostPort(std::string_view address, std::string* host, uint16_t* port) {
  std::string_view a = address;
  if (IsTcpAddress(a)) a.remove_prefix(6);
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size()) {
    return Status::InvalidArgument("address '" + std::string(address) +
                                   "' is not tcp://HOST:PORT (or tls://HOST:PORT)");
  }
  std::string_view h = a.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  const std::string_view p = a.substr(colon + 1);
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (ec != std::errc() || ptr != p.data() + p.size() || value > 65535) {
    return Status::InvalidArgument("address '" + std::string(address) + "' has a bad port");
  }
  *host = std::string(h);
  *port = static_cast<uint16_t>(value);
  return Status::OK();
}

std::string CanonicalIp(std::string_view ip) {
  ip = ip.substr(0, ip.find('%'));  // an IPv6 scope ("fe80::1%eth0"): UCX reports none
  constexpr std::string_view kMapped = "::ffff:";
  if (ip.size() > kMapped.size() && ip.substr(0, kMapped.size()) == kMapped &&
      ip.find('.') != std::string_view::npos) {
    return std::string(ip.substr(kMapped.size()));
  }
  return std::string(ip);
}

bool IsTlsAddress(std::string_view address) { return address.substr(0, 6) == "tls://"; }

bool IsTcpAddress(std::string_view address) {
  return address.substr(0, 6) == "tcp://" || IsTlsAddress(address);
}

std::string DefaultSocketPath() {
  if (const char* env = std::getenv("KVPOOL_SOCKET"); env != nullptr && *env != '\0') return env;
  if (::geteuid() == 0) return "/run/kvpool/kvpool.sock";
  return "/tmp/kvpool-" + std::to_string(::geteuid()) + "/kvpool.sock";
}

}  // namespace kvpool::transport
