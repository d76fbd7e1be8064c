#include "common/checksum.h"

#include <xxhash.h>

namespace kvpool {

uint64_t BlockChecksum(const void* data, size_t length) { return XXH3_64bits(data, length); }

}  // namespace kvpool
