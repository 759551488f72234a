#include "comm/tcp_exchange.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "comm/comm_error.hpp"

namespace shardplan::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<std::byte, 4> kMagic{std::byte{'S'}, std::byte{'P'}, std::byte{'X'},
                                          std::byte{'1'}};
constexpr std::size_t kHelloBytes = 12;
constexpr std::size_t kReplyHeaderBytes = 9;
constexpr std::uint8_t kStatusBlob = 0;
constexpr std::uint8_t kStatusRefusal = 1;
constexpr std::byte kAck{'A'};
constexpr std::byte kGo{'G'};
// NCCL's unique id is 128 bytes; anything far larger means that something else answered.
constexpr std::uint64_t kMaxReplyBytes = std::uint64_t{1} << 20;

// An owned socket.
class Socket {
public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) (void)::close(fd_);  // nothing is left to report on a socket being dropped
    fd_ = -1;
  }

private:
  int fd_ = -1;
};

std::string seconds_text(double seconds) { return fmt::format("{:g} s", seconds); }

std::string errno_text(int error) { return std::strerror(error); }

Clock::time_point deadline_after(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(timeout_s, 0.0)));
}

// Milliseconds until `deadline` for poll(), rounded up so that a wait never ends just before it.
int milliseconds_left(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

enum class Io { done, timed_out, closed, failed };

struct IoResult {
  Io status = Io::done;
  int error = 0;  // errno when failed
};

// Waits until `fd` is ready for `events` or the deadline passes; false on timeout. Errors and
// hang-ups count as ready: the next read or write reports them.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, milliseconds_left(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return true;
  }
}

IoResult send_all(int fd, const void* data, std::size_t bytes, Clock::time_point deadline) {
  const auto* next = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t sent = ::send(fd, next, bytes, MSG_NOSIGNAL);
    if (sent > 0) {
      next += sent;
      bytes -= static_cast<std::size_t>(sent);
    } else if (sent < 0 && errno == EINTR) {
      continue;
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) return {Io::timed_out, 0};
    } else {
      return {Io::failed, sent < 0 ? errno : EPIPE};
    }
  }
  return {};
}

IoResult receive_exactly(int fd, void* data, std::size_t bytes, Clock::time_point deadline) {
  auto* next = static_cast<std::byte*>(data);
  while (bytes > 0) {
    const ssize_t got = ::recv(fd, next, bytes, 0);
    if (got > 0) {
      next += got;
      bytes -= static_cast<std::size_t>(got);
    } else if (got == 0) {
      return {Io::closed, 0};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return {Io::timed_out, 0};
    } else {
      return {Io::failed, errno};
    }
  }
  return {};
}

void put_u32(std::byte* out, std::uint32_t value) {
  for (int i = 3; i >= 0; --i, value >>= 8) out[i] = static_cast<std::byte>(value & 0xffU);
}
void put_u64(std::byte* out, std::uint64_t value) {
  for (int i = 7; i >= 0; --i, value >>= 8) out[i] = static_cast<std::byte>(value & 0xffU);
}
std::uint64_t get_be(const std::byte* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = value << 8 | std::to_integer<std::uint64_t>(in[i]);
  return value;
}

void set_non_blocking_options(int fd) {
  // The exchange is a few tiny messages, each waited for: send them at once.
  const int on = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

std::string endpoint_text(const std::string& address, int port) {
  return fmt::format("{}:{}", address, port);
}

std::string peer_text(const sockaddr_storage& peer, socklen_t length) {
  std::array<char, NI_MAXHOST> host{};
  std::array<char, NI_MAXSERV> service{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&peer), length, host.data(), host.size(),
                    service.data(), service.size(), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return fmt::format("{}:{}", host.data(), service.data());
}

struct AddressList {
  addrinfo* first = nullptr;
  AddressList() = default;
  AddressList(const AddressList&) = delete;
  AddressList& operator=(const AddressList&) = delete;
  ~AddressList() {
    if (first != nullptr) ::freeaddrinfo(first);
  }
};

// getaddrinfo's error code (0 on success); `list` holds the addresses.
int resolve(const std::string& address, int port, bool passive, AddressList& list) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  return ::getaddrinfo(address.c_str(), service.c_str(), &hints, &list.first);
}

