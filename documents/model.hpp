// The model document: a Hugging Face config.json (or a preset naming one under examples/models/),
// or a bare parameter count. From it: exact parameter counts per tensor, per unit and in total.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardplan::documents {

enum class Architecture {
  llama,
  mistral,
  qwen2,
  gpt2,
  gpt_neox,
  mpt,
  // Mixtures of experts (documents/model_moe.cpp); what of their step is not modeled:
  // moe_unplanned.
  mixtral,
  qwen2_moe,
  qwen3_moe,
  olmoe,
  uniform
};
enum class MlpKind { gelu, swiglu };
enum class NormKind { layernorm, rmsnorm };
// learned: a positions table; rotary: q and k rotated; alibi: a per-head bias on the scores (MPT);
// none: no position signal beyond the causal mask (MPT without learned_pos_emb, ALiBi or rope).
enum class PositionKind { learned, rotary, alibi, none };
// Norms on q and k inside the attention: over their whole widths (MPT's attn_config.qk_ln) or per
// head (qk_gn).
enum class QkNorm { none, width, head };
// The MLP's activation as transformers runs it (transformers/activations.py, ACT2CLS): names that
// run the same ops share a value, since what autograd saves follows the ops, not the name.
enum class Activation {
  silu,        // "silu", "swish": F.silu
  gelu,        // "gelu": F.gelu (exact, erf)
  gelu_tanh,   // "gelu_pytorch_tanh": F.gelu(approximate="tanh")
  gelu_new,    // "gelu_new", "gelu_python_tanh", "gelu_accurate": the tanh formula in ops
  gelu_fast,   // "gelu_fast": the tanh formula with x·x instead of pow
  gelu_erf,    // "gelu_python": the erf formula in ops
  gelu_10,     // "gelu_10": F.gelu then clip to [-10, 10]
  quick_gelu,  // "quick_gelu": x·sigmoid(1.702·x)
  relu,        // "relu": nn.ReLU
  identity     // "linear"
};

const char* architecture_name(Architecture a);  // the HF class name ("LlamaForCausalLM")

struct Tensor {
  std::string name;       // HF-style name inside its unit ("self_attn.q_proj.weight")
  std::int64_t rows = 1;  // out features (1 for vectors); of each expert where experts > 1
  std::int64_t cols = 1;  // in features
  // The routed experts one fused tensor stacks, [experts, rows, cols] (transformers 5.23's
  // mlp.experts.gate_up_proj and down_proj); 1 for any other tensor.
  std::int64_t experts = 1;
  std::int64_t elements() const { return experts * rows * cols; }
  bool is_matrix() const { return rows > 1 && cols > 1; }
};

// One sharding unit's tensors: the embeddings, one transformer block, or the head.
struct UnitTensors {
  std::vector<Tensor> tensors;
  std::int64_t params() const;
  // The dense linears' weights: each takes part in a GEMM per token, and autocast casts it (not
  // the routed experts', whose grouped GEMM autocast leaves in the weights' dtype).
  std::int64_t matmul_params() const;
  std::int64_t matrices() const;  // its linear layers' weights (tensors of two dimensions)
};

// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct ModelSpec {   // NOLINT(bugprone-exception-escape)
  std::string name;  // preset name or file path or "params:7.5e9"
  Architecture architecture = Architecture::llama;
  std::int64_t hidden = 0;         // h
  std::int64_t layers = 0;         // L, transformer blocks
  std::int64_t heads = 0;          // a, query heads
  std::int64_t kv_heads = 0;       // grouped-query attention: key/value heads
  std::int64_t head_dim = 0;       // per head; q width = heads * head_dim
  std::int64_t intermediate = 0;   // MLP inner width
  std::int64_t vocab = 0;          // V
  std::int64_t max_positions = 0;  // context length the positions table (or rope) was built for
  MlpKind mlp = MlpKind::swiglu;
  Activation activation = Activation::silu;  // of the MLP (SwiGLU: of its gate)
  NormKind norm = NormKind::rmsnorm;
  PositionKind positions = PositionKind::rotary;
  bool tied_embeddings = false;     // the head reuses the token embedding matrix
  bool parallel_residual = false;   // GPT-NeoX: attention and MLP read the same input
  bool attention_dropout = false;   // dropout on the attention probabilities (mask kept)
  bool residual_dropout = false;    // dropout after attention and MLP outputs (mask kept)
  bool embedding_dropout = false;   // dropout on the embeddings' output (GPT-2's embd_pdrop)
  std::int64_t rotary_dim = 0;      // rotated width of each head (GPT-NeoX: rotary_pct of it)
  std::int64_t sliding_window = 0;  // Mistral: tokens each query attends to (0: whole prefix)
  QkNorm qk_norm = QkNorm::none;    // norms on q and k (MPT's qk_ln, qk_gn)
  bool clip_qkv = false;            // q, k and v clamped before use (MPT's clip_qkv)
  // q and k rotated in place by flash-attn's rotary kernel, k beside v in one stacked tensor
  // (MPT's rope_impl dail); otherwise by ops that make new tensors (rope_impl hf, transformers').
  bool rope_in_place = false;
  // The model's own attention kernel where its config chooses it (MPT's attn_config.attn_impl:
  // "flash" or "torch"); empty where the job chooses.
  std::string config_attention;
  // A switch of the config the cost model has not measured what its code keeps for, as
  // "attn_config.qk_ln" (llm-foundry's MPT; the other readers refuse such keys outright); empty
  // when none.
  std::string unmeasured;

  // A mixture-of-experts MLP in every block (experts > 0): each token is routed to top_k of
  // `experts` SwiGLU experts of width `expert_intermediate` by a router [experts, h], beside a
  // shared expert of width `shared_intermediate` (0: none) whose output a sigmoid gate [1, h]
  // scales where `shared_gate`.
  struct Experts {
    std::int64_t experts = 0;
    std::int64_t top_k = 0;
    std::int64_t expert_intermediate = 0;
    std::int64_t shared_intermediate = 0;
    bool shared_gate = false;
    bool normalize_top_k = false;  // the k routing weights renormalized to sum to 1
    double aux_loss_coef = 0;      // the load-balancing loss's weight when it is computed, else 0
    bool router_jitter = false;    // the router's input multiplied by noise in training
    // The routing weights the experts' rows are multiplied by stay in the softmax's fp32
    // (Mixtral); elsewhere the top-k weights are cast back to the router logits' dtype.
    bool fp32_routing_weights = false;
    // The GEMMs reading the sparse MLP's input beside the experts' gather: the router, and a
    // shared expert's gate and up projections and its sigmoid gate.
    int input_gemms() const {
      return 1 + (shared_intermediate > 0 ? 2 : 0) + (shared_gate ? 1 : 0);
    }
  } moe;

  UnitTensors embedding;     // token (and position) embeddings
  UnitTensors block;         // one transformer block; all blocks are identical
  UnitTensors head;          // final norm and, when untied, the output projection
  nlohmann::json hf_config;  // the config.json it was read from (null for a bare count)

  std::int64_t total_params() const;
  // What one token's forward uses: every parameter but the routed experts it is not sent to.
  std::int64_t active_params() const;
  std::int64_t q_width() const { return heads * head_dim; }
  std::int64_t kv_width() const { return kv_heads * head_dim; }
};

// Names of the presets shipped under examples/models/ (each a folder with a config.json).
std::vector<std::string> preset_model_names();
// Folder holding examples/ and hardware_profiles/ and where it was found: $SHARDPLAN_DATA_DIR, the
// installed <prefix>/share/shardplan beside the program, or the source tree a build tree was
// configured from.
enum class DataDirOrigin { environment, installed, source_tree };
struct DataDir {
  std::string path;
  DataDirOrigin origin = DataDirOrigin::source_tree;
};
DataDir find_data_dir();
std::string data_dir();  // find_data_dir().path

// What the cost model has not measured of a mixture of experts' step under `j` ("" for a dense
// model, or where it has): checked where a job meets its model (planner's make_scenario, plan
// documents).
struct TrainingJob;
std::string moe_unplanned(const ModelSpec& m, const TrainingJob& j);

// A preset name or a path to a config.json. Throws InputError.
ModelSpec load_model(const std::string& name_or_path);
// Parses an HF config.json already in memory; `source` names it in errors.
ModelSpec model_from_hf_config(const nlohmann::json& config, const std::string& name);
// A bare parameter count: `layers` uniform blocks (0: chosen from the count with the usual
// aspect ratio h ≈ 128·L) carrying all parameters, no embeddings. For the textbook cases.
ModelSpec model_from_param_count(double params, std::int64_t layers = 0);

nlohmann::json model_to_json(const ModelSpec& m);  // the per-unit parameter table

// Forward FLOPs per token. Matmuls: 2 FLOPs per weight element and token; attention:
// 4·s·(heads·head_dim) per token for QKᵀ and attention×V (Narayanan et al. 2021, §5.1: 24Bsh² +
// 4Bs²h per layer, the second term over B·s tokens). Backward is 2× forward.
double block_forward_flops_per_token(const ModelSpec& m, std::int64_t seq_len);
double head_forward_flops_per_token(const ModelSpec& m);
// Of the block's forward FLOPs, the attention core that selective checkpointing recomputes.
double attention_core_flops_per_token(const ModelSpec& m, std::int64_t seq_len);

}  // namespace shardplan::documents
