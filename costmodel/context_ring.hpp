// Ring attention on one context-parallel rank: what a block's attention holds beside the saved
// activations while it runs, and what it sends, as each framework's implementation does it.
// T = s·b/c tokens of the rank, e bytes of the compute dtype, kv = kv_heads·head_dim,
// q = heads·head_dim, a = heads, c ranks in the ring.
//
//   torch (hf, torchtitan): torch.distributed.tensor.experimental context parallelism, which
//     torchtitan 0.3.0 applies to SDPA (distributed/context_parallel/api.py) with torch 2.15's
//     defaults (_context_parallel/_attention.py: rotate_method ALL_GATHER, convert_to_f32,
//     load balance). Forward: the local K and V concatenated (2·e·T·kv) and all-gathered once
//     (c·2·e·T·kv), the merged output and log-sum-exp accumulated in fp32 (4·T·(q + a)).
//     Backward: the same gather, fp32 accumulators for dQ, dK, dV (4·T·(q + 2·kv)), and dK, dV
//     passed around the ring in fp32 with all-to-all (the one sent and the one arriving,
//     2·8·T·kv). Sent: (c − 1)·2·e·T·kv per gather; c passes of 8·T·kv in the backward.
//     With rotate_method ALL_TO_ALL (_AllToAllRotater) the keys and values go to the next rank at
//     each of the c steps instead (permute_tensor): the chunk in use, its concatenated copy being
//     sent and the one arriving, 3·2·e·T·kv at most (2 with c = 2), in the forward and beside the
//     backward's accumulators; the same bytes sent, as c − 1 passes.
//   Transformer Engine's p2p ring (megatron, deepspeed, llm-foundry; AttnFuncWithCPAndKVP2P):
//     the K and V chunk in use and the one arriving (2·2·e·T·kv) in the forward; in the backward
//     those and dK, dV in use and arriving (another 2·2·e·T·kv). Sent: (c − 1)·2·e·T·kv in the
//     forward, twice that in the backward.
//   executor (executor/context_parallel.hpp, context_parallel_block.cpp): its K and V chunk
//     passed hop by hop, each exchange waited for (not overlapped); the backward passes K, V and
//     their gradients, and dK, dV take one more hop home after the last block. What it holds is
//     counted in its block's backward transient (costmodel's executor accounting), none here.
//     Sent: (c − 1)·2·e·T·kv in the forward, (2·(c − 1) + 1)·2·e·T·kv in the backward.
// Derived from the sources named; not measured: torch's context parallelism maps only the
// flash, efficient and cuDNN SDPA ops to its ring (_attention.py's handler table), and a CPU rank's
// SDPA runs _scaled_dot_product_flash_attention_for_cpu, so its ring does not run on CPU ranks.
#pragma once

#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"

namespace shardplan::costmodel {

struct RingAttention {
  double forward_bytes = 0;   // held while a block's forward attention runs
  double backward_bytes = 0;  // held while its backward runs
  double forward_sent = 0;    // bytes one rank sends in a block's forward (and each recompute)
  double backward_sent = 0;   // in its backward
  double forward_gathered_sent = 0;   // of forward_sent, the keys' and values' exchange
  double backward_gathered_sent = 0;  // of backward_sent, the keys' and values' exchange (the
                                      // rest passes their gradients)
  bool keys_passed = false;           // the keys' exchange is passes, not one all-gather
  bool overlapped = true;             // beside the attention that needs it (else waited for)
};

// rank_job: this rank's share of each sequence (seq_len / c). Zero for c = 1. t: tensor-parallel
// ranks, each running the ring over its a/t heads (every term above scales with the heads).
// rotate: torch's way round (its all-to-all rotation below).
RingAttention ring_attention(const documents::ModelSpec& m, const documents::TrainingJob& rank_job,
                             int c, int t = 1,
                             documents::CpRotate rotate = documents::CpRotate::all_gather);

}  // namespace shardplan::costmodel
