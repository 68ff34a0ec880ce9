// Consolidated checkpoints in C++ (docs/formats.md "Checkpoint"): the file format of
// python/hybridplan/executor/checkpoint.py, read and written with LibTorch alone, so that a job
// saved by either executor resumes under the other where the module is the same.
//
// Names. The model's keys are what Python's module.state_dict() gives for the same module: for
// every module in named_modules() (pre-order, the root first) its own parameters, then its own
// buffers, each prefixed with the module's dotted path ("0.weight", "features.1.running_mean").
// A torch::nn::Sequential's children are named "0", "1", ... and nested containers "a.0", as in
// Python (profiler/block_list.h), so models::mlp and torch.nn.Sequential of the same layers share
// keys. The optimizer's state and param groups name a parameter by its canonical name, the first
// name of its tensor in named_parameters() order.
//
// Optimizers: torch::optim::SGD and torch::optim::Adam, whose state maps one to one onto Python's
// (SGD: momentum_buffer; Adam: step, exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad). Python
// stores Adam's step as a float32 scalar tensor and so does this file; LibTorch keeps an int64.
// Param groups hold the hyperparameters LibTorch has (SGD: lr, momentum, dampening, weight_decay,
// nesterov; Adam: lr, betas, eps, weight_decay, amsgrad); Python fills the others (maximize,
// foreach, ...) with its defaults when it loads them.
//
// The file is a torch.save zip of plain containers. torch::pickle_save cannot write it: it tags
// every dict and list with its TorchScript type (torch.jit._pickle.restore_type_tag), which
// torch.load(weights_only=True) refuses; pickle_plain() below pickles without those tags.
#pragma once
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace hybridplan {

inline constexpr const char* kCheckpointFormat = "hybridplan.checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
using IDict = c10::impl::GenericDict;  // str -> anything, as Python's plain dict
// A parameter's TensorImpl -> its canonical name.
using ParameterNames = std::unordered_map<const void*, std::string>;

// The module's state under Python's state_dict keys and order (see above).
NamedTensors module_state(torch::nn::Module& module);
// Every parameter of `module` by its canonical name.
ParameterNames canonical_parameter_names(torch::nn::Module& module);

// A torch.save file's bytes that torch.load(weights_only=True) and torch::pickle_load read.
// Written with common/json_io.h's write_file_atomic (tmp, fsync, rename, directory fsync).
std::vector<char> pickle_plain(const c10::IValue& value);

IDict new_dict();
// The checkpoint's root dict (checkpoint.py build()).
IDict build_checkpoint(IDict model, IDict optimizer, int64_t step, const std::string& plan_json,
                       const std::string& graph_sha256);

// {"class", "state": {name: {...}}, "param_groups": [{hyperparameters..., "params": [names]}]}
// for the parameters in `names` (others are left out). CPU copies. InputError for an optimizer
// other than SGD or Adam.
IDict optimizer_state_by_name(const torch::optim::Optimizer& optimizer, const ParameterNames& names);
// One optimizer state from the stages' parts (checkpoint.py merge_optimizer_states).
IDict merge_optimizer_states(const std::vector<IDict>& parts);

// Reads and checks a checkpoint's envelope (format, version, and the fields' kinds); InputError
// "<path>: <field> must be ..." otherwise.
IDict read_checkpoint(const std::string& path);
// The checkpoint's model must have exactly `module`'s state keys, shapes and dtypes and its
// optimizer state must name parameters of it (checkpoint.py check_model, same messages).
void check_model(const IDict& checkpoint, torch::nn::Module& module, const std::string& path);
// Copies the checkpoint's model state into `module` (on its devices). Call check_model first.
void load_model_state(const IDict& checkpoint, torch::nn::Module& module);
// Loads the saved state of the parameters in `names` into `optimizer`; each param group takes the
// hyperparameters of the saved group that holds its first named parameter (checkpoint.py
// load_optimizer_state). optimizer.class must be the optimizer's.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const ParameterNames& names,
                          const IDict& saved, const std::string& path);

// "SGD", "Adam" (Python's type(optimizer).__name__), or "" for any other optimizer.
std::string optimizer_class_name(const torch::optim::Optimizer& optimizer);

}  // namespace hybridplan
