// The stream-order checker: a happens-before graph of the work queued on a rank's streams (the
// compute stream, each group's collective stream, and the host), built from what the engine says
// (reads and writes of memory ranges, waits between streams, host synchronizations, allocations,
// record_use and frees), checked as it is built. No GPU and no thread is needed: the streams are
// the CUDA semantics the engine is written against (kernels/backend.hpp), not threads.
//
// Each stream keeps a vector clock (Lamport 1978; Fidge 1988): entry t is how much of stream t's
// work is known to come before the stream's next operation. An operation on stream s ticks s's own
// entry and is stamped (s, clock[s][s]). An earlier operation (t, e) is ordered before a later one
// on s when clock[s][t] >= e.
//   wait(w, p)        an event recorded on p, waited for on w (cudaStreamWaitEvent): clock[w] joins
//                     clock[p].
//   host_waits(s)     the host blocks until s is idle (cudaStreamSynchronize): clock[host] joins
//                     clock[s].
//   any operation     is queued by the host, so it comes after everything the host already waited
//                     for: clock[s] joins clock[host] first.
// Memory (PyTorch's caching allocator, c10/cuda/CUDACachingAllocator.cpp, and
// Tensor.record_stream):
//   allocated(p, n, s)  a block handed out for stream s; its first use is an operation of s (the
//                       allocator made s wait for the block's previous users), so every other
//                       stream must be ordered after the allocation before it touches the block.
//   record_use(p, s)    stream s uses the block too: its free fences s as well.
//   freed(p)            one event on each stream that used the block (the allocating one and the
//                       recorded ones); every access must be ordered before one of those events,
//                       else a later owner of the memory may be overwritten by, or overwrite, work
//                       still queued. An access to a freed block is a use after free.
// A conflict is two accesses of overlapping bytes on different streams, at least one a write,
// that are not ordered. Each finding is one line naming both operations, their streams and the
// block.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardplan::executor {

class StreamOrderChecker {
public:
  using Stream = const void*;  // an opaque identity; kHost is the host thread
  static constexpr Stream kHost = nullptr;

  // Names a stream in findings ("compute", "reduce", ...). Unnamed streams print as "stream N".
  void name_stream(Stream s, std::string name);

  // ---- ordering
  void wait(Stream waiter, Stream producer);
  void host_waits(Stream s);

  // ---- memory
  void allocated(const void* p, std::int64_t bytes, Stream s, std::string label);
  void record_use(const void* p, Stream s);
  void freed(const void* p);
  // An operation `what` on stream s that reads or writes [p, p + bytes). bytes < 0: from p to the
  // end of the block that holds p (a kernel whose extent the call does not say, e.g. the rows of
  // an embedding table a lookup reads). Memory outside every block the checker was told about is
  // not checked (the communicators' own buffers, the host's vectors).
  void read(Stream s, const void* p, std::int64_t bytes, const char* what);
  void write(Stream s, const void* p, std::int64_t bytes, const char* what);

  const std::vector<std::string>& findings() const { return findings_; }
  // Findings are kept up to this many (a race in a loop would repeat), then only counted.
  static constexpr std::size_t kMaxFindings = 20;
  std::int64_t finding_count() const { return finding_count_; }
  std::int64_t accesses_checked() const { return accesses_; }

private:
  using Clock = std::vector<std::uint64_t>;  // indexed by stream index
  struct Access {
    int stream;
    std::uint64_t epoch;
    std::int64_t begin, end;  // byte offsets in the block
    bool write;
    const char* what;
  };
  struct Block {
    std::int64_t bytes;
    std::string label;
    int alloc_stream;
    std::vector<int> users;  // streams a free fences (the allocating one first)
    std::vector<Access> history;
    bool freed = false;
  };

  int index_of(Stream s);
  Clock& clock(int i);
  std::uint64_t tick(int s);  // host-joins, then ticks; returns the operation's epoch
  bool ordered(const Access& earlier, const Clock& later) const;
  void access(Stream s, const void* p, std::int64_t bytes, bool write, const char* what);
  void report(std::string line);
  std::string stream_name(int i) const;
  // The block holding p (live or freed), or nullptr; `base` gets its address.
  Block* block_of(const void* p, const char** base);

  std::vector<Stream> streams_;            // index -> identity
  std::unordered_map<Stream, int> index_;  // identity -> index
  std::vector<std::string> names_;         // index -> name ("" when unnamed)
  std::vector<Clock> clocks_;              // index -> vector clock
  std::map<const char*, Block> blocks_;    // by base address; freed blocks stay (quarantine)
  std::vector<std::string> findings_;
  std::int64_t finding_count_ = 0;
  std::int64_t accesses_ = 0;
};

}  // namespace shardplan::executor
