// The rank-0-to-all exchange between real processes on 127.0.0.1: the test process is rank 0, each
// peer a fork()ed child that reports through its exit status.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>  // ::kill, SIGKILL (POSIX's <signal.h>)
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_error.hpp"
#include "comm/tcp_exchange.hpp"

using namespace shardplan::comm;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Exit statuses of a peer.
constexpr int kGotTheBlob = 0;
constexpr int kGotAnotherBlob = 1;
constexpr int kRefused = 2;   // a CommError naming rank 0's refusal
constexpr int kFailed = 3;    // any other error
constexpr int kNoChild = -1;  // not reaped in time (then killed)

// 128 bytes, as an ncclUniqueId, different for each test.
std::vector<std::byte> blob_for(int seed) {
  std::vector<std::byte> blob(128);
  for (std::size_t i = 0; i < blob.size(); ++i)
    blob[i] = static_cast<std::byte>((i * 37 + static_cast<std::size_t>(seed) * 11 + 5) & 0xffU);
  return blob;
}

// Runs `body` in a child process, which exits with its result; never returns in the child.
pid_t start_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int status = kFailed;
    try {
      status = body();
    } catch (const CommError& error) {
      status = std::string(error.what()).find("refused the job") != std::string::npos ? kRefused
                                                                                      : kFailed;
    } catch (...) {
      status = kFailed;
    }
    ::_exit(status);  // no doctest reporting, no destructors of the parent's objects
  }
  return pid;
}

// A peer of rank `rank` that checks it received `expected`.
pid_t start_peer(int port, int rank, int world_size, const std::vector<std::byte>& expected,
                 double timeout_s = 5, std::chrono::milliseconds delay = 0ms,
                 const std::string& address = "127.0.0.1") {
  return start_child([=] {
    std::this_thread::sleep_for(delay);
    const auto got = tcp_receive_blob(address, port, rank, world_size, timeout_s);
    return got == expected ? kGotTheBlob : kGotAnotherBlob;
  });
}

// The child's exit status, or kNoChild when it has not ended within `limit` (it is killed).
int wait_for_child(pid_t pid, std::chrono::milliseconds limit = 5000ms) {
  const auto until = Clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : kNoChild;
    if (done < 0 || Clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return kNoChild;
    }
    std::this_thread::sleep_for(5ms);
  }
}

