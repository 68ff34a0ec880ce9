// Graph: the profiled dataflow graph of one model (kind "hybridplan.graph"). Times are for
// `profiled.batch_size` samples on one device; a node may also carry its times at other batch
// sizes (batch_times), from which compute_cost.h takes its time at any batch.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/documents/cluster.h"  // Collective
#include "planner/documents/precision.h"

namespace hybridplan {

using Json = nlohmann::json;
using NodeId = int64_t;     // a node's id as written in the JSON (unique, any order)
using NodeIndex = int32_t;  // a node's position in Graph::nodes (dense, 0..n-1)

// A node's measured times at one batch size other than the profiled one.
struct BatchTime {
  int64_t batch_size = 1;
  double forward_s = 0;
  double backward_s = 0;
};

// How tensor parallelism splits a node (docs/tensor_parallel.md "In the graph"): the executor's
// DTensor style. JSON names: "colwise", "rowwise", "sharded", "vocab_rowwise", "colwise_gather".
enum class TpStyle { kColwise, kRowwise, kSharded, kVocabRowwise, kColwiseGather };
const char* tp_style_name(TpStyle style);
std::optional<TpStyle> tp_style_from_name(const std::string& name);
// A collective's JSON name in a graph: "all_reduce", "all_gather", "reduce_scatter".
const char* tp_collective_name(Collective op);
std::optional<Collective> tp_collective_from_name(const std::string& name);

// The collective a split node needs after its forward or backward: the full tensor's bytes at
// the profiled batch (compute_cost.h scales them to the (micro-)batch).
struct TpCollective {
  Collective op = Collective::kAllReduce;
  int64_t bytes = 0;
  // JSON "fixed_bytes" (optional, absent = false, written only when true): `bytes` do not scale
  // with the batch (a parameter gradient's all-reduce, as sequence parallelism's per-token nodes
  // with parameters run one).
  bool fixed_bytes = false;
};

// A node's forward and backward at the profiled batch as one rank of a split of `degree` runs it.
struct TpSplitTime {
  int64_t degree = 2;
  double forward_s = 0;
  double backward_s = 0;
};

// Node::tensor_parallel: how the node splits over a plan's `tp` devices.
struct TensorParallel {
  TpStyle style = TpStyle::kColwise;
  // the node splits under a plan's tp that divides it, else runs whole (tensor_parallel_cost.h
  // tp_split_mask)
  int64_t max_degree = 1;
  int64_t split_param_bytes = 0;  // of param_bytes, the bytes divided among the TP ranks
  bool activation_split = false;  // the bytes kept for backward divide by tp
  std::optional<TpCollective> forward_collective;
  std::optional<TpCollective> backward_collective;
  // Degrees >= 2, strictly increasing, each dividing max_degree; empty: none measured.
  std::vector<TpSplitTime> split_times;
};

// How sequence parallelism (Megatron-LM's, Korthikanti et al. 2022, arXiv 2205.05198;
// docs/tensor_parallel.md "Sequence parallelism") treats a node: JSON names "per_token",
// "gather", "colwise", "rowwise".
//   per_token  runs on each TP rank's 1/t of the tokens (a norm, a dropout between the TP
//              regions): its time and kept activations shrink
//   gather     runs whole on the gathered sequence (torch's MultiheadAttention node): unchanged
//              but for its collectives
//   colwise,   a TP-split node (tensor_parallel) at the SP region's edge: its TP collectives are
//   rowwise    replaced by the SP ones (colwise: all-gather its input, reduce-scatter its input
//              gradient; rowwise: reduce-scatter its output, all-gather its output gradient)
enum class SpRole { kPerToken, kGather, kColwise, kRowwise };
const char* sp_role_name(SpRole role);
std::optional<SpRole> sp_role_from_name(const std::string& name);

// Node::sequence_parallel: what the node does under a plan with sequence parallelism on.
struct SequenceParallel {
  SpRole role = SpRole::kPerToken;
  // >= 2: sequence parallelism at degree tp needs tp to divide it (the sequence length's
  // divisor the profiler found)
  int64_t max_degree = 2;
  // The collectives the node runs on its TP group under sequence parallelism, after its forward
  // or backward, each with the full tensor's bytes at the profiled batch (as TpCollective).
  std::vector<TpCollective> forward_collectives;
  std::vector<TpCollective> backward_collectives;
  // per_token only: the node's forward and backward at the profiled batch as one rank of `degree`
  // runs it (1/degree of the tokens); degrees >= 2, strictly increasing, dividing max_degree.
  std::vector<TpSplitTime> split_times;
  // gather only (optional): the node's kept activations under sequence parallelism over those it
  // keeps in one process, as the profiler measured by running it both ways (its sequence inputs
  // all-gathered apart become distinct tensors: nn.MultiheadAttention then projects and keeps
  // query, key and value apart where one process passes x once); > 0. memory_cost.h multiplies
  // the node's activations by it under sequence parallelism.
  std::optional<double> saved_share;
};

// Bytes a float32 graph's profile measured again under torch.autocast, one count per 16-bit
// dtype (JSON an object {"bf16": n, "fp16": n}, each key optional; docs/formats.md). -1 = not
// measured (the cost model then halves the float32 bytes, precision_cost.h).
struct AutocastBytes {
  int64_t bf16 = -1;
  int64_t fp16 = -1;
  // The count for a 16-bit precision; -1 where not measured, and for fp32.
  int64_t of(Precision precision) const {
    return precision == Precision::kBf16 ? bf16 : precision == Precision::kFp16 ? fp16 : -1;
  }
  bool any() const { return bf16 >= 0 || fp16 >= 0; }
};

struct Node {
  NodeId id = 0;
  std::string name;  // module qualified name for profiled graphs ("features.3")
  std::string op;    // "conv2d", "linear", "lstm", ...
  double forward_s = 0;
  double backward_s = 0;
  int64_t param_bytes = 0;
  int64_t output_bytes = 0;
  // Optional (-1 = not measured): bytes the node keeps for its backward pass at the profiled
  // batch (its saved tensors, each storage counted once in the step); memory_cost.h uses it in
  // place of output_bytes. activation_bytes() reads either.
  int64_t saved_bytes = -1;
  double flops = 0;  // optional in JSON (forward FLOPs at the profiled batch)
  // Optional (-1 = not counted): how many parameter tensors param_bytes is made of; the
  // optimizer pays a fixed cost per tensor (optimizer_cost.h, Cluster runtime.optimizer_tensor_s).
  int64_t param_tensors = -1;

