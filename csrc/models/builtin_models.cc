#include "models/builtin_models.h"

#include <functional>
#include <map>

#include "common/error.h"
#include "models/attention_mlp.h"
#include "models/biglstm.h"
#include "models/mlp.h"
#include "models/small_cnn.h"

namespace hybridplan::models {
namespace {

using Factory = std::function<BuiltinModel(int64_t batch_size)>;

// Sizes are chosen so that every layer with parameters takes a measurable time (milliseconds on
// one CPU thread at batch 32), which the profile-agreement check needs.
const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> table = {
      {"attention_mlp",
       [](int64_t batch) {
         return BuiltinModel{"attention_mlp", attention_mlp().ptr(), {torch::randn({batch, 6, 8})}};
       }},
      {"biglstm",
       [](int64_t batch) {
         BigLstm model;
         return BuiltinModel{"biglstm", model.ptr(), {model->example_inputs(batch)}};
       }},
      {"mlp",
       [](int64_t batch) {
         return BuiltinModel{"mlp", mlp({1024, 2048, 2048, 1024}).ptr(),
                             {torch::randn({batch, 1024})}};
       }},
      {"small_cnn",
       [](int64_t batch) {
         return BuiltinModel{"small_cnn", small_cnn().ptr(), {torch::randn({batch, 3, 32, 32})}};
       }},
  };
  return table;
}

}  // namespace

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories()) names.push_back(name);
  return names;
}

BuiltinModel make_builtin_model(const std::string& name, int64_t batch_size) {
  const auto it = factories().find(name);
  if (it == factories().end()) {
    std::string known;
    for (const std::string& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
    throw_input_error("models", "model", "must be one of " + known, "\"" + name + "\"");
  }
  if (batch_size < 1) {
    throw_input_error("models", "batch_size", "must be >= 1", std::to_string(batch_size));
  }
  torch::manual_seed(0);
  return it->second(batch_size);
}

}  // namespace hybridplan::models
