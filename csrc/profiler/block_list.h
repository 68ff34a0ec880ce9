// Blocks: the units the C++ profiler measures, one graph node each.
//
// The node rule, the same as the Python profiler's (python/hybridplan/profiler/block_list.py;
// tests/python/test_node_rule.py holds the two together): a non-root module that has no
// children, or that holds parameters directly, is one node containing everything inside it
// (torch::nn::MultiheadAttention, a custom block with weights of its own); a module with
// children and no parameters of its own is looked through to its children. As far as the C++
// frontend allows: looking through is possible for containers (below) and BlockLists, so any
// other such module is an InputError naming it. Parameters held by the root itself belong to
// no block (the C++ profiler does not charge them).
//
// The C++ frontend has no generic `forward` on torch::nn::Module (it is not virtual) and no
// forward hooks, so the profiler cannot trace an arbitrary module the way the Python profiler
// does. It needs to be told what the blocks are and how to call each one. `blocks_of` derives
// them from the containers LibTorch knows how to call:
//
//   - torch::nn::Sequential: its children in order, named by their registered names ("0", "1", or
//     the names given to push_back). A child that is itself a Sequential, ModuleList or ModuleDict
//     is expanded in place with a dotted prefix ("features.0"), which is the qualified name
//     `named_modules()` gives the same leaf in Python, so plans map across the two languages.
//     (LibTorch cannot put a Sequential directly inside a Sequential, whose forward is a
//     template; nest Sequentials in a ModuleList or ModuleDict instead.)
//   - torch::nn::ModuleList / ModuleDict: the same, but their children are held as plain
//     `std::shared_ptr<Module>`, so only children of a known LibTorch layer type (Linear, Conv*,
//     pooling, activations, Embedding, norms, Flatten, ...) or containers can be called.
//   - a module that also derives from hybridplan::BlockList: its own blocks() (custom models,
//     e.g. ones whose layers return tuples, such as LSTMs).
//
// Dataflow is sequential: block i+1 receives block i's output tensor. A branchy module is
// therefore profiled as one node per top-level block (put the branches inside one block).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn.h>

namespace hybridplan {

// What a block returns. `next` feeds the next block and is what the block's backward is timed
// from; `unused` are further results no later block reads (an LSTM's final (h, c) states): they
// count in the node's output_bytes, as the Python profiler counts a module's whole output, but
// not in the edge to the next node.
struct BlockOutput {
  BlockOutput(torch::Tensor next) : next(std::move(next)) {}  // NOLINT: implicit on purpose
  BlockOutput(torch::Tensor next, std::vector<torch::Tensor> unused)
      : next(std::move(next)), unused(std::move(unused)) {}
  // Read as a tensor, a block's output is what it passes on: `x = block.forward({x});` chains.
  operator torch::Tensor() const { return next; }  // NOLINT: implicit on purpose

  torch::Tensor next;
  std::vector<torch::Tensor> unused;
};

// Runs one block on its inputs. Block 0 receives the example inputs; every later block receives
// exactly one tensor, its predecessor's `next`.
using BlockForward = std::function<BlockOutput(const std::vector<torch::Tensor>&)>;

struct Block {
  std::string name;                           // qualified name, e.g. "features.0"
  std::string op;                             // op kind; empty: derived from the module's type
  std::shared_ptr<torch::nn::Module> module;  // its parameters are the node's param_bytes
  BlockForward forward;
};

// A module that lists its own blocks: derive from it alongside torch::nn::Module, e.g.
//   struct MyModelImpl : torch::nn::Module, hybridplan::BlockList { ... };
// The blocks must be called in order, each on its predecessor's output, to compute the model.
class BlockList {
 public:
  virtual ~BlockList() = default;
  virtual std::vector<Block> blocks() = 0;
};

// The blocks of `module` (see the file comment). Throws InputError when `module` is not one of
// the supported kinds, or when a ModuleList/ModuleDict child has no forward the profiler knows.
std::vector<Block> blocks_of(torch::nn::Module& module);

// Wraps a module LibTorch can call through AnyModule into a block forward (1 to 3 inputs).
BlockForward any_module_forward(torch::nn::AnyModule module, const std::string& name);

// The class name without namespace and "Impl", in snake_case by the Python profiler's rule, so
// both profilers write the same op for the same layer: "torch::nn::Conv2dImpl" -> "conv2d",
// "torch::nn::ReLUImpl" -> "re_lu", "torch::nn::MaxPool2dImpl" -> "max_pool2d".
std::string op_of(const torch::nn::Module& module);

}  // namespace hybridplan
