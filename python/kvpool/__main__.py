"""python -m kvpool: the CLI's status, stats and sessions commands, from Python.

    python -m kvpool status
    python -m kvpool stats [--json]
    python -m kvpool sessions ls [--prefix=P] [--json] | show ID [--json] | rm ID

Flags as build/client/kvpool's, before or after the command: --socket (path, tcp:// or
tls://HOST:PORT), --namespace, --timeout_ms, --credential_file, --admin,
--cluster_secret_file, --tls_ca, --tls_cert, --tls_key. Without admin rights on a daemon that
guards them, status and stats show the namespace's own use, as the CLI does.
Exit status: 0 on success, 1 when the daemon answered with an error or cannot be reached,
2 on a usage error. The output matches the CLI's (client/cli.cc); `stats --watch` is the CLI's
only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import kvpool
from kvpool._options import client_kwargs, read_secret_file


def format_bytes(n: int) -> str:
    """As kvpool::FormatBytes: "512 B", "1.50 KiB", "12.0 MiB"."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, u = float(n), 0
    while v >= 1024.0 and u < 5:
        v /= 1024.0
        u += 1
    if u == 0:
        return f"{n} B"
    return f"{v:.{2 if v < 10 else 1}f} {units[u]}"


def percent(part: int, whole: int) -> str:
    return f"{0.0 if whole == 0 else 100.0 * part / whole:.1f}%"


def utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms // 1000))


def _read_secret(path: str, flag: str) -> str:
    try:
        return read_secret_file(path)
    except OSError as e:
        raise _Usage(f"cannot read --{flag} {path}: {e.strerror}") from e
    except ValueError as e:
        raise _Usage(f"--{flag}: {e}") from e


def _connect(args) -> kvpool.Client:
    try:
        options = client_kwargs(vars(args))
    except ValueError as e:
        raise _Usage(str(e).removeprefix("kvpool: ")) from e
    if args.cluster_secret_file:
        options["cluster_secret"] = _read_secret(args.cluster_secret_file, "cluster_secret_file")
    return kvpool.Client(args.socket or None, args.namespace, timeout=args.timeout_ms / 1000,
                         client_name="kvpool-py-cli", admin=args.admin, **options)


def print_namespace_stats(s: dict, namespace: str) -> None:
    """Stats without admin rights: the namespace's own use (as the CLI's)."""
    tiers = "".join(f", {t['name']} {format_bytes(t['used_bytes'])}" for t in s["tiers"])
    print(f"kvpoold {s['node_id']} (version {s['version']}), up {s['uptime_s']} s\n"
          f"namespace {namespace}: {s['sessions']} sessions{tiers}\n"
          "(daemon-wide figures need admin rights: --admin)")


def cmd_status(args) -> None:
    s = _connect(args).stats()
    if args.json:
        print(json.dumps(s, indent=2))
        return
    if s["namespace_only"]:
        print_namespace_stats(s, args.namespace)
        return
    print(f"kvpoold {s['node_id']} (version {s['version']}), up {s['uptime_s']} s, "
          f"{s['connections']} connections, {s['sessions']} sessions")
    for t in s["tiers"]:
        print(f"  {t['name']}: {format_bytes(t['used_bytes'])} of "
              f"{format_bytes(t['capacity_bytes'])} ({percent(t['used_bytes'], t['capacity_bytes'])}"
              f"), {t['blocks']} blocks")
    line = f"  cluster: {s['cluster_state']}"
    if s["cluster_state"] != "standalone":
        line += f", {s['cluster_members']} members"
    if s["cluster_reason"]:
        line += f" ({s['cluster_reason']})"
    print(line)
    print(f"  lookups: {s['lookups']}, prefix hit rate "
          f"{percent(s['lookup_hit_blocks'], s['lookup_blocks'])}; dedup ratio {s['dedup_ratio']:g}")


def cmd_stats(args) -> None:
    s = _connect(args).stats()
    if args.json:
        print(json.dumps(s, indent=2))
        return
    if s["namespace_only"]:
        print_namespace_stats(s, args.namespace)
        return
    print(f"node {s['node_id']}  version {s['version']}  uptime {s['uptime_s']} s")
    print(f"{'tier':<6} {'used':>12} {'capacity':>12} {'blocks':>10} {'hits':>10} "
          f"{'promoted':>10} {'demoted':>10} {'evicted':>10} {'frag':>8}")
    for t in s["tiers"]:
        print(f"{t['name']:<6} {format_bytes(t['used_bytes']):>12} "
              f"{format_bytes(t['capacity_bytes']):>12} {t['blocks']:>10} {t['hits']:>10} "
              f"{t['promotions']:>10} {t['demotions']:>10} {t['evictions']:>10} "
              f"{100 * t['fragmentation']:>7.1f}%")
    print(f"lookups {s['lookups']} (blocks asked {s['lookup_blocks']}, in cached prefix "
          f"{s['lookup_hit_blocks']} = {percent(s['lookup_hit_blocks'], s['lookup_blocks'])})")
    print(f"gets {s['gets']} (blocks served {s['get_blocks_served']}, misses {s['get_misses']})")
    print(f"puts: blocks offered {s['puts_offered']}, already cached {s['puts_deduplicated']}, "
          f"stored {s['puts_committed']} (dedup ratio {s['dedup_ratio']:.2f})")
    print(f"bytes in {format_bytes(s['bytes_in'])}, out {format_bytes(s['bytes_out'])}; "
          f"prefetches {s['prefetches_issued']} (useful {s['prefetches_useful']}); "
          f"checksum failures {s['checksum_failures']}")
    print(f"index {s['index_entries']} entries ({format_bytes(s['index_bytes'])}); leases "
          f"{s['leases_active']}; reservations {s['reservations_active']}; sessions "
          f"{s['sessions']}; connections {s['connections']}")
    print(f"rocksdb memory {format_bytes(s['rocksdb_memory_bytes'])}; index rebuilt at start "
          f"from {s['index_rebuild_blocks']} disk blocks in {s['index_rebuild_seconds']:.2f} s")


