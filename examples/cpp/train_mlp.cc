// train_mlp: trains a small MLP (models::mlp) under a hybridplan Plan, as one process of a
// torchrun job, with no Python interpreter:
//
//   train_mlp --write-graph graph.json                     # the model's graph, to plan from
//   hybridplan plan --graph graph.json --cluster localhost-cpu --out plan.json
//   torchrun --nproc-per-node 2 --no-python build/bin/train_mlp --plan plan.json --graph graph.json
//
// Every rank builds the same model (seeded) and draws the same synthetic regression batches
// (seeded per step); the Executor splits them across replicas, stages and micro-batches.
// `--reference` trains the same model in this one process on the whole global batch, which is
// what a plan's training must equal; `--out` writes the parameters this rank trains as JSON.
// `--checkpoint ckpt.pt` saves a checkpoint after the last step (docs/formats.md "Checkpoint",
// the Python executor's format); `--resume-from ckpt.pt` resumes one, written under any plan by
// either executor, and trains --steps more steps (the data of step k is the same either way).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "executor/executor.h"
#include "models/mlp.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"
#include "profiler/profile.h"

namespace {

using hybridplan::Executor;

struct Args {
  std::vector<int64_t> widths{16, 32, 32, 8};
  std::string write_graph, plan, graph, cluster = "localhost-cpu", out;
  std::string optimizer = "sgd";  // sgd (with --momentum) or adam
  std::string checkpoint, resume_from;
  bool reference = false;
  int64_t global_batch = 16;  // --reference only; a plan carries its own
  int64_t steps = 5;
  double lr = 0.05, momentum = 0.9;
  int64_t seed = 0;
  double timeout_s = 60;
  int64_t bucket_cap_bytes = 0;  // 0: DDP's policy (planner/costs/bucket_policy.h)
};

// Step `step`'s global batch: the same on every rank.
std::pair<torch::Tensor, torch::Tensor> batch_at(const Args& a, int64_t global_batch, int64_t step) {
  torch::manual_seed(a.seed * 100003 + 1 + step);
  torch::Tensor x = torch::randn({global_batch, a.widths.front()});
  torch::Tensor y = torch::randn({global_batch, a.widths.back()});
  return {x, y};
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);  // mean over samples and outputs
}

// {"params": {"0.weight": [...], ...}} for the parameters in `trained` (by identity).
void write_params(const std::string& path, torch::nn::Module& model,
                  const std::vector<torch::Tensor>& trained) {
  nlohmann::json params = nlohmann::json::object();
  for (const auto& p : model.named_parameters()) {
    bool mine = false;
    for (const torch::Tensor& t : trained) mine = mine || t.is_same(p.value());
    if (!mine) continue;
    torch::Tensor flat = p.value().detach().cpu().to(torch::kDouble).reshape({-1}).contiguous();
    params[p.key()] = std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
  }
  std::ofstream(path) << nlohmann::json{{"params", params}}.dump() << "\n";
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Args& a, std::vector<torch::Tensor> params) {
  if (a.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(a.lr));
  }
  return std::make_unique<torch::optim::SGD>(std::move(params),
                                             torch::optim::SGDOptions(a.lr).momentum(a.momentum));
}

