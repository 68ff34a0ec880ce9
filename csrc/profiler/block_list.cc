#include "profiler/block_list.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <regex>

#include "common/error.h"

namespace hybridplan {
namespace {

namespace nn = torch::nn;

// The LibTorch layers a ModuleList/ModuleDict child may be (they are stored type-erased there,
// and calling one needs its static type). Each takes one tensor (extra arguments defaulted).
template <typename... Impls>
std::optional<nn::AnyModule> as_any_module(const std::shared_ptr<nn::Module>& module) {
  std::optional<nn::AnyModule> found;
  ((found ? void() : [&] {
     if (auto typed = std::dynamic_pointer_cast<Impls>(module)) found.emplace(typed);
   }()),
   ...);
  return found;
}

std::optional<nn::AnyModule> known_layer(const std::shared_ptr<nn::Module>& module) {
  return as_any_module<
      nn::LinearImpl, nn::Conv1dImpl, nn::Conv2dImpl, nn::Conv3dImpl, nn::ConvTranspose1dImpl,
      nn::ConvTranspose2dImpl, nn::ConvTranspose3dImpl, nn::MaxPool1dImpl, nn::MaxPool2dImpl,
      nn::MaxPool3dImpl, nn::AvgPool1dImpl, nn::AvgPool2dImpl, nn::AvgPool3dImpl,
      nn::AdaptiveAvgPool1dImpl, nn::AdaptiveAvgPool2dImpl, nn::AdaptiveAvgPool3dImpl,
      nn::AdaptiveMaxPool1dImpl, nn::AdaptiveMaxPool2dImpl, nn::AdaptiveMaxPool3dImpl,
      nn::ReLUImpl, nn::ReLU6Impl, nn::LeakyReLUImpl, nn::GELUImpl, nn::SiLUImpl, nn::ELUImpl,
      nn::SigmoidImpl, nn::TanhImpl, nn::SoftmaxImpl, nn::LogSoftmaxImpl, nn::FlattenImpl,
      nn::EmbeddingImpl, nn::LayerNormImpl, nn::BatchNorm1dImpl, nn::BatchNorm2dImpl,
      nn::BatchNorm3dImpl, nn::DropoutImpl, nn::Dropout2dImpl, nn::IdentityImpl>(module);
}

class Collector {
 public:
  std::vector<Block> blocks;
  // The first block name of each module holding parameters (see add()).
  std::map<const nn::Module*, std::string> first_name_of;

  // Expands a container child in place; any other child becomes one block.
  void add(const std::string& name, const std::shared_ptr<nn::Module>& module,
           std::optional<nn::AnyModule> callable) {
    if (expand(name + ".", *module)) return;
    if (auto* list = dynamic_cast<BlockList*>(module.get())) {
      for (Block& b : list->blocks()) {
        b.name = name + "." + b.name;
        blocks.push_back(std::move(b));
      }
      return;
    }
    // The node rule (block_list.h): a module with children that holds no parameter itself is
    // not a node, its children are; C++ can call those one by one only in a container or a
    // BlockList.
    if (!module->children().empty() && module->named_parameters(/*recurse=*/false).is_empty()) {
      throw_input_error("profile", "module." + name,
                        "has children and no parameters of its own, so by the node rule its "
                        "children are the graph nodes; hold them in a Sequential, ModuleList or "
                        "ModuleDict, or derive from hybridplan::BlockList",
                        module->name());
    }
    // One module with parameters at two positions of a container is a module called twice.
    // The Python profiler makes that a node per call sharing the parameters as tied weights
    // (docs/models.md); here each block would count and train the parameters as its own, so
    // such a container is refused rather than planned wrong. A parameter-free module (one
    // ReLU used twice) is a function, and each use a block of its own.
    if (!module->parameters().empty()) {
      const auto [first, inserted] = first_name_of.emplace(module.get(), name);
      if (!inserted) {
        throw_input_error("profile", "module." + name,
                          "is the module already at module." + first->second +
                              ", and holds parameters: the C++ profiler needs each block to own "
                              "its parameters (profile the model in Python, which makes each "
                              "call a node with tied parameters)",
                          module->name());
      }
    }
    if (!callable) callable = known_layer(module);
    if (!callable) {
      throw_input_error("profile", "module." + name,
                        "must be a LibTorch layer, a container or a hybridplan::BlockList to be "
                        "called from a ModuleList/ModuleDict (wrap it in a Sequential)",
                        module->name());
    }
    blocks.push_back({name, "", module, any_module_forward(*callable, name)});
  }

  // Adds the children of a Sequential/ModuleList/ModuleDict; false for any other module.
  bool expand(const std::string& prefix, nn::Module& module) {
    if (auto* seq = dynamic_cast<nn::SequentialImpl*>(&module)) {
      const auto children = seq->named_children();  // registration order == modules_ order
      size_t i = 0;
      for (const nn::AnyModule& any : *seq) add(prefix + children[i++].key(), any.ptr(), any);
      return true;
    }
    if (auto* list = dynamic_cast<nn::ModuleListImpl*>(&module)) {
      for (const auto& child : list->named_children()) {
        add(prefix + child.key(), child.value(), std::nullopt);
      }
      return true;
    }
    if (auto* dict = dynamic_cast<nn::ModuleDictImpl*>(&module)) {
      for (const auto& child : dict->named_children()) {
        add(prefix + child.key(), child.value(), std::nullopt);
      }
      return true;
    }
    return false;
  }
};

}  // namespace

std::vector<Block> blocks_of(nn::Module& module) {
  if (auto* list = dynamic_cast<BlockList*>(&module)) return list->blocks();
  Collector collector;
  if (!collector.expand("", module)) {
    throw_input_error("profile", "module",
                      "must be a Sequential, ModuleList, ModuleDict or derive from "
                      "hybridplan::BlockList",
                      module.name());
  }
  return std::move(collector.blocks);
}

BlockForward any_module_forward(nn::AnyModule module, const std::string& name) {
  return [module, name](const std::vector<torch::Tensor>& inputs) mutable {
    nn::AnyValue out = [&] {
      switch (inputs.size()) {
        case 1: return module.any_forward(inputs[0]);
        case 2: return module.any_forward(inputs[0], inputs[1]);
        case 3: return module.any_forward(inputs[0], inputs[1], inputs[2]);
        default:
          throw_input_error("profile", "inputs", "must hold 1 to 3 tensors for block '" + name + "'",
                            std::to_string(inputs.size()));
      }
    }();
    if (auto* tensor = out.try_get<torch::Tensor>()) return BlockOutput(*tensor);
    throw_input_error("profile", "module." + name,
                      "must return one Tensor (blocks pass one tensor to the next)",
                      c10::demangle(out.type_info().name()));
  };
}

std::string op_of(const nn::Module& module) {
  std::string type = module.name();
  if (const size_t colon = type.rfind("::"); colon != std::string::npos) type.erase(0, colon + 2);
  if (type.size() > 4 && type.ends_with("Impl")) type.resize(type.size() - 4);
  // python/hybridplan/profiler/profile.py snake_case: BranchyCNN -> branchy_cnn, ReLU -> re_lu.
  static const std::regex acronym("([A-Z]+)([A-Z][a-z])"), word("([a-z])([A-Z])");
  type = std::regex_replace(std::regex_replace(type, acronym, "$1_$2"), word, "$1_$2");
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return type;
}

}  // namespace hybridplan
