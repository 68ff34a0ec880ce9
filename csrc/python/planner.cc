// evaluate, search and explain over JSON texts. A Problem is rebuilt from canonical texts on each
// call: parsing a few hundred nodes costs microseconds next to a search.
#include <optional>
#include <tuple>
#include <string>

#include <pybind11/stl.h>

#include "planner/costs/evaluate.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/reports/explain.h"
#include "planner/run/convergence.h"
#include "planner/run/run_phases.h"
#include "planner/searches/search.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hybridplan::python {

Problem make_problem(const std::string& graph_text, const std::string& cluster_text,
                     const std::optional<std::string>& job_text) {
  Problem problem;
  problem.graph = with_source("graph", [&] {
    return graph_from_json(parse_json_text(graph_text, "graph"), "graph");
  });
  problem.cluster = with_source("cluster", [&] {
    return cluster_from_json(parse_json_text(cluster_text, "cluster"), "cluster");
  });
  problem.job = job_text ? with_source("job", [&] {
    return job_from_json(parse_json_text(*job_text, "job"), "job");
  }) : default_job();
  return problem;
}

namespace {

std::string evaluate_plan(const std::string& graph_text, const std::string& cluster_text,
                          const std::optional<std::string>& job_text,
                          const std::string& plan_text, const std::string& plan_source) {
  const Problem problem = make_problem(graph_text, cluster_text, job_text);
  return with_source(plan_source, [&] {
    Plan plan = plan_from_json(parse_json_text(plan_text, plan_source), plan_source);
    align_assignment_to_graph(plan, problem.graph, plan_source);
    plan.validate(plan_source, problem.graph, problem.cluster);
    const Prediction prediction = evaluate(problem, plan);
    // The keys of a plan's "predicted" object, so evaluate() and a searched plan compare key by
    // key, plus the objective search minimises.
    Json out = prediction_to_json(prediction);
    out["objective"] = objective(problem, prediction);
    return out.dump();
  });
}

std::string pass_kind_letter(PassKind kind) {
  switch (kind) {
    case PassKind::kForward: return "F";
    case PassKind::kBackward: return "B";
    case PassKind::kBackwardInput: return "I";
    case PassKind::kBackwardWeight: return "W";
  }
  return "?";
}

Schedule schedule_argument(const std::string& name) {
  const std::optional<Schedule> s = schedule_from_name(name);
  if (!s || *s == Schedule::kNone) {
    throw InputError("schedule must be \"gpipe\", \"1f1b\", \"interleaved-1f1b\", "
                     "\"interleaved-zb\" or \"zbv\" (got \"" + name + "\")");
  }
  return *s;
}

// The simulated schedule of a pipeline plan: [[{"kind": "F" | "B" | "I" | "W", "microbatch": i,
// "stage": s, "start_s", "end_s"}, ...] per rank].
std::string pipeline_timeline_text(const std::string& graph_text, const std::string& cluster_text,
                                   const std::optional<std::string>& job_text,
                                   const std::string& plan_text) {
  const Problem problem = make_problem(graph_text, cluster_text, job_text);
  return with_source("plan", [&] {
    Plan plan = plan_from_json(parse_json_text(plan_text, "plan"), "plan");
    align_assignment_to_graph(plan, problem.graph, "plan");
    plan.validate("plan", problem.graph, problem.cluster);
    if (plan.mode != MpMode::kPipeline) {
      throw_input_error("plan", "mode", "must be pipeline for a pipeline timeline", mode_name(plan.mode));
    }
    Json out = Json::array();
    for (const auto& stage : Evaluator(problem).pipeline_timeline(plan)) {
      Json passes = Json::array();
      for (const auto& t : stage) {
        passes.push_back({{"kind", pass_kind_letter(t.pass.kind)}, {"microbatch", t.pass.microbatch},
                          {"stage", t.pass.stage}, {"start_s", t.start_s}, {"end_s", t.end_s}});
      }
      out.push_back(std::move(passes));
    }
    return out.dump();
  });
}

std::string search_plans(const std::string& graph_text, const std::string& cluster_text,
                         const std::optional<std::string>& job_text, int64_t devices, int top_k,
                         bool placement, bool pipeline, bool dp_only,
                         int exact_placement_max_nodes, const std::vector<std::string>& shardings,
                         const std::vector<std::string>& schedules,
                         const std::vector<int64_t>& tensor_degrees,
                         const std::string& sequence_parallel) {
  const Problem problem = make_problem(graph_text, cluster_text, job_text);
  SearchOptions options;
  options.devices = devices;
  options.top_k = top_k;
  options.placement = placement;
  options.pipeline = pipeline;
  options.dp_only = dp_only;
  options.exact_placement_max_nodes = exact_placement_max_nodes;
  options.shardings.clear();
  for (const std::string& name : shardings) {
    const std::optional<Sharding> kind = sharding_from_name(name);
    if (!kind) {
      throw InputError("shardings must name \"none\", \"zero2\" or \"zero3\" (got \"" + name + "\")");
    }
    options.shardings.push_back(*kind);
  }
  options.schedules.clear();
  for (const std::string& name : schedules) {
    const std::optional<Schedule> kind = schedule_from_name(name);
    if (!kind || *kind == Schedule::kNone) {
      throw InputError("schedules must name pipeline schedules: \"gpipe\", \"1f1b\", "
                       "\"interleaved-1f1b\", \"interleaved-zb\" or \"zbv\" (got \"" + name + "\")");
    }
    options.schedules.push_back(*kind);
  }
  options.tensor_degrees = tensor_degrees;
  const std::optional<SequenceParallelSearch> sp = sequence_parallel_search_from_name(sequence_parallel);
  if (!sp) {
    throw InputError("sequence_parallel must be \"auto\", \"on\" or \"off\" (got \"" +
                     sequence_parallel + "\")");
  }
  options.sequence_parallel = *sp;
  SearchResult result;
  {
    // Searches on big clusters take seconds; let other Python threads (tqdm, servers) run.
    py::gil_scoped_release release;
    result = search(problem, options);
  }
  Json out = {{"plans", Json::array()},
              {"candidates_evaluated", result.candidates_evaluated},
              {"notes", result.notes},
              {"infeasible", result.infeasible}};
  for (const Plan& plan : result.plans) {
    out["plans"].push_back(plan_to_json(plan, problem.graph, problem.cluster));
  }
  return out.dump();
}

// The plans over the run, phase by phase (run_phases.h), as `hybridplan plan --over-run --json`
// prints it. switch_s < 0: default_switch_s(problem).
std::string plan_over_run_text(const std::string& graph_text, const std::string& cluster_text,
                               const std::string& job_text, int64_t devices, int segments,
                               double switch_s, bool placement, bool pipeline) {
  const Problem problem = make_problem(graph_text, cluster_text, job_text);
  SearchOptions options;
  options.devices = devices;
  options.placement = placement;
  options.pipeline = pipeline;
  RunPhasesOptions run;
  run.segments = segments;
  run.switch_s = switch_s;
  RunPhases phases;
  {
    py::gil_scoped_release release;
    phases = plan_over_run(problem, options, run);
  }
  return run_phases_to_json(phases, problem).dump();
}

// The plan as text for people: with the graph, its node names; with graph and cluster too,
// memory capacity and links (explain.h).
std::string explain_plan(const std::string& plan_text, const std::string& plan_source,
                         const std::optional<std::string>& graph_text,
                         const std::optional<std::string>& cluster_text,
                         const std::optional<std::string>& job_text) {
  Plan plan = with_source(plan_source, [&] {
    return plan_from_json(parse_json_text(plan_text, plan_source), plan_source);
  });
  if (!graph_text) return explain(plan);
  if (!cluster_text) {
    const Graph graph = with_source("graph", [&] {
      return graph_from_json(parse_json_text(*graph_text, "graph"), "graph");
    });
    align_assignment_to_graph(plan, graph, plan_source);
    return explain(plan, graph);
  }
  const Problem problem = make_problem(*graph_text, *cluster_text, job_text);
  align_assignment_to_graph(plan, problem.graph, plan_source);
  plan.validate(plan_source, problem.graph, problem.cluster);
  return explain(problem, plan);
}

}  // namespace

