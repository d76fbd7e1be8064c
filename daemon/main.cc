// kvpoold: the kvpool daemon (daemon/daemon_main.h). See README.md and `kvpoold --help`.

#include "daemon/daemon_main.h"

int main(int argc, char** argv) { return kvpool::daemon::DaemonMain(argc, argv); }
