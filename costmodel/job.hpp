// The training job document and the cluster: what the user fixes before the planner chooses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/hardware.hpp"

namespace shardplan::costmodel {

// Precision policies (names as on the command line and in documents):
//   fp32        everything fp32 (tf32 GEMMs where the GPU has them)
//   bf16-mixed  bf16 compute with fp32 master weights and fp32 optimizer states
//   fp16-mixed  as bf16-mixed, fp16 compute with dynamic loss scaling
//   bf16        pure bf16: weights, gradients and optimizer states in bf16
enum class Precision { fp32, bf16_mixed, fp16_mixed, bf16 };
enum class Optimizer { adamw, adam, sgd, adafactor };
enum class Checkpointing { none, selective, full };
enum class AttentionImpl { flash, eager };  // fused (no s×s scores kept) or materialized scores

const char* precision_name(Precision p);
const char* optimizer_name(Optimizer o);
const char* checkpointing_name(Checkpointing c);
const char* attention_name(AttentionImpl a);
Precision precision_from_name(const std::string& s, const std::string& where);
Optimizer optimizer_from_name(const std::string& s, const std::string& where);
Checkpointing checkpointing_from_name(const std::string& s, const std::string& where);
AttentionImpl attention_from_name(const std::string& s, const std::string& where);
const std::vector<std::string>& precision_names();
const std::vector<std::string>& optimizer_names();
const std::vector<std::string>& checkpointing_names();

// The dtype GEMMs run in, and its element size, for a policy.
DType compute_dtype(Precision p);

struct TrainingJob {
  std::int64_t seq_len = 4096;      // tokens per sequence
  std::int64_t global_batch = 0;    // sequences per optimizer step, whole job
  std::int64_t micro_batch = 0;     // sequences per GPU per forward/backward; 0 = let the planner choose
  Precision precision = Precision::bf16_mixed;
  Optimizer optimizer = Optimizer::adamw;
  Checkpointing checkpointing = Checkpointing::none;
  AttentionImpl attention = AttentionImpl::flash;
};

struct Cluster {
  int gpus = 0;           // N
  int gpus_per_node = 0;  // G; N must be a multiple of G unless N < G
  int nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
};

// The training-job document ({"schema_version": 1, "seq_len": ..., ...}); throws InputError.
TrainingJob job_from_json(const nlohmann::json& doc);
nlohmann::json job_to_json(const TrainingJob& job);
// Checks the numbers against each other and the cluster; the message says what would work.
void validate_job(const TrainingJob& job, const Cluster& cluster);
void validate_cluster(const Cluster& cluster);

}  // namespace shardplan::costmodel
