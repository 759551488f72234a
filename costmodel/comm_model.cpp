#include "costmodel/comm_model.hpp"
#include "documents/collectives.hpp"
#include "documents/hardware.hpp"

#include <algorithm>
#include <cmath>

namespace shardplan::costmodel {

using documents::Collective;
using documents::CollectiveCurve;
using documents::traits;
namespace {

double ceil_log2(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n))); }

}  // namespace

CollectiveCost CommModel::datasheet_cost(Collective op, const Group& g, double size) const {
  CollectiveCost c;
  const int n = g.ranks;
  if (n <= 1 || size <= 0) return c;
  const auto& t = traits(op);
  c.bytes_sent = size * t.bus_factor(n);
  const int nodes = g.nodes();
  // Bus bandwidth of a ring: the slowest hop. Inside a node that is the GPU's NVLink/PCIe
  // bandwidth; a ring crossing nodes runs one channel per NIC, so the node's ranks of this group
  // share ranks_per_node NICs: busbw = min(intra, ranks_per_node × NIC bandwidth per GPU).
  const double intra = hw_->intra_bandwidth_Bps;
  const double busbw = nodes > 1 ? std::min(intra, std::min(g.ranks_per_node, hw_->gpus_per_node) *
                                                       hw_->inter_bandwidth_Bps)
                                 : intra;
  const double hop = nodes > 1 ? hw_->inter_latency_s : hw_->intra_latency_s;
  // Ring steps: all-reduce 2(n−1) (reduce-scatter then all-gather), the others n−1; broadcast and
  // reduce are pipelined chains of n−1 hops.
  const double ring_steps =
      op == Collective::all_reduce ? 2.0 * (n - 1) : static_cast<double>(n - 1);
  double seconds = ring_steps * hop + c.bytes_sent / busbw;
  if (op == Collective::all_reduce) {
    // NCCL's tree all-reduce: latency of a reduce and a broadcast down a tree, log2 depth inside
    // and across nodes; same bandwidth term at large sizes. NCCL picks the faster algorithm.
    const double tree_latency =
        2.0 * (ceil_log2(std::min(n, g.ranks_per_node)) * hw_->intra_latency_s +
               ceil_log2(nodes) * hw_->inter_latency_s);
    seconds = std::min(seconds, tree_latency + c.bytes_sent / busbw);
  }
  c.seconds = seconds;
  return c;
}

CollectiveCost CommModel::cost(Collective op, const Group& g, double size) const {
  if (g.ranks <= 1 || size <= 0) return {};
  if (!hw_->calibration) return datasheet_cost(op, g, size);
  // Measured curves of this operation and tier, bracketing the group size.
  const CollectiveCurve* below = nullptr;
  const CollectiveCurve* above = nullptr;
  for (const auto& curve : hw_->calibration->collectives) {
    if (curve.op != op || curve.tier != g.tier()) continue;
    if (curve.ranks <= g.ranks && (!below || curve.ranks > below->ranks)) below = &curve;
    if (curve.ranks >= g.ranks && (!above || curve.ranks < above->ranks)) above = &curve;
  }
  if (!below && !above) return datasheet_cost(op, g, size);
  const auto& t = traits(op);
  CollectiveCost c;
  c.calibrated = true;
  c.bytes_sent = size * t.bus_factor(g.ranks);
  // Interpolate the bus bandwidth (the quantity nccl-tests shows to be nearly flat in n) and the
  // latency linearly in the group size; beyond the measured sizes use the nearest curve.
  auto at = [&](const CollectiveCurve& curve) {
    const double secs = curve.time_s(size);
    const double latency = curve.time_s(0.0);
    const double busbw = size * t.bus_factor(curve.ranks) / std::max(secs - latency, 1e-12);
    return std::pair{latency, busbw};
  };
  const CollectiveCurve* lo = below ? below : above;
  const CollectiveCurve* hi = above ? above : below;
  c.extrapolated = !below || !above;
  const auto [lat_lo, bw_lo] = at(*lo);
  const auto [lat_hi, bw_hi] = at(*hi);
  const double w = hi->ranks == lo->ranks
                       ? 0.0
                       : static_cast<double>(g.ranks - lo->ranks) / (hi->ranks - lo->ranks);
  const double latency = lat_lo + w * (lat_hi - lat_lo);
  const double busbw = bw_lo + w * (bw_hi - bw_lo);
  c.seconds = latency + c.bytes_sent / std::max(busbw, 1.0);
  return c;
}

}  // namespace shardplan::costmodel
