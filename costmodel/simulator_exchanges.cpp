// The step walk's exchanges beside a block's compute (simulation.hpp): tensor parallelism's
// collectives of the activations and the ring of context parallelism.
#include <algorithm>
#include <utility>
#include <vector>

#include "costmodel/compute_time.hpp"
#include "costmodel/simulation.hpp"
#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"

namespace shardplan::costmodel::step_walk {

using documents::Category;
using documents::Collective;

void Simulation::block_exchanges(int u, double st, bool backward, int mb) {
  const bool block = u > 0 && u < n_units_ - 1;
  const auto& ui = info(u);
  // The pass's seconds of a kind (the backward's: the unit's less its forward's).
  auto seconds = [&](ComputeKind k) {
    const auto i = static_cast<int>(k);
    return backward ? ui.kinds[i] - ui.fwd_kinds[i] : ui.fwd_kinds[i];
  };
  const double dur = backward ? ui.bwd_s : ui.fwd_s;
  if (context_ > 1 && block)
    ring_exchange(u, st, dur, seconds(ComputeKind::attention), backward,
                  backward ? Phase::backward : Phase::forward, mb);
  if (tensor_ > 1)
    tensor_exchange(u, st, dur, seconds(ComputeKind::gemm),
                    backward ? TpPass::backward : TpPass::forward);
}

void Simulation::gradient_copies(int u, double end, int mb) {
  const auto& s = spec_;
  const auto& ui = info(u);
  const int U = n_units_;
  if (split_views() && u < U - 1) {
    // The unit's flat gradient out of its views' (the root's at the embeddings', the last of
    // its views to get one), both alive at once, then the views' gone.
    const double flat = (u == 0 && s.root_unit ? ui.params + info(U - 1).params : ui.params);
    mem(end, flat * compute_b_, Category::gradients, Phase::backward, u, mb);
    mem(end, -flat * compute_b_, Category::gradients, Phase::backward, u, mb);
  }
  if (s.shard_gradients && ui.grads > ui.params) {
    // FSDP2 takes a gradient placed otherwise than its parameter (torch's row-wise table's,
    // whole) by redistributing it to the parameter's placement: a copy of the rank's share
    // (torch/distributed/tensor/placement_types.py, _replicate_to_shard: clone=True), beside the
    // whole one until .grad drops it.
    mem(end, ui.params * compute_b_, Category::gradients, Phase::backward, u, mb);
    mem(end, -ui.grads * compute_b_, Category::gradients, Phase::backward, u, mb);
  }
}

void Simulation::ring_exchange(int u, double start, double unit_s, double attention_s,
                               bool backward, Phase phase, int mb) {
  const double held = backward ? ring_.backward_bytes : ring_.forward_bytes;
  const double keys = backward ? ring_.backward_gathered_sent : ring_.forward_gathered_sent;
  const double grads = (backward ? ring_.backward_sent : ring_.forward_sent) - keys;
  // Costed as the collectives that send the same bytes per rank: the keys' and values' gather
  // (a ring all-gather is c − 1 steps of the chunk), or their passes, and the gradients' passes
  // (all-to-all).
  const double per_size = static_cast<double>(context_) / (context_ - 1);
  double dur = coll(ring_.keys_passed ? Collective::all_to_all : Collective::all_gather,
                    context_group_, keys * per_size);
  if (grads > 0) dur += coll(Collective::all_to_all, context_group_, grads * per_size);
  // The exchange runs beside the attention, which needs what it brings: the unit waits for it
  // past the attention's end (the attention taken last in the unit).
  const double overlap = ring_.overlapped ? attention_s : 0.0;
  const double at =
      issue(Stream::context, start + unit_s - overlap, Stream::compute, dur, "ring exchange", u);
  issue(Stream::compute, at + dur, Stream::context, 0.0, "wait for the ring", u);
  mem(start, held, Category::buffers, phase, u, mb);
  mem(start + unit_s, -held, Category::buffers, phase, u, mb);
}

// Megatron-LM's pattern (Shoeybi et al. 2019, §3), as Megatron-core's layers and torch's
// parallel styles run it, on the [T, h] activation unless said:
//   a block     two all-reduces in the forward (after the attention's and the MLP's row-parallel
//               linears) and two in the backward (the column-parallel linears' input gradients);
//               under sequence parallelism (Korthikanti et al. 2022, §4.2.2) each an all-gather
//               and a reduce-scatter. A selective rerun stops after the MLP's first linear: both
//               all-gathers and the attention's reduce-scatter, or the attention's all-reduce.
//   embeddings  a vocabulary-parallel (row-wise) table's partial output reduced: all-reduced, or
//               reduce-scattered over the sequence, whose gradient is all-gathered back; none for
//               transformers' unplanned, replicated table
//   head        the column-parallel projection's input all-gathered under sequence parallelism,
//               its gradient all-reduced (reduce-scattered) back; transformers' colwise_rep also
//               all-gathers the logits [T, V] for the model's own loss. (The vocabulary-parallel
//               losses' all-reduces of per-token scalars are left out.)
std::vector<Simulation::TpCollective> Simulation::tensor_collectives(int u, TpPass pass) const {
  const double x = tp_buffer_bytes_;
  const bool sp = sequence_parallel_;
  const bool backward = pass == TpPass::backward;
  std::vector<TpCollective> out;
  if (u == 0) {
    const bool planned = !torch_styles() || documents::recipe_traits(in_.job.recipe).tp_embedding !=
                                                documents::TpEmbedding::unplanned;
    if (planned && !backward)
      out.push_back({sp ? Collective::reduce_scatter : Collective::all_reduce, x, 1});
    if (planned && backward && sp) out.push_back({Collective::all_gather, x, 1});
    return out;
  }
  if (u == n_units_ - 1) {
    const bool gathered_logits =
        torch_styles() &&
        documents::recipe_traits(in_.job.recipe).tp_loss == documents::TpLoss::gathered;
    if (!backward && sp) out.push_back({Collective::all_gather, x, 1});
    if (!backward && gathered_logits)
      out.push_back(
          {Collective::all_gather,
           x / static_cast<double>(in_.model->hidden) * static_cast<double>(in_.model->vocab), 1});
    if (backward) out.push_back({sp ? Collective::reduce_scatter : Collective::all_reduce, x, 1});
    return out;
  }
  const bool rerun = pass == TpPass::selective_rerun;
  if (sp) return {{Collective::all_gather, x, 2}, {Collective::reduce_scatter, x, rerun ? 1 : 2}};
  return {{Collective::all_reduce, x, rerun ? 1 : 2}};
}

double Simulation::tensor_sent(int u, TpPass pass) {
  double sent = 0;
  for (const auto& c : tensor_collectives(u, pass))
    sent += c.count * comm_.cost(c.op, tensor_group_, c.bytes).bytes_sent;
  return sent;
}

void Simulation::tensor_exchange(int u, double start, double unit_s, double gemm_s, TpPass pass) {
  double dur = 0;
  for (const auto& c : tensor_collectives(u, pass))
    for (int k = 0; k < c.count; ++k) dur += coll(c.op, tensor_group_, c.bytes);
  if (dur <= 0) return;
  // Blocking: after the unit's kernels, the compute stream waiting. Async: beside its GEMMs.
  const double overlap = async_tp_ ? std::min(dur, gemm_s) : 0.0;
  const double at = issue(Stream::tensor, start + unit_s - overlap, Stream::compute, dur,
                          "tensor-parallel collectives", u);
  issue(Stream::compute, at + dur, Stream::tensor, 0.0, "wait for tensor parallel", u);
}

}  // namespace shardplan::costmodel::step_walk
