#include "cli/plan_table.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/units.h"

namespace hybridplan::cli {
namespace {

bool has_convergence(const Problem& problem) {
  return problem.job.convergence.model != Convergence::Model::kNone;
}

// Left-aligned text columns sized to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const {
    std::vector<size_t> width(rows_.front().size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        line += row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
      }
      os << line << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

}  // namespace

// "none", "zero2", or "zero3/4" for hybrid sharding over groups of 4 replicas.
static std::string sharding_column(const Plan& p) {
  std::string s = sharding_name(p.sharding);
  if (p.sharding != Sharding::kNone && p.dp_replicate() > 1) s += "/" + std::to_string(p.shard_degree());
  return s;
}

std::string plan_shape(const Plan& plan) {
  std::string s = "dp=" + std::to_string(plan.dp) + " x mp=" + std::to_string(plan.mp);
  if (plan.tp > 1) s += " x tp=" + std::to_string(plan.tp);
  if (plan.sequence_parallel) s += " sp";
  if (plan.mp > 1) s += std::string(" ") + mode_name(plan.mode);
  if (plan.mode == MpMode::kPipeline) {
    s += std::string(" ") + schedule_name(plan.schedule) + " M=" + std::to_string(plan.num_microbatches);
    if (plan.virtual_stages > 1) s += " v=" + std::to_string(plan.virtual_stages);
  }
  if (plan.sharding != Sharding::kNone) s += std::string(" ") + sharding_name(plan.sharding);
  if (plan.dp_replicate() > 1 && plan.sharding != Sharding::kNone) {
    s += " hsdp " + std::to_string(plan.dp_replicate()) + "x" + std::to_string(plan.shard_degree());
  }
  return s;
}

void print_plan_table(std::ostream& os, const Problem& problem, const std::vector<Plan>& plans) {
  const bool convergence = has_convergence(problem);
  // a "tp" column only when some plan splits tensors (the table of other searches is unchanged)
  const bool tensor_parallel =
      std::any_of(plans.begin(), plans.end(), [](const Plan& p) { return p.tp > 1; });
  std::vector<std::string> header = {"rank", "dp", "mp", "mode", "schedule", "M", "shard", "batch",
                                     "global batch", "step", "compute", "all-reduce", "bubble",
                                     "max mem/device", "epochs",
                                     convergence ? "time-to-train" : "samples/s"};
  if (tensor_parallel) header.insert(header.begin() + 3, "tp");
  Table table(header);
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    const Prediction& q = p.predicted;
    std::vector<std::string> row = {
        std::to_string(i + 1), std::to_string(p.dp), std::to_string(p.mp),
        mode_name(p.mode), schedule_name(p.schedule), std::to_string(p.num_microbatches),
        sharding_column(p), std::to_string(p.per_replica_batch), std::to_string(p.global_batch),
        format_seconds(q.step_s),
        format_seconds(q.compute_s), format_seconds(q.allreduce_s + q.sharding_s),
        format_seconds(q.bubble_s), format_bytes(static_cast<double>(peak_memory_bytes(q))),
        convergence ? fixed(q.epochs, 1) : "-",
        convergence ? format_seconds(q.time_to_train_s) : format_count(q.samples_per_s)};
    if (tensor_parallel) row.insert(row.begin() + 3, std::to_string(p.tp) + (p.sequence_parallel ? " sp" : ""));
    table.add(row);
  }
  os << "graph " << problem.graph.name << " on cluster " << problem.cluster.name << " ("
     << format_bytes(static_cast<double>(problem.cluster.device.memory_bytes))
     << " per device); objective: "
     << (convergence ? "time to train (epochs from the job's convergence model)"
                     : "samples/s (the job has no convergence model)")
     << "\n";
  table.print(os);
}

void print_breakdown(std::ostream& os, const Problem& problem, const Plan& plan) {
  const Prediction& q = plan.predicted;
  os << "plan " << plan_shape(plan) << " on " << plan.world_size << " devices of "
     << problem.cluster.name << " (graph " << problem.graph.name << ")\n";
  os << "  per-replica batch " << plan.per_replica_batch << ", global batch " << plan.global_batch
     << "\n";
  Table table({"term", "value", "note"});
  table.add({"step", format_seconds(q.step_s),
             "compute + exposed all-reduce (or sharding) + optimizer + overhead"});
  std::string compute_note =
      plan.mode == MpMode::kPipeline ? "pipeline schedule length" : "fwd+bwd makespan";
  if (q.compute_slowdown != 1) compute_note += ", x" + fixed(q.compute_slowdown, 2) + " shared node";
  table.add({"  compute", format_seconds(q.compute_s), compute_note});
  table.add({"  all-reduce", format_seconds(q.allreduce_s), "exposed (not hidden by backward)"});
  if (plan.sharding != Sharding::kNone) {
    table.add({"  sharding", format_seconds(q.sharding_s),
               std::string(sharding_name(plan.sharding)) + ": exposed all-gathers and reduce-scatters"});
  }
  table.add({"  optimizer", format_seconds(q.optimizer_s), "parameter update of the fullest device"});
  table.add({"  overhead", format_seconds(q.overhead_s), "the runtime's fixed cost per step"});
  table.add({"  transfer", format_seconds(q.transfer_s), "cross-device activations (in compute)"});
  table.add({"  bubble", format_seconds(q.bubble_s), "pipeline idle time (in compute)"});
  if (plan.tp > 1) {
    table.add({"  TP collectives", format_seconds(q.tp_comm_s),
               plan.sequence_parallel
                   ? "tensor- and sequence-parallel all-reduces / all-gathers / reduce-scatters "
                     "(in compute, critical path)"
                   : "tensor-parallel all-reduces / all-gathers (in compute, critical path)"});
  }
  table.add({"samples/s", format_count(q.samples_per_s), "global batch / step"});
  if (has_convergence(problem)) {
    table.add({"epochs", fixed(q.epochs, 2), "at global batch " + std::to_string(plan.global_batch)});
    table.add({"time to train", format_seconds(q.time_to_train_s), "epochs x steps/epoch x step"});
  }
  table.print(os);
  os << "  memory per " << (plan.mode == MpMode::kPipeline ? "stage" : "device") << ":";
  for (int64_t bytes : q.memory_bytes) os << " " << format_bytes(static_cast<double>(bytes));
  os << " (limit " << format_bytes(static_cast<double>(problem.cluster.device.memory_bytes))
     << ")\n";
  os << "  feasible: " << (q.feasible ? "yes" : "no, " + q.infeasible_reason) << "\n";
  if (!q.compute_model.empty()) os << "  node times: " << q.compute_model << "\n";
  if (!plan.device_mapping_note.empty()) os << "  device mapping: " << plan.device_mapping_note << "\n";
}

}  // namespace hybridplan::cli
