// Sharded checkpoints that reshard exactly: a checkpoint saved by any plan on any number of ranks
// loads into any other plan and world size, bit for bit (the semantics of PyTorch's distributed
// checkpoint and DeepSpeed's universal checkpoints: the saved state is described in the model's
// own coordinates, not in the saving layout's, so a loader can pick the ranges it needs).
//
// What is saved: the fp32 parameters (the master copy the engine trains), AdamW's moments
// exp_avg (m) and exp_avg_sq (v), and the step count, which is both AdamW's step (the bias
// corrections) and the training step (the synthetic data stream continues from it). Gradients are
// not saved: the engine frees them after every step. A resumed run with the same plan therefore
// takes exactly the steps an uninterrupted run takes. The seed and learning rate are recorded
// (saved_by) but not checked: a resume may change them, and then its data or steps differ.
//
// Layout of DIR:
//   DIR/index.json                             the metadata index, written last
//   DIR/index.json.sha256                      its sha256, one line as sha256sum writes it
//   DIR/step-00000004/part-00001-of-00004.bin  shard rank 1's ranges, raw little-endian fp32
//   DIR/step-00000004/index.json (and .sha256) a copy of step 4's index (paths relative to DIR):
//                                              what marks the folder as this format's
//   DIR/.lock                                  held by the executor writing DIR
//   (checkpoint_lock.hpp)
// Part s of S holds, for each state tensor in the order params, exp_avg, exp_avg_sq and each unit
// in model order, the elements [s·chunk, min((s+1)·chunk, n)) of the unit's flat unpadded
// parameter order (shard_layout.hpp), padding never saved. Every rank holds at least that range of
// every tensor whatever the strategy (its chunk when sharded, everything otherwise), so one rule
// serves DDP, ZeRO-1/2/3, FSDP and HSDP; replicated state (DDP, ZeRO-1/2 parameters, HSDP's other
// replicas) is written once, split across the ranks of the first shard group rather than all by
// rank 0. index.json lists, per file, its size, its sha256 and its segments (tensor, unit, element
// range, byte offset, and the sha256 of the line "shardplan.checkpoint segment TENSOR UNIT BEGIN
// END\n" followed by the range's bytes, so that a range's bytes match only the label they were
// saved under), with the model's shape, the step and the plan that saved it:
//
//   {"schema_version": 2, "kind": "shardplan.checkpoint", "step": 2, "adamw_step": 2,
//    "byte_order": "little", "dtypes": {"params": "f32", "exp_avg": "f32", "exp_avg_sq": "f32"},
//    "saved_by": {"strategy": "zero3", "flavour": "deepspeed", "world_size": 4, ...},
//    "model": {"name": ..., "hidden": 32, ..., "units": [{"kind": "embedding", "elements": 8192},
//              ...], "tensors": {"embedding": [{"name": "embed_tokens.weight", "offset": 0,
//              "shape": [256, 32]}], "block": [...], "head": [...]}},
//    "files": [..., {"path": "step-00000002/part-00001-of-00004.bin", "bytes": 123360,
//                    "sha256": "71aeb754...", "segments": [{"tensor": "params", "unit": 0,
//                    "begin": 2048, "end": 4096, "offset_bytes": 0, "sha256": "9c0e..."},
//                    {"tensor": "params", "unit": 1, "begin": 3088, "end": 6176,
//                    "offset_bytes": 8192, "sha256": "4b1a..."}, ...]}, ...]}
// Version 1 (no index digest, no segment digests) is refused: its index could be edited unseen.
//
// Writes are atomic (core/atomic_file.hpp): each file goes to a temporary beside it, is fsynced and
// renamed, then its folder fsynced;
// ranks write their parts, agree, then rank 0 writes the step folder's copy of the index and then
// DIR's index the same way (the index and its digest both synced before either is renamed), so a
// reader sees the old checkpoint or the new one, never a mixture (a save cut short between
// renaming DIR's index and its digest leaves an index that is its step folder's copy, which a load
// takes for saved when that copy's own digest matches). Once the new index is in place, the
// folders of older steps go: only those whose own copy of the index names them, only the files
// that copy names (then the copy, then the folder if it is empty); never through a symbolic link,
// never a newer step. A step folder that is a symbolic link is refused. Saving the same step again
// into the same DIR rewrites that step's parts in place.
//
// A run (RunCommand, RunCheckpoints) checks its --save DIR before its first step: it makes DIR,
// locks it (a second executor is refused naming the holder), and refuses a DIR that holds the
// checkpoint of another model or plan, or of a step later than the first it saves, or an index it
// cannot read, unless --overwrite or it resumes from DIR.
//
// Loading verifies everything before it trusts anything: the index's digest (or, as above, its
// step folder's copy and that copy's digest), then the index
// strictly (unknown or missing keys, segments that do not tile every tensor, a step past
// kMaxCheckpointStep), the model's shape against the run's, every file's size; each file's sha256
// and its segments' are checked by one rank (file k by rank k mod N, so the job reads each file
// once for them); then each rank reads, with positioned reads, only the saved ranges that overlap
// what it holds. Any failure is an InputError naming the file (exit code 2), raised on every rank
// alike. The digests detect changes and damage; they are no signature: whoever can write DIR can
// write a consistent checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "executor/checkpoint_lock.hpp"
#include "executor/engine.hpp"

