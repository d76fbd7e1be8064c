"""How an engine's configuration reaches kvpoold beyond its address and namespace.

Every connector (vLLM, SGLang, LMCache, transformers) reads the same keys from its own
configuration mapping, so a namespace guarded by a credential or a daemon behind TLS is
configured the same way everywhere:

- ``credential_file``: a file holding the namespace's credential (the secret itself never sits
  in an engine's configuration, which is often logged);
- ``tls_ca``, ``tls_cert``, ``tls_key``: PEM files for a ``tls://HOST:PORT`` address.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

TLS_KEYS = ("tls_ca", "tls_cert", "tls_key")


def client_kwargs(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The kvpool.Client keyword arguments that ``config`` gives (keys under ``prefix``).

    Raises ValueError naming the file when a credential file cannot be read: a configuration
    error, reported at the engine's start rather than as a stream of cache misses.
    """
    out: dict[str, Any] = {}
    credential_file = config.get(prefix + "credential_file")
    if credential_file:
        try:
            out["credential"] = Path(str(credential_file)).read_text().strip()
        except OSError as e:
            raise ValueError(f"kvpool: cannot read {prefix}credential_file "
                             f"{credential_file}: {e.strerror}") from e
    for key in TLS_KEYS:
        value = config.get(prefix + key)
        if value:
            out[key] = str(value)
    return out
