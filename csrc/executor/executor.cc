#include "executor/executor.h"

#include <atomic>
#include <csignal>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/json_io.h"
#include "common/sha256.h"
#include "executor/checkpoint.h"
#include "executor/ddp_reducer.h"
#include "executor/lost_peer.h"
#include "executor/process_groups.h"
#include "executor/rank_agreement.h"
#include "executor/stage_channel.h"
#include "planner/simulations/pipeline_schedule.h"

namespace hybridplan {
namespace {

// Keys and group names must be new for every Executor of a job, and the same on every rank:
// ranks construct their executors in the same order.
std::atomic<int64_t> executor_generation{0};

int64_t param_bytes_of(torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const torch::Tensor& p : module.parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

RankFingerprint fingerprint_of(const Plan& plan, const std::string& plan_json, torch::nn::Module& module) {
  RankFingerprint f;
  f.plan_sha256 = sha256_hex(plan_json);
  std::ostringstream summary;
  summary << mode_name(plan.mode) << " dp=" << plan.dp << " mp=" << plan.mp << " batch "
          << plan.per_replica_batch << "/" << plan.global_batch;
  if (plan.mode == MpMode::kPipeline) {
    summary << " " << schedule_name(plan.schedule) << " x" << plan.num_microbatches;
  }
  summary << ", graph " << plan.graph_name << " " << plan.graph_sha256.substr(0, 8);
  f.plan_summary = summary.str();
  std::ostringstream params;
  int64_t values = 0;
  const auto named = module.named_parameters();
  for (const auto& p : named) {
    params << p.key() << ":" << p.value().sizes() << ":" << p.value().scalar_type() << "\n";
    values += p.value().numel();
  }
  f.params_sha256 = sha256_hex(params.str());
  f.params_summary = std::to_string(named.size()) + " parameter tensors, " + std::to_string(values) + " values";
  f.torch_version = local_torch_version();
  f.hybridplan_version = local_hybridplan_version();
  return f;
}

std::vector<int64_t> iota_ranks(int64_t first, int64_t count, int64_t stride) {
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < count; ++i) ranks.push_back(first + i * stride);
  return ranks;
}

}  // namespace

namespace {

// A write to the socket of a rank that died (the TCPStore's host, a Gloo peer) raises SIGPIPE,
// whose default action kills this process at once (exit 141), before the executor can name the
// lost rank. Python ignores SIGPIPE from startup, so its executor sees an error; do the same
// here, unless the program installed a handler of its own (then it is left alone).
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

Executor::Executor(const Plan& plan, const Graph& graph, std::shared_ptr<torch::nn::Module> module,
                   const DistEnv& env, ExecutorOptions options)
    : plan_(plan), env_(env), options_(std::move(options)), module_(std::move(module)) {
  ignore_sigpipe();
  const std::string& src = options_.plan_source;
  plan_.validate_structure(src);
  if (graph_sha256(graph) != plan_.graph_sha256) {
    throw_input_error(src, "graph.sha256", "does not match the graph given to the executor (" +
                                               graph_sha256(graph) + ")", plan_.graph_sha256);
  }
  for (size_t v = 0; v < plan_.recompute.size(); ++v) {
    if (plan_.recomputes(v)) {
      // Recompute is applied by the Python executor (torch.utils.checkpoint); the C++ executor
      // keeps every activation, so running the plan here would not be the plan priced.
      throw_input_error(src, "assignment[" + std::to_string(v) + "].recompute",
                        "is not supported by the C++ executor (it keeps every activation); run "
                        "the plan with the Python executor (hybridplan.apply)",
                        "true");
    }
  }
  if (plan_.sharding != Sharding::kNone) {
    // libtorch has no FSDP2 in C++: the C++ executor replicates with c10d::Reducer only, so a
    // sharded plan would run, and cost, as another plan than the one priced.
    throw_input_error(src, "sharding",
                      "is not supported by the C++ executor (libtorch has no fully_shard; it "
                      "replicates with DDP's reducer); run the plan with the Python executor "
                      "(hybridplan.apply)",
                      std::string("\"") + sharding_name(plan_.sharding) + "\"");
  }
  if (plan_.tp > 1) {
    // Tensor parallelism is DTensor's parallelize_module (docs/tensor_parallel.md "Applied"),
    // which libtorch does not have: run as it is, each rank would hold and compute whole nodes.
    throw_input_error(src, "tp",
                      "is not supported by the C++ executor (libtorch has no DTensor "
                      "parallelize_module to split the nodes); run the plan with the Python "
                      "executor (hybridplan.apply)",
                      std::to_string(plan_.tp));
  }
  if (plan_.mode == MpMode::kPipeline && schedule_is_multi_stage(plan_.schedule)) {
    // Its stage channel runs one stage per rank in GPipe or 1F1B order (stage_passes); several
    // stages per rank and a split backward are torch.distributed.pipelining's.
    throw_input_error(src, "schedule",
                      "is not supported by the C++ executor (it runs one stage per rank, GPipe "
                      "or 1F1B); run the plan with the Python executor (hybridplan.apply)",
                      std::string("\"") + schedule_name(plan_.schedule) + "\"");
  }
  if (plan_.accumulation_steps != 1) {
    // Its step() is one forward and backward of per_replica_batch samples per replica; run as
    // it is, it would train a smaller global batch than the plan's.
    throw_input_error(src, "accumulation_steps",
                      "is not supported by the C++ executor (its step is one micro-step); run "
                      "the plan with the Python executor (hybridplan.apply)",
                      std::to_string(plan_.accumulation_steps));
  }
  if (plan_.num_processes() != env_.world_size) {
    throw_input_error(src, "dp/mp",
                      std::string("need ") + std::to_string(plan_.num_processes()) + " processes for a " +
                          mode_name(plan_.mode) + " plan, but the job was launched with WORLD_SIZE",
                      std::to_string(env_.world_size));
  }
  HP_INTERNAL_ASSERT(plan_.assignment.size() == graph.nodes.size(), "plan not validated against graph");
  all_blocks_ = blocks_of(*module_);
  check_module_matches_graph(graph);

  const bool pipeline = plan_.mode == MpMode::kPipeline;
  replica_ = pipeline ? env_.rank / plan_.mp : env_.rank;
  stage_ = pipeline ? env_.rank % plan_.mp : 0;
  const bool cuda = options_.device_type == torch::kCUDA;
  for (size_t i = 0; i < all_blocks_.size(); ++i) {
    if (pipeline && plan_.assignment[i] != stage_) continue;
    torch::Device device = torch::kCPU;
    if (cuda) {
      // pipeline: this process's device; placement: the replica's k-th device on this node.
      int64_t local = env_.local_rank;
      if (!pipeline) {
        int64_t per_node = plan_.cluster_devices_per_node > 0 ? plan_.cluster_devices_per_node
                                                               : torch::cuda::device_count();
        local = plan_.mesh[replica_][plan_.assignment[i]] % per_node;
      }
      device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local));
    }
    all_blocks_[i].module->to(device);
    local_blocks_.push_back(all_blocks_[i]);
    local_block_devices_.push_back(device);
  }