def cmd_sessions(args) -> None:
    if args.sub != "ls" and not args.id:
        raise _Usage(f"sessions {args.sub} needs a session id")
    c = _connect(args)
    if args.sub == "ls":
        rows = c.list_sessions(args.prefix)
        if args.json:
            print(json.dumps([{"session_id": r.session_id, "blocks": r.blocks,
                               "token_count": r.token_count, "total_bytes": r.total_bytes,
                               "updated_unix_ms": r.updated_unix_ms} for r in rows], indent=2))
            return
        print(f"{'session':<40} {'blocks':>8} {'tokens':>10} {'bytes':>12}  updated")
        for r in rows:
            print(f"{r.session_id:<40} {r.blocks:>8} {r.token_count:>10} "
                  f"{format_bytes(r.total_bytes):>12}  {utc(r.updated_unix_ms)}")
        return
    if args.sub == "show":
        s = c.load_session(args.id, prefetch=False)
        if args.json:
            print(json.dumps({"session_id": s.session_id, "token_count": s.token_count,
                              "metadata": s.metadata, "keys": [k.hex() for k in s.keys],
                              "cached_blocks": s.cached_blocks, "total_bytes": s.total_bytes,
                              "created_unix_ms": s.created_unix_ms,
                              "updated_unix_ms": s.updated_unix_ms}, indent=2))
            return
        print(f"session {s.session_id}\n  tokens {s.token_count}, blocks {len(s.keys)} "
              f"({s.cached_blocks} cached now), {format_bytes(s.total_bytes)}\n  created "
              f"{utc(s.created_unix_ms)}, updated {utc(s.updated_unix_ms)}")
        for k, v in sorted(s.metadata.items()):
            print(f"  {k} = {v}")
        for i, k in enumerate(s.keys):
            print(f"  [{i}] {k.hex()}")
        return
    c.delete_session(args.id)
    print(f"deleted session {args.id}")


class _Usage(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    # The connection flags are on every command's parser too, so they may come before or after
    # the command, as the CLI's do. None has a default there (SUPPRESS: a flag not given after
    # the command keeps what was given before it); the defaults are filled in after parsing.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--socket", help="kvpoold address: a Unix socket path, "
                        "tcp://HOST:PORT or tls://HOST:PORT (default: $KVPOOL_SOCKET, else the "
                        "daemon's default socket)")
    common.add_argument("--credential_file",
                        help="file holding the namespace's credential (or, with --admin, the "
                        "admin's)")
    common.add_argument("--admin", action="store_true",
                        help="ask for admin rights: daemon-wide stats (without them, the "
                        "namespace's own use)")
    common.add_argument("--cluster_secret_file",
                        help="file holding the cluster secret, for tcp:// daemons in cluster mode")
    for key, what in (("tls_ca", "PEM CA file a tls:// daemon's certificate must chain to"),
                      ("tls_cert", "this client's PEM certificate, for a tls:// daemon that "
                       "asks for one"), ("tls_key", "the PEM key of --tls_cert")):
        common.add_argument("--" + key, help=what)
    common.add_argument("--namespace", "--namespace_name", dest="namespace",
                        help="the namespace (default: default)")
    common.add_argument("--timeout_ms", type=int, help="per request (default: 5000)")
    common.add_argument("--json", action="store_true", help="print JSON")
    common.add_argument("--prefix", help="sessions ls: only ids starting with this")
    defaults = {"socket": "", "credential_file": "", "admin": False, "cluster_secret_file": "",
                "tls_ca": "", "tls_cert": "", "tls_key": "", "namespace": "default",
                "timeout_ms": 5000, "json": False, "id": "", "prefix": ""}
    p = argparse.ArgumentParser(prog="python -m kvpool", description=__doc__.split("\n")[0],
                                parents=[common])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("status", "stats"):
        sub.add_parser(name, parents=[common])
    sp = sub.add_parser("sessions", parents=[common])
    sp.add_argument("sub", choices=["ls", "show", "rm"])
    sp.add_argument("id", nargs="?", default=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if hasattr(args, "prefix") and (args.command != "sessions" or args.sub != "ls"):
        p.error("--prefix is for sessions ls only")
    for key, value in defaults.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    try:
        {"status": cmd_status, "stats": cmd_stats, "sessions": cmd_sessions}[args.command](args)
    except _Usage as e:
        print(f"kvpool: {e}", file=sys.stderr)
        return 2
    except kvpool.Error as e:
        print(f"kvpool: {e.code}: {e.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
