#pragma once
// This process's TCP connections to the job's store, found by the store's address, so that they can
// be shut down when the store has stopped answering for longer than the world's timeout. c10d's
// TCPStore client may wait for a reply with no time limit (after a wait times out, it waits for the
// server to confirm the cancellation); a link that is down never delivers it, and a rank cut off from
// the store would hang there. Shutting the sockets down makes every such call fail at once, so the
// rank reports the fault and exits.

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::detail {

class StoreConnections {
 public:
  // Resolves `host` now (not when the store has already stopped answering).
  StoreConnections(const std::string& host, uint16_t port);
  // Shuts down (both directions) every socket of this process connected to the store's address.
  // Returns how many it found.
  int shut_down() const;

 private:
  std::vector<sockaddr_storage> addresses_;
};

}  // namespace dtensor::detail