  const int64_t gen = executor_generation++;
  tag_ = "executor" + std::to_string(gen);
  const std::string& tag = tag_;
  plan_json_ = plan_to_json(plan_, graph).dump();
  store_ = connect_store(env_, options_.timeout);
  check_ranks_agree(*store_, tag + "/agreement", env_.rank, env_.world_size,
                    fingerprint_of(plan_, plan_json_, *module_), options_.timeout);

  const c10::DeviceType comm_device = cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  if (pipeline && plan_.mp > 1) {
    pipe_group_ = new_group(store_, tag + "/replica" + std::to_string(replica_),
                            iota_ranks(replica_ * plan_.mp, plan_.mp, 1), env_, comm_device,
                            options_.timeout);
    channel_ = std::make_unique<StageChannel>(pipe_group_->getBackend(comm_device),
                                              local_block_devices_.front(), options_.timeout);
  }
  if (plan_.dp > 1) {
    const std::vector<int64_t> members = pipeline ? iota_ranks(stage_, plan_.dp, plan_.mp)
                                                  : iota_ranks(0, plan_.dp, 1);
    dp_group_ = new_group(store_, tag + "/dp_stage" + std::to_string(stage_), members, env_,
                          comm_device, options_.timeout);
    broadcast_from_first(dp_group_, local_states());
    std::vector<std::string> names;
    for (const auto& [name, param] : local_named_parameters()) names.push_back(name);
    if (!names.empty()) {  // a stage of parameter-free blocks has nothing to reduce
      reducer_ = std::make_unique<DdpReducer>(parameters(), std::move(names), dp_group_,
                                              options_.bucket_caps);
    }
  }
}

Executor::~Executor() = default;

