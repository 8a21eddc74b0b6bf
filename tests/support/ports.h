// Loopback ports for the servers tests start. Each is a probe, not a reservation: another
// process may bind the port before the server does, which the server's start reports (callers
// retry or fail with that error).
#pragma once

namespace gradhub::testing {

// A TCP port on 127.0.0.1 that was free a moment ago: the kernel's pick, so from its ephemeral
// range. Throws std::runtime_error when no socket can be bound.
int FreeLoopbackPort();

// A TCP port on 127.0.0.1 that is free now and lies below the kernel's ephemeral range, for a
// server that is restarted on its old port (LocalCluster::KillApi, then StartApi). A port of
// the ephemeral range may be taken in the meantime by any client connection or Gloo listener
// of the tests running beside this one; one below it is taken only by a server asking for it.
// 0 (the kernel's pick) when 100 draws found none free.
int PortBelowEphemeralRange();

}  // namespace gradhub::testing
