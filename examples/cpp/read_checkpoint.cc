// read_checkpoint: reads a hybridplan checkpoint (docs/formats.md "Checkpoint", written by
// AppliedPlan.save_checkpoint in Python or Executor::save_checkpoint in C++) with LibTorch alone,
// and prints what it holds:
//
//   read_checkpoint ckpt.pt
//   format hybridplan.checkpoint
//   step 1200
//   tensor stem.conv.weight [16, 3, 3, 3] 0.123456789   (one line per model key: shape, sum)
//   optimizer Adam 50                                      (class, parameters with state)
//   state stem.conv.weight exp_avg exp_avg_sq step         (one line per parameter)
//   plan_bytes 2576
//
// The file is torch.save of plain containers, which torch::pickle_load reads; the C++
// executor's load_checkpoint (executor/checkpoint.h) reads it the same way. Exit 2 with a message
// naming the file and the field if it is not a checkpoint.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace {

c10::IValue field(const c10::Dict<c10::IValue, c10::IValue>& d, const std::string& path,
                  const std::string& key) {
  auto it = d.find(key);
  if (it == d.end()) throw std::runtime_error(path + ": " + key + " must be present");
  return it->value();
}

int run(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": checkpoint cannot be read");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue root;
  try {
    root = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": checkpoint must be a torch.save file (" +
                             e.what_without_backtrace() + ")");
  }
  if (!root.isGenericDict()) throw std::runtime_error(path + ": $ must be a dict");
  auto d = root.toGenericDict();
  auto format = field(d, path, "format");
  if (!format.isString() || format.toStringRef() != "hybridplan.checkpoint") {
    throw std::runtime_error(path + ": format must be 'hybridplan.checkpoint'");
  }
  if (field(d, path, "version").toInt() != 1) throw std::runtime_error(path + ": version must be 1");
  std::cout << "format " << format.toStringRef() << "\n";
  std::cout << "step " << field(d, path, "step").toInt() << "\n";
  for (const auto& entry : field(d, path, "model").toGenericDict()) {
    const torch::Tensor t = entry.value().toTensor();
    char sum[64];
    std::snprintf(sum, sizeof sum, "%.9g", t.to(torch::kDouble).sum().item<double>());
    std::cout << "tensor " << entry.key().toStringRef() << " " << t.sizes() << " " << sum << "\n";
  }
  auto optimizer = field(d, path, "optimizer").toGenericDict();
  auto state = field(optimizer, path, "state").isGenericDict()
                   ? optimizer.at("state").toGenericDict()
                   : throw std::runtime_error(path + ": optimizer.state must be a dict");
  std::cout << "optimizer " << field(optimizer, path, "class").toStringRef() << " "
            << state.size() << "\n";
  for (const auto& entry : state) {
    std::cout << "state " << entry.key().toStringRef();
    for (const auto& kv : entry.value().toGenericDict()) std::cout << " " << kv.key().toStringRef();
    std::cout << "\n";
  }
  std::cout << "plan_bytes " << field(d, path, "plan").toStringRef().size() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: read_checkpoint CHECKPOINT\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