void bind_planner(py::module_& m) {
  m.def("evaluate", &evaluate_plan, py::arg("graph_text"), py::arg("cluster_text"),
        py::arg("job_text"), py::arg("plan_text"), py::arg("plan_source") = "plan",
        "Cost breakdown of a plan (JSON text of the plan's 'predicted' object plus 'objective').");
  m.def("pipeline_timeline", &pipeline_timeline_text, py::arg("graph_text"),
        py::arg("cluster_text"), py::arg("job_text"), py::arg("plan_text"),
        "The cost model's simulated schedule of a pipeline plan (JSON text, per stage).");
  m.def("search", &search_plans, py::arg("graph_text"), py::arg("cluster_text"),
        py::arg("job_text"), py::arg("devices") = 0, py::arg("top_k") = 5,
        py::arg("placement") = true, py::arg("pipeline") = true, py::arg("dp_only") = false,
        py::arg("exact_placement_max_nodes") = SearchOptions{}.exact_placement_max_nodes,
        py::arg("shardings") = std::vector<std::string>{"none", "zero2", "zero3"},
        py::arg("schedules") =
            std::vector<std::string>{"gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"},
        py::arg("tensor_degrees") = std::vector<int64_t>{}, py::arg("sequence_parallel") = "auto",
        "Top-K plans: JSON text {plans, candidates_evaluated, notes, infeasible}. "
        "tensor_degrees: the tensor-parallel degrees allowed (empty: 1 and every degree the "
        "graph and cluster allow). sequence_parallel: \"auto\" (tensor-parallel plans with and "
        "without where the graph allows), \"on\" or \"off\" (search.h "
        "SequenceParallelSearch). Raises InfeasibleError when no candidate fits.");
  m.def(
      "rank_passes",
      [](const std::string& schedule, int64_t num_stages, int64_t num_microbatches,
         int64_t num_ranks, int64_t rank) {
        std::vector<std::tuple<std::string, int64_t, int64_t>> out;
        for (const PipelinePass& p :
             rank_passes(schedule_argument(schedule),
                         {.num_stages = num_stages, .num_microbatches = num_microbatches, .num_ranks = num_ranks},
                         rank)) {
          out.emplace_back(pass_kind_letter(p.kind), p.microbatch, p.stage);
        }
        return out;
      },
      py::arg("schedule"), py::arg("num_stages"), py::arg("num_microbatches"), py::arg("num_ranks"),
      py::arg("rank"),
      "The passes a pipeline rank runs, in order: [(kind 'F'|'B'|'I'|'W', micro-batch, stage)] "
      "(pipeline_schedule.h rank_passes, the order the cost model simulates).");
  m.def(
      "stage_ranks",
      [](const std::string& schedule, int64_t mp, int64_t virtual_stages) {
        std::vector<int64_t> out;
        const Schedule s = schedule_argument(schedule);
        for (int64_t k = 0; k < mp * virtual_stages; ++k) out.push_back(stage_rank(s, mp, k));
        return out;
      },
      py::arg("schedule"), py::arg("mp"), py::arg("virtual_stages"),
      "The local rank of each of the mp * virtual_stages pipeline stages (plan.h stage_rank).");
  m.def(
      "tp_split_mask",
      [](const std::vector<int64_t>& max_degrees,
         const std::vector<std::vector<NodeIndex>>& tied_groups, int64_t tp) {
        for (size_t g = 0; g < tied_groups.size(); ++g) {
          for (size_t i = 0; i < tied_groups[g].size(); ++i) {
            const NodeIndex v = tied_groups[g][i];
            if (v < 0 || static_cast<size_t>(v) >= max_degrees.size()) {
              throw_input_error("tp_split_mask",
                                "tied_groups[" + std::to_string(g) + "][" + std::to_string(i) + "]",
                                "must be a node index in 0.." +
                                    std::to_string(static_cast<int64_t>(max_degrees.size()) - 1),
                                std::to_string(v));
            }
          }
        }
        const std::vector<uint8_t> mask = tp_split_mask(max_degrees, tied_groups, tp);
        return std::vector<bool>(mask.begin(), mask.end());
      },
      py::arg("max_degrees"), py::arg("tied_groups"), py::arg("tp"),
      "Which nodes split at tensor-parallel degree tp (tensor_parallel_cost.h tp_split_mask, "
      "the planner's one rule): max_degrees[i] the node's max_degree (0: no tensor_parallel), "
      "tied_groups lists of node indices sharing a parameter; one bool per node.");
  m.def(
      "epochs_to_target",
      [](const std::string& job_text, double global_batch) {
        const Job job = with_source("job", [&] { return job_from_json(parse_json_text(job_text, "job"), "job"); });
        return epochs_to_target(job.convergence, global_batch);
      },
      py::arg("job_text"), py::arg("global_batch"),
      "Epochs to target at a global batch under the job's convergence model (convergence.h); 0 "
      "without one.");
  m.def("plan_over_run", &plan_over_run_text, py::arg("graph_text"), py::arg("cluster_text"),
        py::arg("job_text"), py::arg("devices") = 0,
        py::arg("segments") = RunPhasesOptions{}.segments,
        py::arg("switch_s") = -1.0, py::arg("placement") = true, py::arg("pipeline") = true,
        "The schedule of plans over the run (JSON text, as `plan --over-run --json`). Raises "
        "ValueError unless the job has a critical_batch model, InfeasibleError when nothing fits.");
  m.def("explain", &explain_plan, py::arg("plan_text"), py::arg("plan_source") = "plan",
        py::arg("graph_text") = std::nullopt, py::arg("cluster_text") = std::nullopt,
        py::arg("job_text") = std::nullopt,
        "The plan as text for people (node names from the graph; capacity from the cluster).");
}

}  // namespace hybridplan::python
