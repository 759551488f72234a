// The model's attention core timed on one rank with the executor's own kernels, as the executor
// runs them (executor/gpt_model.cpp): the causal attention of `batch` sequences of `seq` tokens,
// forward and backward, between the projections (q, k and v in, the attention output out; rotary
// and the projections are not part of it). A CPU rank runs the host backend's fp32 eager attention
// (attention_forward and attention_backward, probs [B, heads, T, T] and one [T, T] of scratch); a
// GPU rank the CUDA backend's bf16 eager attention and, where the backend supports the head
// dimension, its flash attention. What the cost model reads back as the profile's attention
// samples (documents/hardware.hpp AttentionSample, documents/workload.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "documents/workload.hpp"

namespace shardplan::calibrate {

// The core of `m` over a micro-batch of `tokens` tokens in sequences of `seq`: batch = tokens /
// seq (whole sequences; the caller checks that seq divides tokens), the model's query heads,
// key/value heads and head dimension.
documents::AttentionShape model_attention_shape(const documents::ModelSpec& m, std::int64_t tokens,
                                                std::int64_t seq);

// Forward and backward seconds of each implementation the backend runs, eager first. Each time
// is the median of at least three runs after an untimed one (first touch), as many as fill
// min_seconds (at most 50), bracketed by the backend's part timers (kernels/backend.hpp: wall
// time on the host, CUDA events on the GPU's compute stream). before_each is called before each
// implementation is timed (calibrate: a barrier, so that every rank computes at once).
//
// The host backend's fp32 kernels ("eager", dtype fp32).
std::vector<documents::AttentionSample>
time_cpu_attention(const documents::AttentionShape& shape, double min_seconds = 0.02,
                   const std::function<void()>& before_each = {});

#if defined(SHARDPLAN_HAVE_NCCL)
// The CUDA backend's bf16 kernels on `device` ("eager", and "flash" where supported; dtype bf16),
// in device memory of their own, on the backend's own compute stream.
std::vector<documents::AttentionSample>
time_cuda_attention(int device, const documents::AttentionShape& shape, double min_seconds = 0.02,
                    const std::function<void()>& before_each = {});
#endif

}  // namespace shardplan::calibrate
