#include "documents/pipeline_order.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardplan::documents {
namespace {

std::vector<PipeOp> one_f_one_b(int p, int s, int m) {
  std::vector<PipeOp> ops;
  const int warmup = std::min(p - s - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({PipeOpKind::forward, f, 0});
  for (; f < m; ++f, ++b) {
    ops.push_back({PipeOpKind::forward, f, 0});
    ops.push_back({PipeOpKind::backward, b, 0});
  }
  for (; b < m; ++b) ops.push_back({PipeOpKind::backward, b, 0});
  return ops;
}

std::vector<PipeOp> gpipe(int m) {
  std::vector<PipeOp> ops;
  ops.reserve(2 * static_cast<std::size_t>(m));  // m forwards, m backwards
  for (int f = 0; f < m; ++f) ops.push_back({PipeOpKind::forward, f, 0});
  for (int b = 0; b < m; ++b) ops.push_back({PipeOpKind::backward, b, 0});
  return ops;
}

// Megatron's get_model_chunk_id and microbatch order: the k-th forward (backward) of a stage
// works on chunk (k mod p·v) / p (backward: v − 1 − that) and micro-batch
// (k / (p·v))·p + k mod p.
PipeOp interleaved_op(PipeOpKind kind, int k, int p, int v) {
  const int in_group = k % (p * v);
  int chunk = in_group / p;
  if (kind == PipeOpKind::backward) chunk = v - 1 - chunk;
  return {kind, (k / (p * v)) * p + k % p, chunk};
}

std::vector<PipeOp> interleaved(int p, int s, int v, int m) {
  const int total = m * v;
  const int warmup = m == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
  std::vector<PipeOp> ops;
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back(interleaved_op(PipeOpKind::forward, f, p, v));
  for (; f < total; ++f, ++b) {
    ops.push_back(interleaved_op(PipeOpKind::forward, f, p, v));
    ops.push_back(interleaved_op(PipeOpKind::backward, b, p, v));
  }
  for (; b < total; ++b) ops.push_back(interleaved_op(PipeOpKind::backward, b, p, v));
  return ops;
}

}  // namespace

std::vector<std::vector<PipeOp>> schedule_ops(PipelineSchedule schedule, int p, int v, int m) {
  if (p < 1 || v < 1 || m < 1) throw std::logic_error("schedule_ops: degrees must be >= 1");
  if (schedule != PipelineSchedule::interleaved_1f1b && v != 1)
    throw std::logic_error("schedule_ops: virtual stages need the interleaved schedule");
  if (schedule == PipelineSchedule::interleaved_1f1b && m % p != 0)
    throw std::logic_error("schedule_ops: interleaved needs m a multiple of p");
  std::vector<std::vector<PipeOp>> ops(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    switch (schedule) {
    case PipelineSchedule::one_f_one_b:
      ops[s] = one_f_one_b(p, s, m);
      break;
    case PipelineSchedule::gpipe:
      ops[s] = gpipe(m);
      break;
    case PipelineSchedule::interleaved_1f1b:
      ops[s] = interleaved(p, s, v, m);
      break;
    }
  }
  return ops;
}

double peak_held(const std::vector<PipeOp>& stage_ops, const std::vector<double>& bytes) {
  double alive = 0, most = 0;
  for (const PipeOp& op : stage_ops) {
    const double b = bytes.at(static_cast<std::size_t>(op.chunk));
    alive += op.kind == PipeOpKind::forward ? b : -b;
    most = std::max(most, alive);
  }
  return most;
}

std::vector<int> peak_chunks(const std::vector<std::vector<PipeOp>>& ops) {
  std::vector<int> peaks;
  peaks.reserve(ops.size());
  for (const auto& stage : ops) {
    int chunks = 0;
    for (const PipeOp& op : stage) chunks = std::max(chunks, op.chunk + 1);
    peaks.push_back(static_cast<int>(
        peak_held(stage, std::vector<double>(static_cast<std::size_t>(chunks), 1.0))));
  }
  return peaks;
}

}  // namespace shardplan::documents
