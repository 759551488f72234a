// torchtitan's op-level selective checkpointing (its SelectiveAC) on a block's own ops: which
// linears the block calls in which order, which of them the policy keeps and which it reruns, and
// what one block keeps on one rank. block_table.hpp's checkpointing rule (rank_block) and the
// recompute's time (compute_time.cpp, block_recompute) read it.
#pragma once

#include <vector>

#include "costmodel/accounting.hpp"
#include "costmodel/block_linears.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::costmodel {

// Whether torchtitan's save list is derived for the block's own code: torchtitan's block (whose
// save list is measured on it) and transformers' Llama-family blocks (Llama, Mistral, Qwen2); not
// GPT-2's Conv1D, GPT-NeoX or MPT.
bool selective_op_derived(const documents::ModelSpec& m, const documents::TrainingJob& j);

// torchtitan's SelectiveAC (torchtitan 0.3.0, torchtitan/distributed/activation_checkpoint.py,
// SelectiveAC._wrap_block's policy): the block's input is kept, and inside the block the outputs
// of the ops in its save list (torch's compute-intensive ops, aten::mm and aten::addmm among them,
// and the attention kernels), except every second aten::mm it counts (mm_count), which is
// recomputed with everything else before the block's backward; addmm is saved and not counted.
// For each of block_matmuls whether it is rerun: the even-counted mm.
std::vector<bool> selective_op_reruns(const std::vector<Matmul>& mms);

// What torchtitan's op-level selective checkpointing keeps of one block on one rank of t
// tensor-parallel ranks (t = 1: the whole block); sp: t under sequence parallelism, else 1.
double selective_op_saved(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f, double t, double sp);

}  // namespace shardplan::costmodel
