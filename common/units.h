#pragma once
// Human-readable sizes and durations for flags and output: "4GiB", "512MiB", "64KiB", "1.5GB",
// "100" (bytes). Binary (KiB, MiB, GiB, TiB, PiB, also K/M/G/T/P) and decimal (KB, MB, GB, TB)
// units. Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool {

// InvalidArgument on an empty string, an unknown unit, a negative value or overflow.
Result<uint64_t> ParseBytes(std::string_view text);
// "1.5 GiB", "64 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace kvpool