// A port that nothing listens on right now: the kernel's choice for port 0, released again.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Rank 0's error from serve(), or "" when it succeeded.
std::string serve_error(TcpBlobServer& server, const std::vector<std::byte>& blob,
                        double timeout_s) {
  try {
    server.serve(blob, timeout_s);
  } catch (const CommError& error) {
    return error.what();
  }
  return "";
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("tcp_exchange::one rank needs no socket") {
  const auto blob = blob_for(1);
  const LaunchEnvironment alone{
      .rank = 0, .world_size = 1, .local_rank = 0, .master_addr = "192.0.2.1", .master_port = 1};
  CHECK(tcp_share_blob(alone, blob, 0.1) == blob);
}

TEST_CASE("tcp_exchange::every peer of 2 and of 4 ranks gets rank 0's exact blob") {
  for (const int world_size : {2, 4}) {
    CAPTURE(world_size);
    const auto blob = blob_for(world_size);
    TcpBlobServer server("127.0.0.1", 0, world_size);
    REQUIRE(server.port() > 0);
    std::vector<pid_t> peers;
    for (int rank = 1; rank < world_size; ++rank)
      peers.push_back(start_peer(server.port(), rank, world_size, blob));
    CHECK(serve_error(server, blob, 5) == "");
    for (const pid_t peer : peers) CHECK(wait_for_child(peer) == kGotTheBlob);
  }
}

TEST_CASE("tcp_exchange::every rank shares through the launch environment, by host name") {
  const int world_size = 4;
  const int port = free_port();
  const auto blob = blob_for(7);
  std::vector<pid_t> peers;
  for (int rank = 1; rank < world_size; ++rank)
    peers.push_back(start_child([=] {
      const LaunchEnvironment environment{.rank = rank,
                                          .world_size = world_size,
                                          .local_rank = rank,
                                          .master_addr = "localhost",
                                          .master_port = port};
      // A peer's own blob is ignored: it returns rank 0's.
      return tcp_share_blob(environment, blob_for(100 + rank), 5) == blob ? kGotTheBlob
                                                                          : kGotAnotherBlob;
    }));
  const LaunchEnvironment rank0{.rank = 0,
                                .world_size = world_size,
                                .local_rank = 0,
                                .master_addr = "localhost",
                                .master_port = port};
  CHECK(tcp_share_blob(rank0, blob, 5) == blob);
  for (const pid_t peer : peers) CHECK(wait_for_child(peer) == kGotTheBlob);
}

TEST_CASE("tcp_exchange::a peer that starts 1 s after rank 0 still gets the blob") {
  const auto blob = blob_for(2);
  TcpBlobServer server("127.0.0.1", 0, 3);
  const pid_t early = start_peer(server.port(), 1, 3, blob);
  const pid_t late = start_peer(server.port(), 2, 3, blob, 5, 1000ms);
  CHECK(serve_error(server, blob, 5) == "");
  CHECK(wait_for_child(early) == kGotTheBlob);
  CHECK(wait_for_child(late) == kGotTheBlob);
}

TEST_CASE("tcp_exchange::peers wait for a rank 0 that starts after them") {
  const auto blob = blob_for(3);
  const int port = free_port();
  const pid_t peer = start_peer(port, 1, 2, blob);
  std::this_thread::sleep_for(300ms);
  TcpBlobServer server("127.0.0.1", port, 2);
  CHECK(serve_error(server, blob, 5) == "");
  CHECK(wait_for_child(peer) == kGotTheBlob);
}

TEST_CASE("tcp_exchange::a missing peer ends rank 0 at the deadline, naming what is missing") {
  const auto blob = blob_for(4);
  TcpBlobServer server("127.0.0.1", 0, 3);
  const pid_t present = start_peer(server.port(), 1, 3, blob);
  const auto start = Clock::now();
  const auto error = serve_error(server, blob, 1);
  const double took = seconds_since(start);
  CHECK(error.find("rank 0: 1 of 2 peers connected to 127.0.0.1:" + std::to_string(server.port()) +
                   " within 1 s (missing ranks 2)") == 0);
  // The deadline is one time point fixed when the server starts waiting (deadline_after), which
  // every poll waits for at most: the wait is bounded below here; how late a loaded machine
  // wakes it is not the exchange's.
  CHECK(took >= 0.9);
  // The peer that came is told why, instead of waiting for its own deadline.
  CHECK(wait_for_child(present, 2000ms) == kRefused);
}

TEST_CASE("tcp_exchange::a peer without rank 0 ends at its deadline, naming the address") {
  const int port = free_port();
  const auto start = Clock::now();
  std::string error;
  try {
    (void)tcp_receive_blob("127.0.0.1", port, 1, 2, 0.3);
  } catch (const CommError& failure) {
    error = failure.what();
  }
  CHECK(error.find("rank 1: could not connect to rank 0 at 127.0.0.1:" + std::to_string(port) +
                   " within 0.3 s (last error: Connection refused)") == 0);
  // It tried again until its deadline (a lower bound: how late a loaded machine wakes it is not
  // the exchange's).
  CHECK(seconds_since(start) >= 0.29);
}

TEST_CASE("tcp_exchange::two peers claiming one rank are refused") {
  const auto blob = blob_for(5);
  TcpBlobServer server("127.0.0.1", 0, 3);
  const pid_t first = start_peer(server.port(), 1, 3, blob);
  const pid_t second = start_peer(server.port(), 1, 3, blob);
  const auto error = serve_error(server, blob, 5);
  CHECK(error.find("rank 0: the peers from 127.0.0.1:") == 0);
  CHECK(error.find(" both claim rank 1") != std::string::npos);
  // Neither gets the blob: both learn that the job was refused.
  CHECK(wait_for_child(first) == kRefused);
  CHECK(wait_for_child(second) == kRefused);
}

TEST_CASE("tcp_exchange::a peer of another world size is refused") {
  const auto blob = blob_for(6);
  TcpBlobServer server("127.0.0.1", 0, 3);
  const pid_t peer = start_peer(server.port(), 3, 4, blob);
  const auto error = serve_error(server, blob, 5);
  CHECK(error.find("is rank 3 of a world of 4 ranks, but this job has 3") != std::string::npos);
  CHECK(wait_for_child(peer) == kRefused);
}

TEST_CASE("tcp_exchange::a peer claiming a rank out of range is refused") {
  // No well-formed peer sends this; write the greeting by hand (the format in tcp_exchange.hpp).
  const auto blob = blob_for(8);
  TcpBlobServer server("127.0.0.1", 0, 3);
  const int port = server.port();
  const pid_t peer = start_child([port] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
      return kFailed;
    const std::array<unsigned char, 12> hello{'S', 'P', 'X', '1', 0, 0, 0, 5, 0, 0, 0, 3};
    if (::send(fd, hello.data(), hello.size(), 0) != static_cast<ssize_t>(hello.size()))
      return kFailed;
    unsigned char status = 0xff;
    const ssize_t got = ::recv(fd, &status, 1, 0);  // blocks at most until rank 0 closes
    ::close(fd);
    return got == 1 && status == 1 ? kRefused : kFailed;
  });
  const auto error = serve_error(server, blob, 5);
  CHECK(error.find("claims rank 5, outside 1..2") != std::string::npos);
  CHECK(wait_for_child(peer) == kRefused);
}

TEST_CASE("tcp_exchange::a port in use is reported with the address") {
  TcpBlobServer first("127.0.0.1", 0, 2);
  std::string error;
  try {
    TcpBlobServer second("127.0.0.1", first.port(), 2);
  } catch (const CommError& failure) {
    error = failure.what();
  }
  CHECK(error.find("rank 0: cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                   ": Address already in use") == 0);
}
