#include "costmodel/pipeline_schedule.hpp"
#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardplan::costmodel {

using documents::peak_chunks;
using documents::PipelineSchedule;
using documents::PipeOp;
using documents::PipeOpKind;
using documents::schedule_ops;

namespace {

// End times of each (micro-batch, virtual stage)'s forward and backward; < 0 until run. Entry
// mb·G + g (mb < m, g < G), computed in size_t so that m·G never overflows an int.
struct Ends {
  int G;
  std::vector<double> fwd, bwd;
  Ends(int m, int G_)
      : G(G_), fwd(static_cast<std::size_t>(m) * static_cast<std::size_t>(G_), -1), bwd(fwd) {}
  std::size_t at(int mb, int g) const {
    return static_cast<std::size_t>(mb) * static_cast<std::size_t>(G) + static_cast<std::size_t>(g);
  }
  double& f(int mb, int g) { return fwd[at(mb, g)]; }
  double& b(int mb, int g) { return bwd[at(mb, g)]; }
};

// When op may start as far as the other stages go (< 0: not yet known).
double dependency_ready(Ends& e, const PipeOp& op, int g, int p, double p2p_s) {
  const int G = e.G;
  if (op.kind == PipeOpKind::forward) {
    if (g == 0) return 0;
    const double end = e.f(op.micro_batch, g - 1);
    return end < 0 ? -1 : end + ((g - 1) % p != g % p ? p2p_s : 0);
  }
  if (g == G - 1) return e.f(op.micro_batch, g);
  const double end = e.b(op.micro_batch, g + 1);
  return end < 0 ? -1 : end + ((g + 1) % p != g % p ? p2p_s : 0);
}

}  // namespace

PipelineWalk walk_schedule(PipelineSchedule schedule, int p, int v, int m,
                           const std::vector<double>& forward_s,
                           const std::vector<double>& backward_s, double p2p_s) {
  return walk_ops(schedule_ops(schedule, p, v, m), p, v, m, forward_s, backward_s, p2p_s);
}

PipelineWalk walk_ops(const std::vector<std::vector<PipeOp>>& ops, int p, int v, int m,
                      const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                      double p2p_s) {
  if (static_cast<int>(ops.size()) != p) throw std::logic_error("walk_ops: one op list per stage");
  if (static_cast<int>(forward_s.size()) != p || static_cast<int>(backward_s.size()) != p)
    throw std::logic_error("walk_schedule: one forward and one backward time per stage");
  Ends ends(m, p * v);
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0);
  PipelineWalk w;
  w.busy_s.assign(static_cast<std::size_t>(p), 0);
  // Each stage runs its list in order; an op waits for its stage and its dependency. Sweep the
  // stages until every list is done: each sweep runs at least one op unless the lists deadlock.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < ops[s].size()) {
        const PipeOp& op = ops[s][next[s]];
        const int g = op.chunk * p + s;
        const double ready = dependency_ready(ends, op, g, p, p2p_s);
        if (ready < 0) break;
        const bool fwd = op.kind == PipeOpKind::forward;
        const double dur = (fwd ? forward_s[s] : backward_s[s]) / v;
        const double end = std::max(free_at[s], ready) + dur;
        (fwd ? ends.f(op.micro_batch, g) : ends.b(op.micro_batch, g)) = end;
        free_at[s] = end;
        w.busy_s[s] += dur;
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    if (next[s] != ops[s].size()) throw std::logic_error("walk_schedule: the schedule deadlocks");
  w.end_s = free_at;
  w.span_s = *std::max_element(free_at.begin(), free_at.end());
  const double busiest = *std::max_element(w.busy_s.begin(), w.busy_s.end());
  w.bubble_fraction = busiest > 0 ? (w.span_s - busiest) / busiest : 0;
  for (const int peak : peak_chunks(ops)) {
    w.peak_chunks.push_back(peak);
    w.peak_in_flight.push_back(static_cast<double>(peak) / v);
  }
  return w;
}

}  // namespace shardplan::costmodel
