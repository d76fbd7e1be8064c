"""kvpool: Python client of kvpoold, the KV-cache block service, and its KV kernels.

    import kvpool
    keys = kvpool.hash_chain(tokens, secret="tenant-a", layout=layout, tokens_per_block=16)
    with kvpool.Client(namespace="tenant-a") as c:
        hit = c.lookup(keys)                          # longest cached prefix
        c.get_into(keys[:hit.hit_blocks], buffers)    # into numpy arrays / torch CPU tensors
        c.put(keys[hit.hit_blocks:], blocks, parent=keys[hit.hit_blocks - 1] if hit.hit_blocks else None)

Every kvpool failure is a subclass of kvpool.Error, one class per status code (NotFound,
Unavailable, DeadlineExceeded, ...). Buffers are taken without a copy through the buffer protocol
or DLPack. `import kvpool` needs neither numpy nor torch. The kernels are in kvpool.kernels, the
test daemon helper in kvpool.testing, engine adapters in kvpool.hf (and friends).
"""

from kvpool._native import (  # noqa: F401  (re-exports)
    Aborted,
    AlreadyExists,
    BlockView,
    Borrowed,
    Client,
    Corruption,
    DeadlineExceeded,
    Error,
    FailedPrecondition,
    GetResult,
    Internal,
    InvalidArgument,
    IoError,
    LookupResult,
    NotFound,
    PendingGet,
    PermissionDenied,
    PutResult,
    ResourceExhausted,
    Session,
    SessionSummary,
    Unavailable,
    Unimplemented,
    default_socket_path,
    hash_chain,
    layout_fingerprint,
    layout_string,
    namespace_salt,
)

__version__ = "0.1.0"

__all__ = [
    "Aborted", "AlreadyExists", "BlockView", "Borrowed", "Client", "Corruption", "DeadlineExceeded", "Error",
    "FailedPrecondition", "GetResult", "Internal", "InvalidArgument", "IoError", "LookupResult",
    "NotFound", "PendingGet", "PermissionDenied", "PutResult", "ResourceExhausted", "Session", "SessionSummary",
    "Unavailable", "Unimplemented", "default_socket_path", "hash_chain", "layout_fingerprint",
    "layout_string", "namespace_salt",
]
