#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvpool {

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  s = s.substr(i);
  if (s.empty()) return Status::InvalidArgument("empty size");
  size_t num_end = 0;
  while (num_end < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[num_end])) || s[num_end] == '.')) {
    ++num_end;
  }
  if (num_end == 0) return Status::InvalidArgument("size '" + s + "' does not start with a number");
  const std::string number = s.substr(0, num_end);
  char* parsed_end = nullptr;
  const double value = std::strtod(number.c_str(), &parsed_end);
  if (parsed_end != number.c_str() + number.size()) {
    return Status::InvalidArgument("size '" + s + "' has a malformed number '" + number + "'");
  }
  std::string unit = s.substr(num_end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kib") {
    mult = 1024.0;
  } else if (unit == "m" || unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "p" || unit == "pib") {
    mult = 1024.0 * 1024 * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    mult = 1e3;
  } else if (unit == "mb") {
    mult = 1e6;
  } else if (unit == "gb") {
    mult = 1e9;
  } else if (unit == "tb") {
    mult = 1e12;
  } else {
    return Status::InvalidArgument("size '" + s + "' has an unknown unit '" + unit +
                                   "' (use B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB or TB)");
  }
  const double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes >= 1.8e19) {
    return Status::InvalidArgument("size '" + s + "' is too large");
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.*f %s", v < 10 ? 2 : 1, v, kUnits[u]);
  }
  return buf;
}

}  // namespace kvpool