// Rank 0's reply: status, length, payload.
IoResult send_reply(int fd, std::uint8_t status, std::span<const std::byte> payload,
                    Clock::time_point deadline) {
  std::array<std::byte, kReplyHeaderBytes> header{};
  header[0] = std::byte{status};
  put_u64(header.data() + 1, payload.size());
  if (const auto result = send_all(fd, header.data(), header.size(), deadline);
      result.status != Io::done)
    return result;
  return send_all(fd, payload.data(), payload.size(), deadline);
}

// The refusal rank 0 sends to every peer it knows of before it gives up, so that each ends with
// rank 0's reason instead of a bare "connection closed". Best effort, briefly.
void send_refusal(int fd, const std::string& reason) {
  (void)send_reply(fd, kStatusRefusal, std::as_bytes(std::span(reason)), deadline_after(0.2));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (const int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

}  // namespace

TcpBlobServer::TcpBlobServer(std::string address, int port, int world_size)
    : address_(std::move(address)), port_(port), world_size_(world_size) {
  if (world_size_ < 1 || port_ < 0 || port_ > 65535)
    throw CommError(
        fmt::format("rank 0: cannot serve a world of {} ranks on port {}", world_size_, port_),
        __FILE__, __LINE__);
  AddressList addresses;
  if (const int code = resolve(address_, port_, true, addresses); code != 0)
    throw CommError(
        fmt::format("rank 0: cannot resolve \"{}\": {}", address_, ::gai_strerror(code)), __FILE__,
        __LINE__);
  int last_error = EADDRNOTAVAIL;
  const auto try_bind = [&](const sockaddr* where, socklen_t length, int family) {
    Socket candidate(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!candidate.valid()) {
      last_error = errno;
      return false;
    }
    // A rank 0 restarted on the same port must not wait for its predecessor's TIME_WAIT sockets.
    const int on = 1;
    (void)::setsockopt(candidate.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(candidate.get(), where, length) != 0 ||
        ::listen(candidate.get(), std::max(world_size_, SOMAXCONN)) != 0) {
      last_error = errno;
      return false;
    }
    listener_ = candidate.release();
    return true;
  };
  bool listening = false;
  for (const addrinfo* entry = addresses.first; entry != nullptr && !listening;
       entry = entry->ai_next)
    listening = try_bind(entry->ai_addr, entry->ai_addrlen, entry->ai_family);
  if (!listening && last_error == EADDRNOTAVAIL) {
    // MASTER_ADDR names this host only as others see it (NAT, a cluster's DNS): any IPv4 address.
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_port = htons(static_cast<std::uint16_t>(port_));
    any.sin_addr.s_addr = htonl(0);
    listening = try_bind(reinterpret_cast<const sockaddr*>(&any), sizeof any, AF_INET);
  }
  if (!listening)
    throw CommError(
        fmt::format("rank 0: cannot listen on {}: {}{}", endpoint_text(address_, port_),
                    errno_text(last_error),
                    last_error == EADDRINUSE ? " (another program holds the port)" : ""),
        __FILE__, __LINE__);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (::getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &length) == 0)
    port_ = bound.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

TcpBlobServer::~TcpBlobServer() {
  if (listener_ >= 0) (void)::close(listener_);
}

namespace {

// Rank 0's side of one exchange: the peers' connections, by rank once each has named itself.
class Rendezvous {
public:
  Rendezvous(Socket listener, std::string where, int world_size, double timeout_s)
      : listener_(std::move(listener)), where_(std::move(where)), world_size_(world_size),
        peers_(world_size - 1), timeout_s_(timeout_s), deadline_(deadline_after(timeout_s)),
        by_rank_(static_cast<std::size_t>(world_size)),
        from_rank_(static_cast<std::size_t>(world_size)) {}

  // 1. Every peer connects and names itself.
  void connect_all() {
    while (connected_ < peers_) {
      std::vector<pollfd> entries;
      entries.push_back({listener_.get(), POLLIN, 0});
      for (const auto& entry : pending_) entries.push_back({entry.socket.get(), POLLIN, 0});
      const int ready =
          ::poll(entries.data(), static_cast<nfds_t>(entries.size()), milliseconds_left(deadline_));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0)
        give_up(fmt::format("rank 0: poll on {} failed: {}", where_, errno_text(errno)), __LINE__);
      if (ready == 0)
        give_up(fmt::format("rank 0: {} of {} peers connected to {} within {} (missing ranks {})",
                            connected_, peers_, where_, seconds_text(timeout_s_),
                            missing_ranks([&](int rank) {
                              return by_rank_[static_cast<std::size_t>(rank)].valid();
                            })),
                __LINE__);
      // Greetings first: accepting may add to `pending_` and move its elements.
      for (std::size_t i = 0; i < pending_.size();) {
        if (entries[i + 1].revents == 0 || !read_greeting(pending_[i])) {
          ++i;
          continue;
        }
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        ++connected_;
      }
      if (entries[0].revents != 0) accept_waiting();
    }
  }

  // 2. Every peer gets the blob; 3. confirms it; 4. is released.
  void deliver(std::span<const std::byte> blob) {
    for (int rank = 1; rank < world_size_; ++rank) {
      const auto result = send_reply(socket_of(rank), kStatusBlob, blob, deadline_);
      if (result.status != Io::done)
        give_up(fmt::format("rank 0: sending the id to rank {} ({}) from {} {}", rank,
                            from_rank_[static_cast<std::size_t>(rank)], where_,
                            result.status == Io::timed_out
                                ? "did not finish within " + seconds_text(timeout_s_)
                                : "failed: " + errno_text(result.error)),
                __LINE__);
    }
    for (int rank = 1; rank < world_size_; ++rank) {
      std::byte ack{};
      const auto result = receive_exactly(socket_of(rank), &ack, 1, deadline_);
      if (result.status == Io::timed_out)
        give_up(fmt::format("rank 0: {} of {} peers confirmed the id from {} within {} (missing "
                            "ranks {})",
                            rank - 1, peers_, where_, seconds_text(timeout_s_),
                            missing_ranks([&](int r) { return r < rank; })),
                __LINE__);
      if (result.status != Io::done || ack != kAck)
        give_up(fmt::format("rank 0: rank {} ({}) closed its connection to {} before confirming "
                            "the id{}",
                            rank, from_rank_[static_cast<std::size_t>(rank)], where_,
                            result.status == Io::failed ? ": " + errno_text(result.error) : ""),
                __LINE__);
    }
    // Each peer has read everything sent to it and sent nothing more, so closing after 'G' ends
    // the connection cleanly (no reset) even if this process exits at once.
    for (int rank = 1; rank < world_size_; ++rank)
      (void)send_all(socket_of(rank), &kGo, 1, deadline_);
  }

private:
  struct Pending {
    Socket socket;
    std::string from;
    std::array<std::byte, kHelloBytes> hello{};
    std::size_t received = 0;
  };

  int socket_of(int rank) const { return by_rank_[static_cast<std::size_t>(rank)].get(); }

  template <typename Done> std::string missing_ranks(const Done& done) const {
    std::vector<int> missing;
    for (int rank = 1; rank < world_size_; ++rank)
      if (!done(rank)) missing.push_back(rank);
    return rank_list(missing);
  }

  // Tells every peer that has connected why the job ends, then ends it on this rank.
  [[noreturn]] void give_up(const std::string& reason, int line) {
    for (auto& socket : by_rank_)
      if (socket.valid()) send_refusal(socket.get(), reason);
    for (auto& entry : pending_) send_refusal(entry.socket.get(), reason);
    throw CommError(reason, __FILE__, line);
  }

  // Reads what has arrived of a peer's greeting; true once it is whole and the peer holds its
  // rank's slot (its socket moved there).
  bool read_greeting(Pending& entry) {
    const ssize_t got = ::recv(entry.socket.get(), entry.hello.data() + entry.received,
                               kHelloBytes - entry.received, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (got <= 0)
      give_up(fmt::format("rank 0: a peer from {} closed its connection to {} before naming its "
                          "rank{}",
                          entry.from, where_, got < 0 ? ": " + errno_text(errno) : ""),
              __LINE__);
    entry.received += static_cast<std::size_t>(got);
    if (entry.received < kHelloBytes) return false;
    if (!std::equal(kMagic.begin(), kMagic.end(), entry.hello.begin()))
      give_up(fmt::format("rank 0: the connection from {} to {} is not a shardplan rank (wrong "
                          "greeting); is another program using this address?",
                          entry.from, where_),
              __LINE__);
    const auto rank = get_be(entry.hello.data() + 4, 4);
    const auto size = get_be(entry.hello.data() + 8, 4);
    if (size != static_cast<std::uint64_t>(world_size_))
      give_up(fmt::format("rank 0: the peer from {} is rank {} of a world of {} ranks, but this "
                          "job has {} (WORLD_SIZE differs between ranks)",
                          entry.from, rank, size, world_size_),
              __LINE__);
    if (rank < 1 || rank >= static_cast<std::uint64_t>(world_size_))
      give_up(fmt::format("rank 0: the peer from {} claims rank {}, outside 1..{}", entry.from,
                          rank, world_size_ - 1),
              __LINE__);
    auto& slot = by_rank_[static_cast<std::size_t>(rank)];
    if (slot.valid())
      give_up(fmt::format("rank 0: the peers from {} and {} both claim rank {}",
                          from_rank_[static_cast<std::size_t>(rank)], entry.from, rank),
              __LINE__);
    slot = std::move(entry.socket);
    from_rank_[static_cast<std::size_t>(rank)] = entry.from;
    return true;
  }

  void accept_waiting() {
    for (;;) {
      sockaddr_storage peer{};
      socklen_t length = sizeof peer;
      const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer), &length,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;  // EAGAIN: no more for now; an aborted connection is simply not a peer
      set_non_blocking_options(fd);
      pending_.push_back({Socket(fd), peer_text(peer, length), {}, 0});
    }
  }

  Socket listener_;
  std::string where_;
  int world_size_;
  int peers_;
  double timeout_s_;
  Clock::time_point deadline_;
  std::vector<Pending> pending_;
  std::vector<Socket> by_rank_;
  std::vector<std::string> from_rank_;
  int connected_ = 0;
};

}  // namespace

