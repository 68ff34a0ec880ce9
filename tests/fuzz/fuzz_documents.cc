// libFuzzer targets for everything the planner reads from text (a crash on bad input is a bug): the Graph, Cluster,
// Job and Plan JSON loaders and the PipeDream graph.txt importer. One source, one binary per
// target (HP_FUZZ_TARGET selects it; see tests/fuzz/CMakeLists.txt and `make fuzz`).
//
// The property checked: bad input ends in hybridplan::InputError (a message for the user);
// anything else (another exception, InternalError, a crash, an ASan/UBSan report, a hang) is a
// finding. Accepted documents must also survive their own canonical form: what *_to_json writes
// loads again to the same canonical JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/json_io.h"
#include "planner/costs/evaluate.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"
#include "planner/documents/pipedream_import.h"
#include "planner/documents/plan.h"
#include "planner/documents/problem.h"

using namespace hybridplan;

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

// A document that loaded must load again from its canonical form, unchanged.
template <typename FromJson, typename ToJson>
void check_round_trip(const Json& canonical, FromJson from_json, ToJson to_json) {
  try {
    const Json again = to_json(from_json(parse_json_text(canonical.dump(), "canonical"), "canonical"));
    if (again != canonical) finding("canonical form changed on reload", canonical.dump());
  } catch (const InputError& e) {
    finding("canonical form of an accepted document is rejected", e.what());
  }
}

#if HP_FUZZ_TARGET_PLAN
// The plan target evaluates accepted plans against a fixed problem: examples/graph-tiny.json
// (the seeds' graph) on the dgx1-v100 preset.
const Problem& fixed_problem() {
  static const Problem problem =
      load_problem(std::string(HYBRIDPLAN_SOURCE_DIR) + "/examples/graph-tiny.json", "dgx1-v100");
  return problem;
}
#endif

void run_one(const std::string& text) {
#if HP_FUZZ_TARGET_GRAPH
  const Graph g = graph_from_json(parse_json_text(text, "fuzz.json"), "fuzz.json");
  graph_sha256(g);
  check_round_trip(graph_to_json(g), graph_from_json, graph_to_json);
#elif HP_FUZZ_TARGET_CLUSTER
  const Cluster c = cluster_from_json(parse_json_text(text, "fuzz.json"), "fuzz.json");
  check_round_trip(cluster_to_json(c), cluster_from_json, cluster_to_json);
#elif HP_FUZZ_TARGET_JOB
  const Job job = job_from_json(parse_json_text(text, "fuzz.json"), "fuzz.json");
  check_round_trip(job_to_json(job), job_from_json, job_to_json);
#elif HP_FUZZ_TARGET_PLAN
  Plan plan = plan_from_json(parse_json_text(text, "fuzz.json"), "fuzz.json");
  const Problem& problem = fixed_problem();
  // What `hybridplan evaluate` does after the identity check (a fuzzed sha256 never matches).
  if (!plan.assignment_node_ids.empty()) align_assignment_to_graph(plan, problem.graph, "fuzz.json");
  plan.validate_fit("fuzz.json", problem.graph, problem.cluster);
  plan.predicted = evaluate(problem, plan);
  plan_to_json(plan, problem.graph, problem.cluster).dump();
#elif HP_FUZZ_TARGET_PIPEDREAM
  std::istringstream in(text);
  const Graph g = import_pipedream(in, "fuzz.graph.txt", kPipeDreamDefaultBatchSize);
  check_round_trip(graph_to_json(g), graph_from_json, graph_to_json);
#else
#error "define one HP_FUZZ_TARGET_{GRAPH,CLUSTER,JOB,PLAN,PIPEDREAM}"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    run_one(text);
  } catch (const InputError&) {
    // the expected outcome for bad input
  } catch (const InfeasibleError&) {
    // a plan that does not fit: also a user-facing answer (CLI exit 3)
  } catch (const InternalError& e) {
    finding("internal error", e.what());
  } catch (const std::exception& e) {
    finding("unexpected exception", e.what());
  }
  return 0;
}