int run(const Args& a) {
  torch::manual_seed(a.seed);
  torch::nn::Sequential model = hybridplan::models::mlp(a.widths);

  if (!a.write_graph.empty()) {
    hybridplan::ProfileOptions options;
    options.name = "mlp";
    options.warmup = 1;
    options.repeats = 3;
    hybridplan::save_graph(hybridplan::profile(model, {torch::randn({a.global_batch, a.widths.front()})}, options),
                           a.write_graph);
    std::cout << "wrote " << a.write_graph << "\n";
    return 0;
  }

  if (a.reference) {
    auto opt = make_optimizer(a, model->parameters());
    for (int64_t step = 0; step < a.steps; ++step) {
      auto [x, y] = batch_at(a, a.global_batch, step);
      opt->zero_grad();
      torch::Tensor loss = mse(model->forward(x), y);
      loss.backward();
      opt->step();
      std::cout << "step " << step << " loss " << loss.item<double>() << "\n";
    }
    if (!a.out.empty()) write_params(a.out, *model, model->parameters());
    return 0;
  }

  hybridplan::Graph graph = hybridplan::load_graph(a.graph);
  hybridplan::Cluster cluster = hybridplan::load_cluster(a.cluster);
  hybridplan::Plan plan = hybridplan::load_plan(a.plan, graph, cluster);
  hybridplan::DistEnv env = hybridplan::dist_env_from_environment();
  hybridplan::ExecutorOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  if (a.bucket_cap_bytes > 0) options.bucket_caps = hybridplan::BucketCaps::uniform(a.bucket_cap_bytes);
  options.plan_source = a.plan;
  Executor executor(plan, graph, model.ptr(), env, options);
  std::cout << "rank " << env.rank << ": replica " << executor.replica() << " stage " << executor.stage()
            << ", " << executor.local_blocks().size() << " blocks, " << executor.num_grad_buckets()
            << " gradient buckets\n";

  auto opt = make_optimizer(a, executor.parameters());
  const int64_t first = a.resume_from.empty() ? 0 : executor.load_checkpoint(a.resume_from, *opt);
  if (!a.resume_from.empty()) std::cout << "rank " << env.rank << " resumed at step " << first << "\n";
  for (int64_t step = first; step < first + a.steps; ++step) {
    auto [x, y] = batch_at(a, plan.global_batch, step);
    const auto start = std::chrono::steady_clock::now();
    opt->zero_grad();
    torch::Tensor loss = executor.forward_backward(x, y, mse);
    opt->step();
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "rank " << env.rank << " step " << step;
    if (loss.defined()) std::cout << " replica loss " << loss.item<double>();
    std::cout << " step_s " << step_s << std::endl;  // flushed: tests follow the log
  }
  if (!a.checkpoint.empty()) {
    executor.save_checkpoint(a.checkpoint, *opt);
    std::cout << "rank " << env.rank << " saved " << a.checkpoint << " at step " << executor.step_count() << "\n";
  }
  if (!a.out.empty()) write_params(a.out, *model, executor.parameters());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small MLP under a hybridplan plan (run it under torchrun --no-python)"};
  Args a;
  app.add_option("--widths", a.widths, "layer widths: in, hidden..., out")->delimiter(',');
  app.add_option("--write-graph", a.write_graph, "profile the model and write its graph here, then exit");
  app.add_option("--plan", a.plan, "plan JSON to train under");
  app.add_option("--graph", a.graph, "the graph JSON the plan was made for");
  app.add_option("--cluster", a.cluster, "cluster JSON file or preset name the plan was made for");
  app.add_flag("--reference", a.reference, "train in this process alone on the whole global batch");
  app.add_option("--global-batch", a.global_batch, "global batch for --reference and --write-graph");
  app.add_option("--steps", a.steps, "optimizer steps");
  app.add_option("--optimizer", a.optimizer, "sgd (with --momentum) or adam")
      ->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--lr", a.lr, "learning rate");
  app.add_option("--momentum", a.momentum, "SGD momentum");
  app.add_option("--seed", a.seed, "seed of the weights and the data");
  app.add_option("--timeout-s", a.timeout_s, "bound on every rendezvous, collective and receive");
  app.add_option("--bucket-cap-bytes", a.bucket_cap_bytes,
                 "one cap for every gradient bucket, as DDP's bucket_cap_mb (default: DDP's "
                 "1 MiB first bucket, then 25 MiB)");
  app.add_option("--out", a.out, "write the parameters this rank trains as JSON");
  app.add_option("--checkpoint", a.checkpoint, "save a checkpoint here after the last step");
  app.add_option("--resume-from", a.resume_from,
                 "resume from a checkpoint (either executor's, any plan), then train --steps more");
  CLI11_PARSE(app, argc, argv);
  if (a.write_graph.empty() && !a.reference && (a.plan.empty() || a.graph.empty())) {
    std::cerr << "train_mlp: give --plan and --graph, or --reference, or --write-graph\n";
    return 2;
  }
  const char* rank = std::getenv("RANK");
  const std::string who = std::string("train_mlp") + (rank ? std::string(" rank ") + rank : "");
  try {
    return run(a);
  } catch (const hybridplan::InputError& e) {
    std::cerr << who << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const c10::Error& e) {  // store/Gloo failures: the message without the C++ backtrace
    std::cerr << who << ": error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << who << ": error: " << e.what() << std::endl;
    return 1;
  }
}
