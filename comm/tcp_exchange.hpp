// Hands one small blob from rank 0 to every other rank over TCP (POSIX sockets, no other
// library): how ranks started by torchrun, without MPI, share NCCL's unique id. Rank 0 listens on
// MASTER_ADDR:MASTER_PORT; every other rank connects (retrying: rank 0 may start later) and names
// itself; once all world_size − 1 peers have, rank 0 sends each the blob, waits for each to confirm
// it, then releases them all. So no rank returns before every rank holds the blob (an all-ranks
// barrier), rank 0 closes only after its peers have read everything, and a job that is refused
// (a missing, duplicate or out-of-range rank) hands the blob to none of them. Every wait is
// bounded by one deadline; each failure is a CommError naming the address, the port and what was
// missing.
//
// The wire format, all integers big-endian:
//   peer -> rank 0: "SPX1", rank (u32), world size (u32)
//   rank 0 -> peer: status (u8: 0 the blob, 1 a refusal), length (u64), that many bytes (the blob,
//                   or the refusal's text)
//   peer -> rank 0: 'A' once it holds the blob
//   rank 0 -> peer: 'G' once every peer holds it (a refusal instead when one never confirms)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "comm/launch_env.hpp"

namespace shardplan::comm {

// Rank 0's end. It listens from construction on, so that the port is known and taken before any
// peer starts: on `address` when that is one of this host's addresses, else on every IPv4 address
// (a name that maps to this host only from outside it); port 0 takes any free port.
class TcpBlobServer {
public:
  TcpBlobServer(std::string address, int port, int world_size);
  TcpBlobServer(const TcpBlobServer&) = delete;
  TcpBlobServer& operator=(const TcpBlobServer&) = delete;
  ~TcpBlobServer();

  int port() const { return port_; }
  // Waits for the world_size − 1 peers, sends them `blob` and returns once each has it; then
  // stops listening. Throws CommError on timeout, on a peer that closes early, and on one that
  // names a rank out of range, one already taken, or another world size.
  void serve(std::span<const std::byte> blob, double timeout_s);

private:
  std::string address_;
  int port_;
  int world_size_;
  int listener_ = -1;
};

// A peer's end: connects to address:port (a name or an IPv4 address, resolved with getaddrinfo),
// retrying until the deadline, and returns rank 0's blob. 1 ≤ rank < world_size.
std::vector<std::byte> tcp_receive_blob(const std::string& address, int port, int rank,
                                        int world_size, double timeout_s);

// Both ends for the ranks of `environment`: rank 0 serves `blob` on MASTER_ADDR:MASTER_PORT, the
// others ignore theirs and receive it; every rank returns rank 0's blob. A job of one rank opens
// no socket.
std::vector<std::byte> tcp_share_blob(const LaunchEnvironment& environment,
                                      std::span<const std::byte> blob, double timeout_s);

}  // namespace shardplan::comm
