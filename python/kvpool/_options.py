"""How an engine's configuration reaches kvpoold beyond its address and namespace.

Every connector (vLLM, SGLang, LMCache, transformers) reads the same keys from its own
configuration mapping, so a namespace guarded by a credential or a daemon behind TLS is
configured the same way everywhere:

- ``credential_file``: a file holding the namespace's credential (the secret itself never sits
  in an engine's configuration, which is often logged);
- ``tls_ca``, ``tls_cert``, ``tls_key``: PEM files for a ``tls://HOST:PORT`` address.
"""

from __future__ import annotations

from typing import Any, Mapping

TLS_KEYS = ("tls_ca", "tls_cert", "tls_key")

_MAX_SECRET_BYTES = 4096
_TRAILING_SPACE = " \t\n\v\f\r"  # C's isspace, as kvpoold strips them


def read_secret_file(path: str) -> str:
    """A secret kept in a file, as kvpoold and the C++ CLI read it: the whole file, less trailing
    white space (an editor's final newline). OSError when it cannot be read, ValueError when it
    is larger than 4 KiB."""
    with open(path, "rb") as f:
        data = f.read(_MAX_SECRET_BYTES + 1)
    if len(data) > _MAX_SECRET_BYTES:
        raise ValueError(f"{path} is larger than {_MAX_SECRET_BYTES} bytes: not a secret")
    try:
        return data.decode().rstrip(_TRAILING_SPACE)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text, which the Python client needs "
                         "(e.g. head -c 32 /dev/urandom | base64)") from e


def client_kwargs(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The kvpool.Client keyword arguments that ``config`` gives (keys under ``prefix``).

    Raises ValueError naming the file when a credential file cannot be read: a configuration
    error, reported at the engine's start rather than as a stream of cache misses.
    """
    out: dict[str, Any] = {}
    credential_file = config.get(prefix + "credential_file")
    if credential_file:
        try:
            out["credential"] = read_secret_file(str(credential_file))
        except OSError as e:
            raise ValueError(f"kvpool: cannot read {prefix}credential_file "
                             f"{credential_file}: {e.strerror}") from e
        except ValueError as e:
            raise ValueError(f"kvpool: {prefix}credential_file: {e}") from e
    for key in TLS_KEYS:
        value = config.get(prefix + key)
        if value:
            out[key] = str(value)
    return out
