#pragma once
// Block keys at the Python boundary: 32-byte `bytes` objects, and chain hashing.
//
// Thread safety: call with the GIL held.

#include <nanobind/nanobind.h>

#include <kvpool/block_key.h>

#include <optional>
#include <string>
#include <vector>

namespace kvpool::py {

namespace nb = nanobind;

void RegisterKeys(nb::module_& m);

// A 32-byte bytes-like object as a key; TypeError / InvalidArgument otherwise.
BlockKey ToKey(nb::handle obj, const std::string& what);
// None -> the zero key (a new chain).
BlockKey ToParent(nb::handle obj);
std::vector<BlockKey> ToKeys(nb::handle seq, const std::string& what);
nb::bytes KeyBytes(const BlockKey& key);

}  // namespace kvpool::py
