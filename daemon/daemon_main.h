#pragma once
// DaemonMain: what kvpoold's main() does, callable from another main(): parses the flags, starts
// the daemon (daemon/daemon.h), waits for SIGTERM/SIGINT (stop) and SIGHUP (reload the
// namespaces file), and returns the exit status. A program that registers strategies of its own
// (tiers/strategy_registry.h) calls it after registering them, so the namespaces file can name
// them (examples/custom_eviction.cc).
//
// Thread safety: call once, from the main thread, before any other thread starts.

namespace kvpool::daemon {

int DaemonMain(int argc, char** argv);

}  // namespace kvpool::daemon
