#include "documents/state_bytes.hpp"

namespace shardplan::documents {

StateBytes state_bytes(Precision p, const ShardingSpec& spec) {
  StateBytes b;
  const bool mixed = p == Precision::bf16_mixed || p == Precision::fp16_mixed;
  const double low = dtype_bytes(compute_dtype(p));  // 2 for bf16/fp16, 4 for fp32 (tf32)
  b.compute = low;
  b.moment = p == Precision::bf16 ? 2 : 4;
  if (!mixed) {  // fp32 or pure bf16: one copy of everything in one dtype
    b.param = b.grad = low;
    return b;
  }
  if (spec.main_grad_buffer) {
    // Megatron-core: 16-bit parameters, the main gradients in the reduce dtype's buffer (fp32
    // unless --grad-reduce-in-bf16), an fp32 main parameter the optimizer steps, whose gradient
    // is the buffer's own view (no cast): 2 + 4 + 12 bytes per parameter with Adam, the
    // distributed optimizer sharding the 12 (megatron/training/theoretical_memory_usage.py).
    b.param = low;
    b.grad = dtype_bytes(spec.grad_accum_dtype.value_or(spec.reduce_dtype));
    b.master = 4;
    // DeepSpeed's BF16_Optimizer (its buffer kept beside the .grad) casts a 16-bit buffer's
    // partition to fp32 for the step (bf16_optimizer.py, step); an fp32 one is stepped as is.
    if (spec.low_grads_kept && b.grad < 4) b.step_grad = 4;
  } else if (spec.separate_fp32_master) {
    // DeepSpeed: bf16/fp16 parameter partition + fp32 master partition; gradients accumulate in
    // the low-precision partition and the optimizer step casts a partition to fp32.
    b.param = low;
    b.grad = low;
    b.master = 4;
    b.step_grad = 4;
  } else {
    // PyTorch DDP under autocast and FSDP MixedPrecision: parameters (sharded or not) stay fp32
    // and are themselves the master copy; gradients end in fp32.
    b.param = 4;
    b.grad = 4;
    // FSDP without a param_dtype (Composer's FULL) gathers the fp32 parameters, and autograd
    // makes their gradients in fp32.
    if (spec.fp32_gathered) b.compute = 4;
  }
  return b;
}

}  // namespace shardplan::documents
