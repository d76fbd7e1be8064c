#pragma once
// kvpool.Client: one connection to a kvpoold for one namespace, over the C++ kvpool::Client.
//
// Every call that waits on the daemon releases the GIL. A Python Client may be shared between
// threads: calls on one Client are serialized by its own mutex (taken after the GIL is
// released, so a waiting call never blocks other Python threads); use one Client per thread for
// parallelism (connections are cheap).

#include <nanobind/nanobind.h>

namespace kvpool::py {

namespace nb = nanobind;

void RegisterClient(nb::module_& m);

}  // namespace kvpool::py
