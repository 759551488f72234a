#include "calibrate/collective_bench.hpp"

#include <algorithm>

#include "calibrate/fit.hpp"
#include "calibrate/op_timer.hpp"

namespace shardplan::calibrate {
namespace {

using documents::Collective;
constexpr comm::DataType kType = comm::DataType::f32;  // nccl-tests' default -d float
constexpr float kUnwritten = -1.0f;                    // marks receive elements before the check

// Element ranges [begin, end) of a buffer of `count` floats that the check reads.
std::vector<std::pair<std::size_t, std::size_t>> checked_ranges(std::size_t count,
                                                                std::size_t max_bytes) {
  const std::size_t max_elements = std::max<std::size_t>(2, max_bytes / sizeof(float));
  if (count <= max_elements) return {{0, count}};
  const std::size_t half = max_elements / 2;
  return {{0, half}, {count - half, count}};
}

}  // namespace

CollectiveBench::CollectiveBench(Collective op, comm::Communicator& group,
                                 comm::Communicator& host_world, const SweepPoint& largest,
                                 const BenchSettings& settings)
    : op_(op), group_(group), host_world_(host_world), settings_(settings) {
  for (std::size_t j = 0; j < sums_over_ranks_.size(); ++j)
    for (int r = 0; r < group_.size(); ++r) sums_over_ranks_[j] += fill_value(r, j);
  send_ = group_.allocate(std::max<std::size_t>(1, largest.send_count) * sizeof(float));
  recv_ = group_.allocate(std::max<std::size_t>(1, largest.recv_count) * sizeof(float));
  // The send pattern does not depend on the point, so it is written once for the largest.
  std::vector<float> values(largest.send_count);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = fill_value(group_.rank(), i);
  send_->copy_from_host(values.data(), values.size() * sizeof(float));
  if (op_ == Collective::broadcast && group_.rank() == kRoot) {
    // broadcast works in place on the receive buffer: the root's holds the data.
    recv_->copy_from_host(values.data(), values.size() * sizeof(float));
  }
}

void CollectiveBench::issue(const SweepPoint& p) {
  switch (op_) {
  case Collective::all_reduce:
    group_.all_reduce(send_->data(), recv_->data(), p.count, kType);
    break;
  case Collective::all_gather:
    group_.all_gather(send_->data(), recv_->data(), p.count, kType);
    break;
  case Collective::reduce_scatter:
    group_.reduce_scatter(send_->data(), recv_->data(), p.count, kType);
    break;
  case Collective::broadcast:
    group_.broadcast(recv_->data(), p.count, kType, kRoot);
    break;
  case Collective::reduce:
    group_.reduce(send_->data(), recv_->data(), p.count, kType, kRoot);
    break;
  case Collective::all_to_all:
    group_.all_to_all(send_->data(), recv_->data(), p.count, kType);
    break;
  }
}

float CollectiveBench::expected(const SweepPoint& p, std::size_t i) const {
  const int me = group_.rank();
  // fill_value repeats every 7 elements, and so do its sums over the ranks.
  auto sum_over_ranks = [&](std::size_t index) { return sums_over_ranks_[index % 7]; };
  switch (op_) {
  case Collective::all_reduce:
  case Collective::reduce:
    return sum_over_ranks(i);
  case Collective::all_gather:
    return fill_value(static_cast<int>(i / p.count), i % p.count);
  case Collective::reduce_scatter:
    return sum_over_ranks(static_cast<std::size_t>(me) * p.count + i);
  case Collective::broadcast:
    return fill_value(kRoot, i);
  case Collective::all_to_all:
    // Block q came from rank q, which sent its block `me`.
    return fill_value(static_cast<int>(i / p.count),
                      static_cast<std::size_t>(me) * p.count + i % p.count);
  }
  return 0;
}

std::int64_t CollectiveBench::count_wrong(const SweepPoint& p) {
  const bool receives = !(op_ == Collective::reduce && group_.rank() != kRoot);
  const bool keeps_input = op_ == Collective::broadcast && group_.rank() == kRoot;
  const auto ranges = checked_ranges(p.recv_count, settings_.max_checked_bytes);
  std::vector<float> host;
  if (receives && !keeps_input) {
    for (const auto& [begin, end] : ranges) {
      host.assign(end - begin, kUnwritten);
      recv_->copy_from_host(host.data(), host.size() * sizeof(float), begin * sizeof(float));
    }
  }
  issue(p);
  group_.synchronize();
  std::int64_t wrong = 0;
  if (receives) {
    for (const auto& [begin, end] : ranges) {
      host.resize(end - begin);
      recv_->copy_to_host(host.data(), host.size() * sizeof(float), begin * sizeof(float));
      for (std::size_t i = begin; i < end; ++i)
        if (host[i - begin] != expected(p, i)) ++wrong;
    }
  }
  return wrong;
}

PointResult CollectiveBench::run(const SweepPoint& p) {
  PointResult result;
  result.point = p;
  for (int i = 0; i < settings_.warmup; ++i) issue(p);
  group_.synchronize();
  // The timed runs go in batches, each after a barrier of every rank; a batch's time per call is
  // the slowest rank's, and the median batch is kept.
  const int batches = std::clamp(settings_.batches, 1, settings_.iters);
  std::vector<double> per_call(static_cast<std::size_t>(batches));
  auto timer = make_op_timer(group_);
  for (int b = 0; b < batches; ++b) {
    const int runs = settings_.iters / batches + (b < settings_.iters % batches ? 1 : 0);
    host_world_.barrier();
    timer->start();
    for (int i = 0; i < runs; ++i) issue(p);
    per_call[static_cast<std::size_t>(b)] = timer->stop_seconds() / runs;
  }
  host_world_.all_reduce(per_call.data(), per_call.data(), per_call.size(), comm::DataType::f64,
                         comm::ReduceOp::max);
  result.time_s = median(per_call);

  const double size = static_cast<double>(p.size_bytes);
  result.algbw_GBps = documents::algbw_GBps(size, result.time_s);
  result.busbw_GBps = documents::busbw_GBps(op_, group_.size(), size, result.time_s);
  if (settings_.check) {
    const std::int64_t mine = count_wrong(p);
    host_world_.all_reduce(&mine, &result.wrong, 1, comm::DataType::i64);
  }
  return result;
}

}  // namespace shardplan::calibrate