void TcpBlobServer::serve(std::span<const std::byte> blob, double timeout_s) {
  // One job per server: stop listening on return.
  Rendezvous rendezvous(Socket(std::exchange(listener_, -1)), endpoint_text(address_, port_),
                        world_size_, timeout_s);
  rendezvous.connect_all();
  rendezvous.deliver(blob);
}

namespace {

// Connects to one of rank 0's addresses; returns 0, or the errno of the failure.
int connect_to(const addrinfo& entry, Clock::time_point deadline, Socket& socket) {
  Socket candidate(::socket(entry.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!candidate.valid()) return errno;
  int error = 0;
  if (::connect(candidate.get(), entry.ai_addr, entry.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      // One unreachable address (say, IPv6) must not use up the time for the next.
      const auto attempt_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      if (!wait_for(candidate.get(), POLLOUT, attempt_deadline)) {
        error = ETIMEDOUT;
      } else {
        socklen_t length = sizeof error;
        if (::getsockopt(candidate.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0)
          error = errno;
      }
    }
  }
  if (error == 0) {
    set_non_blocking_options(candidate.get());
    socket = std::move(candidate);
  }
  return error;
}

// 1. Connect, retrying until the deadline: rank 0 may not be listening yet.
Socket connect_to_rank0(const std::string& address, int port, int rank, double timeout_s,
                        Clock::time_point deadline) {
  Socket socket;
  std::string last_error = "no address";
  auto pause = std::chrono::milliseconds(20);
  while (!socket.valid()) {
    AddressList addresses;
    const int code = resolve(address, port, false, addresses);
    if (code != 0 && code != EAI_AGAIN)
      throw CommError(
          fmt::format("rank {}: cannot resolve \"{}\": {}", rank, address, ::gai_strerror(code)),
          __FILE__, __LINE__);
    if (code == EAI_AGAIN) last_error = ::gai_strerror(code);
    for (const addrinfo* entry = addresses.first; entry != nullptr && !socket.valid();
         entry = entry->ai_next)
      if (const int error = connect_to(*entry, deadline, socket); error != 0)
        last_error = errno_text(error);
    if (socket.valid()) break;
    if (Clock::now() >= deadline)
      throw CommError(fmt::format("rank {}: could not connect to rank 0 at {} within {} (last "
                                  "error: {})",
                                  rank, endpoint_text(address, port), seconds_text(timeout_s),
                                  last_error),
                      __FILE__, __LINE__);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  return socket;
}

// Rank 0's reason after a refusal in place of the release (it gave up while waiting for another
// rank's confirmation).
std::string refusal_reason(int fd, Clock::time_point deadline) {
  std::array<std::byte, kReplyHeaderBytes - 1> size{};
  std::string reason = "another rank failed";
  if (receive_exactly(fd, size.data(), size.size(), deadline).status == Io::done) {
    const auto bytes = std::min(get_be(size.data(), 8), kMaxReplyBytes);
    std::string text(static_cast<std::size_t>(bytes), '\0');
    if (receive_exactly(fd, text.data(), text.size(), deadline).status == Io::done) reason = text;
  }
  return reason;
}

}  // namespace

std::vector<std::byte> tcp_receive_blob(const std::string& address, int port, int rank,
                                        int world_size, double timeout_s) {
  const auto deadline = deadline_after(timeout_s);
  const std::string where = endpoint_text(address, port);
  if (world_size < 2 || rank < 1 || rank >= world_size)
    throw CommError(fmt::format("rank {}: not a peer of a world of {} ranks", rank, world_size),
                    __FILE__, __LINE__);

  Socket socket = connect_to_rank0(address, port, rank, timeout_s, deadline);

  const auto lost = [&](const IoResult& result, const std::string& waiting_for) {
    if (result.status == Io::timed_out)
      return CommError(fmt::format("rank {}: connected to rank 0 at {}, but {} did not arrive "
                                   "within {} (rank 0 sends it once all {} ranks have connected)",
                                   rank, where, waiting_for, seconds_text(timeout_s), world_size),
                       __FILE__, __LINE__);
    return CommError(
        fmt::format("rank {}: rank 0 at {} closed the connection before {} arrived{}", rank, where,
                    waiting_for,
                    result.status == Io::failed ? ": " + errno_text(result.error) : ""),
        __FILE__, __LINE__);
  };

  // 2. Name this rank.
  std::array<std::byte, kHelloBytes> hello{};
  std::copy(kMagic.begin(), kMagic.end(), hello.begin());
  put_u32(hello.data() + 4, static_cast<std::uint32_t>(rank));
  put_u32(hello.data() + 8, static_cast<std::uint32_t>(world_size));
  if (const auto result = send_all(socket.get(), hello.data(), hello.size(), deadline);
      result.status != Io::done)
    throw lost(result, "the greeting's delivery");

  // 3. Receive the blob (or rank 0's reason for refusing the job).
  std::array<std::byte, kReplyHeaderBytes> header{};
  if (const auto result = receive_exactly(socket.get(), header.data(), header.size(), deadline);
      result.status != Io::done)
    throw lost(result, "the id");
  const auto status = std::to_integer<std::uint8_t>(header[0]);
  const auto length = get_be(header.data() + 1, 8);
  if ((status != kStatusBlob && status != kStatusRefusal) || length > kMaxReplyBytes)
    throw CommError(fmt::format("rank {}: {} sent a reply that rank 0 would not send; is another "
                                "program listening there?",
                                rank, where),
                    __FILE__, __LINE__);
  std::vector<std::byte> payload(static_cast<std::size_t>(length));
  if (const auto result = receive_exactly(socket.get(), payload.data(), payload.size(), deadline);
      result.status != Io::done)
    throw lost(result, "the id");
  if (status == kStatusRefusal)
    throw CommError(
        fmt::format("rank {}: rank 0 at {} refused the job: {}", rank, where,
                    std::string(reinterpret_cast<const char*>(payload.data()), payload.size())),
        __FILE__, __LINE__);

  // 4. Confirm, and wait until every rank has.
  if (const auto result = send_all(socket.get(), &kAck, 1, deadline); result.status != Io::done)
    throw lost(result, "the confirmation's delivery");
  std::byte go{};
  if (const auto result = receive_exactly(socket.get(), &go, 1, deadline);
      result.status != Io::done)
    throw lost(result, "the release (every rank holds the id)");
  if (go == std::byte{kStatusRefusal}) {
    // Rank 0 gave up while waiting for another rank's confirmation: its refusal follows.
    throw CommError(fmt::format("rank {}: rank 0 at {} refused the job: {}", rank, where,
                                refusal_reason(socket.get(), deadline)),
                    __FILE__, __LINE__);
  }
  if (go != kGo)
    throw CommError(fmt::format("rank {}: {} sent a reply that rank 0 would not send", rank, where),
                    __FILE__, __LINE__);
  return payload;
}

std::vector<std::byte> tcp_share_blob(const LaunchEnvironment& environment,
                                      std::span<const std::byte> blob, double timeout_s) {
  if (environment.world_size == 1) return {blob.begin(), blob.end()};
  if (environment.rank == 0) {
    TcpBlobServer server(environment.master_addr, environment.exchange_port(),
                         environment.world_size);
    server.serve(blob, timeout_s);
    return {blob.begin(), blob.end()};
  }
  return tcp_receive_blob(environment.master_addr, environment.exchange_port(), environment.rank,
                          environment.world_size, timeout_s);
}

}  // namespace shardplan::comm