void Executor::check_module_matches_graph(const Graph& graph) const {
  const std::string& src = options_.plan_source;
  if (all_blocks_.size() != graph.nodes.size()) {
    throw_input_error(src, "graph", "has " + std::to_string(graph.nodes.size()) +
                                        " nodes but the module has this many blocks",
                      std::to_string(all_blocks_.size()));
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    const int64_t bytes = param_bytes_of(*all_blocks_[i].module);
    if (node.name != all_blocks_[i].name || node.param_bytes != bytes) {
      throw_input_error(src, "graph.nodes[" + std::to_string(i) + "]",
                        "is \"" + node.name + "\" with " + std::to_string(node.param_bytes) +
                            " param_bytes, which must match the module's block " + std::to_string(i),
                        "\"" + all_blocks_[i].name + "\" with " + std::to_string(bytes) + " param_bytes");
    }
  }
}

std::vector<torch::Tensor> Executor::parameters() const {
  std::vector<torch::Tensor> params;
  for (auto& [name, p] : local_named_parameters()) params.push_back(std::move(p));
  return params;
}

std::vector<std::pair<std::string, torch::Tensor>> Executor::local_named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const Block& b : local_blocks_) {
    for (const auto& p : b.module->named_parameters()) {
      if (p.value().requires_grad()) named.emplace_back(b.name + "." + p.key(), p.value());
    }
  }
  return named;
}

std::vector<torch::Tensor> Executor::local_states() const {
  std::vector<torch::Tensor> states = parameters();
  for (const Block& b : local_blocks_) {
    for (const torch::Tensor& buffer : b.module->buffers()) states.push_back(buffer);
  }
  return states;
}

int64_t Executor::num_grad_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }

torch::Tensor Executor::replica_rows(const torch::Tensor& t, const char* what) const {
  const int64_t b = plan_.per_replica_batch;
  if (t.dim() >= 1 && t.size(0) == plan_.global_batch) return t.narrow(0, replica_ * b, b);
  if (t.dim() >= 1 && t.size(0) == b) return t;
  throw InputError(std::string("Executor::forward_backward: ") + what + " must have global_batch = " +
                   std::to_string(plan_.global_batch) + " or per_replica_batch = " + std::to_string(b) +
                   " rows (got " + (t.dim() >= 1 ? std::to_string(t.size(0)) : std::string("a scalar")) + ")");
}

torch::Tensor Executor::run_local_blocks(torch::Tensor x) const {
  for (size_t i = 0; i < local_blocks_.size(); ++i) {
    x = local_blocks_[i].forward({x.to(local_block_devices_[i])});
  }
  return x;
}

torch::Tensor Executor::forward_backward(const torch::Tensor& input, const torch::Tensor& target,
                                         const LossFn& loss_fn) {
  const int64_t number = steps_ + 1;  // 1-based, as the Python executor's "step N"
  torch::Tensor loss;
  try {
    loss = step(input, target, loss_fn);
  } catch (const std::exception& e) {
    if (env_.world_size == 1 || !is_communication_error(e)) throw;
    const auto grace = std::chrono::milliseconds(static_cast<int64_t>(kLostPeerGraceS * 1000));
    throw LostPeerError(lost_peer_message(
        "step " + std::to_string(number), env_.rank,
        lost_ranks(*store_, "step" + std::to_string(number), env_.rank, env_.world_size, grace),
        error_type_name(e), error_text(e)));
  }
  steps_ = number;
  return loss;
}

torch::Tensor Executor::step(const torch::Tensor& input, const torch::Tensor& target,
                             const LossFn& loss_fn) {
  if (reducer_) reducer_->prepare_for_forward();
  return plan_.mode == MpMode::kPipeline ? step_pipeline(input, target, loss_fn)
                                         : step_placement(input, target, loss_fn);
}

torch::Tensor Executor::step_placement(const torch::Tensor& input, const torch::Tensor& target,
                                       const LossFn& loss_fn) {
  torch::Tensor output = run_local_blocks(replica_rows(input, "input"));
  torch::Tensor loss = loss_fn(output, replica_rows(target, "target").to(output.device()));
  if (reducer_) reducer_->prepare_for_backward();
  loss.backward();  // the Reducer averages the gradients during and at the end of it
  return loss.detach();
}

