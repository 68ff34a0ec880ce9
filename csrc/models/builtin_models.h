// The C++ built-in models by name, with example inputs: what `profile_model --model NAME` runs.
// Each name's Python twin (same layers, qualified names and tensor shapes) is listed in
// tests/python/test_cpp_profile_agreement.py, which checks that both profiles agree.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace hybridplan::models {

struct BuiltinModel {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;   // a Sequential or a hybridplan::BlockList
  std::vector<torch::Tensor> example_inputs;   // at the requested batch size
};

std::vector<std::string> builtin_model_names();

// Builds `name` with seeded weights (torch::manual_seed(0)) and example inputs of `batch_size`
// samples. Throws InputError for an unknown name or a batch_size < 1.
BuiltinModel make_builtin_model(const std::string& name, int64_t batch_size);

}  // namespace hybridplan::models
