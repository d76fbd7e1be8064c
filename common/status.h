#pragma once
// Forwarding header: kvpool's error type is public (the C++ client returns it), so it
// lives in include/kvpool/status.h. Internal code may include either name.
#include <kvpool/status.h>