// Micro-batch i of the replica's b rows is rows_i = tensor_split(b, m)[i]; its loss is weighted
// by rows_i / b, so the micro-batch gradients sum to the gradient of the replica's mean loss.
torch::Tensor Executor::step_pipeline(const torch::Tensor& input, const torch::Tensor& target,
                                      const LossFn& loss_fn) {
  const int64_t m = plan_.num_microbatches;
  const int64_t b = plan_.per_replica_batch;
  std::vector<torch::Tensor> inputs(m), outputs(m), targets;
  std::vector<torch::Tensor> input_chunks;
  if (is_first_stage()) input_chunks = replica_rows(input, "input").tensor_split(m);
  if (is_last_stage()) targets = replica_rows(target, "target").tensor_split(m);
  const std::vector<PipelinePass> passes = stage_passes(plan_.schedule, {.num_stages = plan_.mp, .num_microbatches = m}, stage_);
  size_t last_backward = 0;
  for (size_t k = 0; k < passes.size(); ++k) {
    if (passes[k].kind == PassKind::kBackward) last_backward = k;
  }
  // Tags: 2 * microbatch for activations, 2 * microbatch + 1 for their gradients.
  torch::Tensor loss_sum;
  for (size_t k = 0; k < passes.size(); ++k) {
    const int64_t i = passes[k].microbatch;
    if (passes[k].kind == PassKind::kForward) {
      torch::Tensor x = is_first_stage() ? input_chunks[i]
                                         : channel_->recv(static_cast<int>(stage_ - 1), static_cast<int>(2 * i))
                                               .requires_grad_(true);
      inputs[i] = x;
      torch::Tensor y = run_local_blocks(x);
      if (is_last_stage()) {
        const double weight = static_cast<double>(targets[i].size(0)) / static_cast<double>(b);
        y = loss_fn(y, targets[i].to(y.device())) * weight;
        loss_sum = loss_sum.defined() ? loss_sum + y.detach() : y.detach();
      } else {
        channel_->send(y, static_cast<int>(stage_ + 1), static_cast<int>(2 * i));
      }
      outputs[i] = y;
    } else {
      if (k == last_backward && reducer_) reducer_->prepare_for_backward();  // the others: no_sync
      if (is_last_stage()) {
        outputs[i].backward();
      } else {
        torch::Tensor grad = channel_->recv(static_cast<int>(stage_ + 1), static_cast<int>(2 * i + 1));
        outputs[i].backward(grad.to(outputs[i].device()));
      }
      if (!is_first_stage()) {
        // A stage whose output does not depend on its input differentiably still answers.
        torch::Tensor grad = inputs[i].grad();
        channel_->send(grad.defined() ? grad : torch::zeros_like(inputs[i]), static_cast<int>(stage_ - 1),
                       static_cast<int>(2 * i + 1));
      }
      inputs[i] = torch::Tensor();
      outputs[i] = torch::Tensor();
    }
  }
  if (channel_) channel_->wait_sends();
  return loss_sum;
}

// ---- checkpoints ------------------------------------------------------------------------------
// The parts travel through the job's TCPStore, as pickled bytes: the executor has no process
// group over replica 0's stages that gathers variable-size objects (Gloo gathers tensors of
// known sizes), and the models the C++ executor trains are small. Keys, fresh per save:
//   <tag>/checkpoint<n>/part/<rank>   a replica-0 rank's {"model": {...}, "optimizer": {...}}
//   <tag>/checkpoint<n>/status        rank 0's outcome: "" written, else the error
//   <tag>/checkpoint<n>/read/<rank>   this rank has read the status (rank 0, which hosts the
//                                     store, waits for these before it returns)
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// The whole model's state in the module's order, each tensor from the part that holds it (a
// stage's tensors from its rank's part); state of no block is this rank's (rank 0's) own.
IDict merge_model_parts(torch::nn::Module& module, const std::vector<IDict>& parts) {
  IDict model = new_dict();
  for (const auto& [key, t] : module_state(module)) {
    c10::IValue value = t.detach().to(torch::kCPU).clone();
    for (const IDict& part : parts) {
      const IDict m = part.at("model").toGenericDict();
      if (auto it = m.find(key); it != m.end()) {
        value = it->value();
        break;
      }
    }
    model.insert(key, value);
  }
  return model;
}

}  // namespace