namespace shardplan::executor {

// The last step an index may hold: with a job's global batch of at most 1e9 sequences
// (documents/job.cpp) and runs of at most 1e5 steps (command_line.cpp), the engine's sequence
// numbers, step × global batch, stay below 2^63.
inline constexpr std::int64_t kMaxCheckpointStep = 1'000'000'000;

// The run's checkpoint options (command_line.hpp).
struct CheckpointOptions {
  std::string save_dir;  // empty: no checkpoint is written
  std::int64_t save_every =
      0;                   // also after every step that is a multiple of this (0: only the end)
  bool overwrite = false;  // save over another run's checkpoint in save_dir
  std::string resume_dir;  // empty: start from the initial parameters
};

struct CheckpointSegment {
  std::string tensor;      // "params", "exp_avg" or "exp_avg_sq"
  std::int64_t unit = 0;   // 0 the embedding, 1..L the blocks, L + 1 the head
  std::int64_t begin = 0;  // elements [begin, end) of the unit's flat unpadded order
  std::int64_t end = 0;
  std::int64_t offset_bytes = 0;  // where the range starts in the file
  std::string sha256;  // of its label line and its bytes (above), 64 lowercase hex digits
};

struct CheckpointFile {
  std::string path;  // relative to the checkpoint folder
  std::int64_t bytes = 0;
  std::string sha256;  // of the whole file, 64 lowercase hex digits
  std::vector<CheckpointSegment> segments;
};

// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct CheckpointIndex {    // NOLINT(bugprone-exception-escape)
  std::int64_t step = 0;    // optimizer steps done (AdamW's step and the training step)
  nlohmann::json model;     // the model's shape, as model_shape_json writes it
  nlohmann::json saved_by;  // the plan that saved it (strategy, flavour, world_size, ...)
  std::vector<std::int64_t> unit_elements;
  std::vector<CheckpointFile> files;
};

// Reads DIR/index.json strictly, after checking it against DIR/index.json.sha256; a file, segment
// or field that is wrong, missing or inconsistent is an InputError naming DIR/index.json and the
// JSON pointer. Does not open the parts.
CheckpointIndex read_checkpoint_index(const std::string& dir);
// The same for an index already in memory (errors name the JSON pointer only).
CheckpointIndex checkpoint_index_from_json(const nlohmann::json& doc);
// Checks one part's size, sha256 and segments' sha256s against the index (InputError naming the
// part, and the tensor and range of a segment that does not match).
void verify_checkpoint_file(const std::string& dir, const CheckpointFile& file);
// The shape the index records and a resume compares: the model's dimensions, its units' sizes
// and each unit kind's tensors with their offsets and shapes.
nlohmann::json model_shape_json(const GptLayout& layout);

// Collective over `world`, the engine's world: writes the checkpoint of the engine's state after
// its last step into `dir`.
void save_checkpoint(ShardingEngine& engine, comm::Communicator& world, const std::string& dir);

struct LoadReport {
  std::int64_t step = 0;        // the engine continues with step + 1
  std::int64_t bytes_read = 0;  // by this rank, of its ranges (the checksum pass not counted)
};
// Collective over `world`: replaces the engine's parameters, moments and step with the
// checkpoint's, whatever plan and world size saved it.
LoadReport load_checkpoint(ShardingEngine& engine, comm::Communicator& world,
                           const std::string& dir);

struct Consolidated {
  std::int64_t step = 0;
  std::int64_t params = 0;  // elements written
  std::string sha256;       // of the written file
};
// Not collective: verifies the checkpoint and writes the full fp32 parameters in model order
// (every unit's flat buffer, unpadded, concatenated; little-endian), atomically, to `out` (like
// DeepSpeed's zero_to_fp32.py). The same bytes params_sha256 hashes.
Consolidated consolidate_checkpoint(const std::string& dir, const std::string& out);

// Collective over each shard group: the sha256 of the engine's consolidated fp32 parameters, the
// bytes consolidate_checkpoint would write for a checkpoint of this state.
std::string params_sha256(ShardingEngine& engine);

// The steps a run of `steps` steps after step `first` saves: every multiple of `every` (0: none)
// and the last.
std::vector<std::int64_t> saved_steps(std::int64_t first, std::int64_t steps, std::int64_t every);

// Not collective; before a run's first step, with DIR locked: whether the run may save `steps`
// (ascending) into o.save_dir. An InputError naming the step folder when one of those steps'
// folders is a symbolic link or not a folder; naming --save and what DIR holds (model, step)
// when it holds the checkpoint of another model or plan, of a step later than steps.front(), or
// an index that does not read, unless o.overwrite or o.resume_dir is DIR.
void check_save_destination(const CheckpointOptions& o, const ShardingEngine& engine,
                            const std::vector<std::int64_t>& steps);

// A run's checkpoint duties (run_command.cpp), collective over the run's world: resume before
// the first step, save every K steps and after the last, and the parameter hashes the run
// document reports (initial_params_sha256, final_params_sha256).
class RunCheckpoints {
public:
  // steps: the steps the run takes.
  RunCheckpoints(CheckpointOptions options, comm::Communicator& world, std::int64_t steps);
  // Before the first step: locks and checks the folder to save into (rank 0), loads the
  // checkpoint to resume from, then hashes the parameters.
  void start(ShardingEngine& engine);
  // After each step: saves when due; after the last, saves and hashes the final parameters.
  void after_step(ShardingEngine& engine, bool last);
  // Adds the hashes at the top level, and execution.resumed_from and execution.saved.
  void report(nlohmann::json& run_document) const;

private:
  CheckpointOptions options_;
  comm::Communicator& world_;
  std::int64_t steps_ = 0;
  CheckpointLock lock_;  // of options_.save_dir, on rank 0, for the whole run
  std::string initial_sha256_, final_sha256_;
  std::optional<std::int64_t> resumed_step_;
  std::vector<std::int64_t> saved_steps_;
};

}  // namespace shardplan::executor