  int64_t activation_bytes() const { return saved_bytes >= 0 ? saved_bytes : output_bytes; }
  // Optional (JSON "autocast_saved_bytes", with saved_bytes; float32 graphs only): what the node
  // keeps for its backward at the profiled batch when its forward (and the loss, for the last
  // node) runs under torch.autocast in each 16-bit dtype, counted as saved_bytes is, the weight
  // copies below left out. Layer norm keeps its float32 input there, cross-entropy its float32
  // log-softmax: not half of saved_bytes (docs/precision.md).
  AutocastBytes autocast_saved_bytes;
  // Optional (JSON "autocast_weight_copy_bytes", with autocast_saved_bytes): the 16-bit copies
  // of parameters that autocast casts once a step and the node's matrix products save for the
  // backward. They do not grow with the batch (compute_cost.h kept_bytes adds them unscaled).
  AutocastBytes autocast_weight_copy_bytes;
  // Not in JSON: bytes the node keeps for its backward that do not scale with the batch, beside
  // activation_bytes(). 0 in a graph as read; precision_cost.h in_job_precision sets it to the
  // autocast weight copies of the job's dtype for the plans the executor autocasts.
  int64_t fixed_saved_bytes = 0;
  // Optional (-1 = not measured): bytes the node's backward needs above what is held when it
  // starts, at the profiled batch, on a step that adds to existing gradients (its output's
  // gradient, its inputs', its parameters' before autograd adds them into .grad, and the
  // kernels' own scratch); memory_cost.h backward_workspace_bytes reads it.
  int64_t backward_workspace_bytes = -1;
  // Optional (-1 = not measured): the share (0..1) of the node's backward that is its weight
  // gradient under the zero-bubble split (executor/split_backward.py), measured by splitting the
  // node's backward alone; compute_cost.h split_backward reads it.
  double weight_backward_fraction = -1;
  // Optional (-1 = not measured): seconds the zero-bubble split (I then W) takes beyond the
  // node's plain backward, measured alongside weight_backward_fraction; the split's bookkeeping,
  // which does not grow with the batch. compute_cost.h split_backward reads it.
  double split_backward_extra_s = -1;
  // Optional (-1 = not measured): bytes of the gradients that split's I records for W at the
  // profiled batch (each storage once): an LSTM's gate gradients of every step, 18 times its
  // output. Held from a micro-batch's I to its W; absent, the memory model takes output_bytes.
  int64_t split_held_bytes = -1;
  // Optional (-1 = not measured; both or neither): selective recompute (docs/recompute.md)
  // keeps selective_saved_bytes at the profiled batch (the outputs of the ops it saves: matrix
  // products, convolutions, attention) besides the node's inputs, and runs
  // selective_recompute_fraction (0..1) of the node's forward time again before its backward.
  int64_t selective_saved_bytes = -1;
  double selective_recompute_fraction = -1;
  // Optional (-1 = not counted): the aten ops the node's forward dispatches; selective
  // recompute's dispatch mode costs Cluster runtime.selective_op_s per op (evaluate.h).
  int64_t selective_ops = -1;
  bool has_selective() const { return selective_saved_bytes >= 0; }
  // Optional (JSON "compile_speedup": {"forward": f, "backward": b}; -1 = not measured): the
  // node's forward and backward eager time over its time compiled by torch.compile (one graph
  // per block, `hybridplan calibrate --model`; docs/calibration.md). A Job with "compile"
  // divides the node's times by them (Evaluator); absent, the node is priced eager.
  double compile_forward_speedup = -1;
  double compile_backward_speedup = -1;
  bool has_compile_speedup() const { return compile_forward_speedup > 0; }
  // Optional: times at other batch sizes, batch_size strictly increasing, never the profiled one
  // (that is forward_s/backward_s). Empty: only the profiled batch was measured.
  std::vector<BatchTime> batch_times;
  // Optional, default true: false when a pipeline stage may not begin at this node (the
  // executor's splitter cannot place a split point before it).
  bool cut_before = true;
  // Optional (JSON "tensor_parallel"; absent: the node runs whole on every rank of its TP group).
  std::optional<TensorParallel> tensor_parallel;
  // Optional (JSON "sequence_parallel"; absent: sequence parallelism leaves the node as tensor
  // parallelism has it).
  std::optional<SequenceParallel> sequence_parallel;
};

struct Edge {
  NodeIndex src = 0;  // indices into Graph::nodes (JSON uses ids)
  NodeIndex dst = 0;
  int64_t bytes = 0;  // defaults to nodes[src].output_bytes
};

// The bytes of one element of a graph's dtype (ProfiledAt::dtype: torch's names without
// "torch.", e.g. "float32", "bfloat16"; or "<bits>-bit"); nullopt for a name it does not know.
std::optional<int64_t> dtype_bytes(const std::string& dtype);

struct ProfiledAt {
  std::string device = "unknown";
  int64_t batch_size = 1;
  std::string dtype = "float32";
  int64_t input_bytes = 0;  // the model's input tensors at batch_size (JSON optional; 0 = unknown)
  // Peak bytes the loss's backward allocates down to the gradient of the model's output, at
  // batch_size (JSON optional; 0 = not profiled with a loss). memory_cost.h.
  int64_t loss_backward_bytes = 0;
  // The same with the loss run under torch.autocast in each 16-bit dtype (JSON optional,
  // "autocast_loss_backward_bytes": {"bf16": n, "fp16": n}; float32 graphs with a loss only):
  // autocast runs cross-entropy in float32, so its backward holds float32 logits-sized tensors.
  AutocastBytes autocast_loss_backward_bytes;
  // The smallest batch the model's forward accepts in training (JSON optional, default 1; the
  // profiler finds it by trying: BatchNorm needs 2 samples per channel). No device is given a
  // (micro-)batch below it: the search skips such points and Plan::validate_fit refuses them.
  int64_t min_batch_size = 1;
};

// A parameter several nodes hold (tied weights, e.g. GPT-2's wte and lm_head). Its bytes are in
// the param_bytes of nodes[0] (the first in execution order) only; in a pipeline every stage
// holding one of the nodes holds a copy (memory_cost.h, evaluate.h).
struct TiedParams {
  std::vector<NodeIndex> nodes;  // indices into Graph::nodes (JSON: ids), at least two
  int64_t bytes = 0;
};

// Whether the model can be cut into pipeline stages at all (found at profile time).
struct PipelineSplit {
  bool supported = true;
  std::string reason;  // why not, naming the module and the cause
};

struct Graph {
  std::string name;
  ProfiledAt profiled;
  PipelineSplit pipeline_split;  // JSON "pipeline_split"; absent = supported
  std::vector<TiedParams> tied_params;  // JSON "tied_params"; absent = none
  std::vector<Node> nodes;
  std::vector<Edge> edges;

