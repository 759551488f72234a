// Measuring one collective on one group across a sweep, as nccl-tests does for one size:
// warm-up runs, a barrier of every rank (all groups of the split run at once, as they do in
// training), `iters` timed runs, then one checked run on freshly marked buffers. The time of a
// size is the slowest rank's average per call (nccl-tests' -a 3; its default -a 1 averages the
// ranks instead); algbw and busbw follow nccl-tests through the collectives' traits table
// (documents/collectives.hpp). Unlike nccl-tests, the timed runs are split into a few batches, each
// started by a barrier, and the median batch is kept: on a shared machine one preempted run would
// otherwise decide the time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "calibrate/sweep.hpp"
#include "comm/communicator.hpp"
#include "documents/collectives.hpp"

namespace shardplan::calibrate {

struct BenchSettings {
  int warmup = 5;
  int iters = 20;
  int batches = 5;  // the iters are timed in this many batches (at most iters)
  bool check = true;
  // Checked elements per buffer at most: larger buffers are checked at their first and last halves
  // of this many bytes.
  std::size_t max_checked_bytes = 64u << 20;
};

struct PointResult {
  SweepPoint point;
  double time_s = 0;      // per call, slowest rank
  double algbw_GBps = 0;  // size / time, GB = 1e9
  double busbw_GBps = 0;  // algbw × the collective's bus factor for the group size
  std::int64_t wrong =
      -1;  // elements that differ from the expected result, over all ranks; -1 unchecked
};

class CollectiveBench {
public:
  // Allocates buffers for the largest point. Not collective.
  CollectiveBench(documents::Collective op, comm::Communicator& group,
                  comm::Communicator& host_world, const SweepPoint& largest,
                  const BenchSettings& settings);
  // Collective over host_world: every rank calls it with the same point index.
  PointResult run(const SweepPoint& point);

  static constexpr int kRoot = 0;  // broadcast and reduce root, as nccl-tests' default -r 0

private:
  void issue(const SweepPoint& point);
  std::int64_t count_wrong(const SweepPoint& point);
  float expected(const SweepPoint& point, std::size_t index) const;

  documents::Collective op_;
  comm::Communicator& group_;
  comm::Communicator& host_world_;
  BenchSettings settings_;
  std::unique_ptr<comm::CommBuffer> send_;
  std::unique_ptr<comm::CommBuffer> recv_;
  std::array<float, 7> sums_over_ranks_{};  // Σ over ranks of fill_value(r, j), j = index mod 7
};

// Element i of group rank r's send buffer: small integers whose sums stay exact in float for
// millions of ranks, shifted by rank so that a misplaced block shows.
inline float fill_value(int rank, std::size_t index) {
  return static_cast<float>((static_cast<std::size_t>(rank) + index) % 7 + 1);
}

}  // namespace shardplan::calibrate