void Executor::save_checkpoint(const std::string& path, const torch::optim::Optimizer& optimizer) {
  const std::string prefix = tag_ + "/checkpoint" + std::to_string(saves_++);
  const int64_t contributors = plan_.mode == MpMode::kPipeline ? plan_.mp : 1;  // replica 0's ranks
  if (env_.rank < contributors) send_checkpoint_part(prefix, optimizer);
  if (env_.rank == 0) store_->set(prefix + "/status", bytes_of(write_checkpoint_parts(prefix, contributors, path)));
  const std::string status = await_checkpoint_status(prefix);
  if (!status.empty()) {
    throw std::runtime_error(path + ": checkpoint not written (rank 0: " + status +
                             "); the previous file, if any, is unchanged");
  }
}

void Executor::send_checkpoint_part(const std::string& prefix, const torch::optim::Optimizer& optimizer) const {
  const std::string key = prefix + "/part/" + std::to_string(env_.rank);
  try {
    const ParameterNames names = canonical_parameter_names(*module_);
    std::set<const void*> mine;
    for (const torch::Tensor& t : local_states()) mine.insert(t.unsafeGetTensorImpl());
    IDict model = new_dict();
    for (const auto& [name, t] : module_state(*module_)) {
      if (mine.count(t.unsafeGetTensorImpl())) model.insert(name, t.detach().to(torch::kCPU).clone());
    }
    IDict part = new_dict();
    part.insert("model", model);
    part.insert("optimizer", optimizer_state_by_name(optimizer, names));
    std::vector<char> pickled = pickle_plain(part);
    store_->set(key, std::vector<uint8_t>(pickled.begin(), pickled.end()));
  } catch (const std::exception& e) {  // rank 0 reports it to every rank
    store_->set(key, bytes_of("error: " + error_text(e)));
  }
}

std::string Executor::write_checkpoint_parts(const std::string& prefix, int64_t contributors,
                                             const std::string& path) const {
  try {
    std::vector<std::string> keys;
    for (int64_t r = 0; r < contributors; ++r) keys.push_back(prefix + "/part/" + std::to_string(r));
    store_->wait(keys, options_.timeout);  // every part has arrived: the write may begin
    std::vector<IDict> parts;
    for (const std::string& key : keys) {
      std::vector<uint8_t> value = store_->get(key);
      store_->deleteKey(key);
      const std::string text(value.begin(), value.end());
      if (text.rfind("error: ", 0) == 0) throw std::runtime_error(key + ": " + text.substr(7));
      parts.push_back(torch::pickle_load(std::vector<char>(value.begin(), value.end())).toGenericDict());
    }
    std::vector<IDict> optimizers;
    for (const IDict& part : parts) optimizers.push_back(part.at("optimizer").toGenericDict());
    const std::vector<char> bytes =
        pickle_plain(build_checkpoint(merge_model_parts(*module_, parts), merge_optimizer_states(optimizers),
                                      steps_, plan_json_, plan_.graph_sha256));
    write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
    return "";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    return what.substr(0, what.find('\n'));
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string Executor::await_checkpoint_status(const std::string& prefix) const {
  std::string status;
  try {
    store_->wait({prefix + "/status"}, options_.timeout);
    std::vector<uint8_t> value = store_->get(prefix + "/status");
    status.assign(value.begin(), value.end());
    store_->set(prefix + "/read/" + std::to_string(env_.rank), std::vector<uint8_t>{1});
  } catch (const std::exception& e) {
    status = "no answer within the timeout: " + error_text(e);
  }
  if (env_.rank == 0) {  // rank 0 hosts the store: it returns once every rank has read
    std::vector<std::string> read;
    for (int64_t r = 0; r < env_.world_size; ++r) read.push_back(prefix + "/read/" + std::to_string(r));
    try {
      store_->wait(read, options_.timeout);
    } catch (const std::exception&) {
      // a rank that read nothing has failed on its own; the outcome here stays accurate
    }
  }
  return status;
}

int64_t Executor::load_checkpoint(const std::string& path, torch::optim::Optimizer& optimizer) {
  const IDict checkpoint = read_checkpoint(path);
  check_model(checkpoint, *module_, path);
  load_model_state(checkpoint, *module_);
  const ParameterNames all = canonical_parameter_names(*module_);
  ParameterNames local;  // this rank's parameters only
  for (const torch::Tensor& p : parameters()) {
    if (auto it = all.find(p.unsafeGetTensorImpl()); it != all.end()) local.insert(*it);
  }
  load_optimizer_state(optimizer, local, checkpoint.at("optimizer").toGenericDict(), path);
  steps_ = checkpoint.at("step").toInt();
  return steps_;
}

}  // namespace hybridplan
