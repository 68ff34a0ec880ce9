// The Job's precision (precision.h) as the cost terms see it. A graph profiled in float32 and
// trained in bf16 or fp16 is priced as the executor runs it (docs/training_step.md "Precision"):
//
//   compute          every node's measured times (forward, backward, at every batch, split by
//                    tensor parallelism) divided by the device's compute_speedup for the dtype
//                    (Cluster device.compute_speedup; measured by calibrate, the profiled
//                    matmuls in each dtype): InputError naming the cluster when it is missing
//   activations      the bytes a node keeps, its output, backward workspace, recompute's kept
//                    outputs, the edges (pipeline messages: the executor sends a stage's
//                    floating outputs in the dtype), tensor-parallel collectives and the model
//                    input at the dtype's bytes (x 2 / 4); but see "kept for backward"
//   kept for backward  (saved_bytes and the loss's backward peak) depend on the plan's policy
//                    (precision_policy, as executor/precision.py of_plan decides it):
//                    kFsdp (FSDP2's MixedPrecisionPolicy: the parameters themselves in the
//                    dtype, so every activation is) halves them as above; kAutocast
//                    (torch.autocast, fp32 parameters) takes what the profile recorded under
//                    autocast in the dtype (Node::autocast_saved_bytes, its weight copies as
//                    fixed_saved_bytes, profiled.autocast_loss_backward_bytes): layer norm
//                    keeps its fp32 input there and cross-entropy runs in fp32, so halving
//                    priced bf16 dp 18-22 % low (benchmarks/precision-2026-12-06.md). A node
//                    or a graph without the recording is halved, an estimate that
//                    memory_model() names.
//   parameters       param_bytes at the dtype's bytes: what the compute reads and FSDP2
//                    all-gathers (param_dtype); memory_cost.h's mixed-precision state adds the
//                    fp32 master copy and fp32 optimizer state (r = 4 / 2)
//   gradients        reduced in float32 (reduce_dtype=fp32; under autocast the parameters and so
//                    their gradients are fp32): gradient_reduce_ratio = 4 / the dtype's bytes on
//                    the all-reduce, the reduce-scatter and the tied copies' sum
//
// A graph profiled in a 16-bit dtype is already at the dtype's bytes and times: nothing is
// converted (the older "mixed_precision" jobs on Megatron-LM's fp16 graphs), and its gradients
// are priced at the graph's dtype as before. fp32 prices the graph as profiled.
#pragma once

#include "planner/documents/plan.h"
#include "planner/documents/problem.h"

namespace hybridplan {

// True when the job's 16-bit precision converts a float32 graph (above).
bool converts_graph(const Problem& problem);

// How the executor runs a plan's 16-bit precision (executor/precision.py of_plan; the rule is
// held to the Python one by tests/python/test_autocast_memory.py): FSDP2's MixedPrecisionPolicy
// for a sharded placement plan (zero2, zero3, HSDP), torch.autocast for every other plan
// (DDP, placement, tensor parallelism, pipelines, a pipeline's zero2 included).
enum class PrecisionPolicy { kAutocast, kFsdp };
PrecisionPolicy precision_policy(const Plan& plan);

// The problem the cost terms read: `problem` itself where nothing converts, else a copy whose
// graph is at the precision's times and bytes (profiled.dtype the 16-bit dtype), its kept
// bytes as `policy` keeps them (above). InputError naming `source` (cluster) when the device
// has no compute_speedup for the dtype.
Problem in_job_precision(const Problem& problem, const std::string& source = "cluster",
                         PrecisionPolicy policy = PrecisionPolicy::kAutocast);

// Whether the graph records what autocast keeps in the job's precision (any node, or the
// loss): where not, autocast plans' kept bytes are the halving's estimate.
bool records_autocast(const Problem& problem);

// How the kept bytes of a plan under `policy` are priced, for explain (Prediction
// memory_model); empty where the graph is not converted.
std::string memory_model(const Problem& problem, PrecisionPolicy policy);

// Bytes a gradient reduction moves per byte of converted parameters: 4 / 2 where the graph was
// converted, 1 otherwise.
double gradient_reduce_ratio(const Problem& problem);

// The device's compute_speedup for a 16-bit precision; nullopt where not given.
std::optional<double> compute_speedup(const Cluster& cluster, Precision precision);

}  // namespace hybridplan