  // Derived once by graph_from_json / finalize(): adjacency and a topological order.
  std::vector<std::vector<NodeIndex>> preds;  // preds[v] = sources of edges into v
  std::vector<std::vector<NodeIndex>> succs;
  std::vector<std::vector<int32_t>> in_edges;   // edge indices into v
  std::vector<std::vector<int32_t>> out_edges;  // edge indices out of v
  std::vector<NodeIndex> topo_order;            // deterministic (Kahn, smallest index first)

  // Whether any node carries tensor_parallel (a plan with tp > 1 needs one).
  bool has_tensor_parallel() const;
  // Whether any node carries sequence_parallel (a plan with sequence_parallel needs one).
  bool has_sequence_parallel() const;

  // Checks every field and the DAG property; throws InputError naming `source` and the JSON path.
  void validate(const std::string& source) const;
  // Rebuilds the derived members from nodes/edges (call after building a Graph in code).
  void finalize(const std::string& source = "graph");
};

// Kahn's algorithm over `succs` (a node is ready once all its `preds` are taken). Among ready
// nodes, `runs_later(a, b)` true means b is taken before a (std::priority_queue's comparator).
// Returns fewer than succs.size() nodes when the edges contain a cycle.
template <typename RunsLater>
std::vector<NodeIndex> kahn_order(const std::vector<std::vector<NodeIndex>>& succs,
                                  const std::vector<std::vector<NodeIndex>>& preds,
                                  RunsLater runs_later) {
  const size_t n = succs.size();
  std::priority_queue<NodeIndex, std::vector<NodeIndex>, RunsLater> ready(runs_later);
  std::vector<int32_t> waiting(n);
  for (size_t v = 0; v < n; ++v) {
    waiting[v] = static_cast<int32_t>(preds[v].size());
    if (waiting[v] == 0) ready.push(static_cast<NodeIndex>(v));
  }
  std::vector<NodeIndex> order;
  order.reserve(n);
  while (!ready.empty()) {
    const NodeIndex v = ready.top();
    ready.pop();
    order.push_back(v);
    for (NodeIndex w : succs[v]) {
      if (--waiting[w] == 0) ready.push(w);
    }
  }
  return order;
}

Graph graph_from_json(const Json& j, const std::string& source);
Json graph_to_json(const Graph& g);  // canonical: what sha256 is taken over
Graph load_graph(const std::string& path);
void save_graph(const Graph& g, const std::string& path);  // atomic (tmp file + rename)
std::string graph_sha256(const Graph& g);  // hex sha256 of graph_to_json(g).dump()

}  // namespace hybridplan
