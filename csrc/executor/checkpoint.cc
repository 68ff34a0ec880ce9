#include "executor/checkpoint.h"

#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "common/error.h"

namespace hybridplan {
namespace {

std::string dtype_name(c10::ScalarType type) {
  return "torch." + std::string(c10::getDtypeNames(type).first);
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

// Python's repr of a str key: 'name'
std::string py_repr(const std::string& s) { return "'" + s + "'"; }

// type(module).__name__ of the Python twin: torch::nn::SequentialImpl -> Sequential
std::string module_class_name(const torch::nn::Module& module) {
  std::string name = module.name();
  if (const size_t colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.ends_with("Impl")) name.resize(name.size() - 4);
  return name;
}

std::string ivalue_kind(const c10::IValue& v) {
  if (v.isNone()) return "NoneType";
  if (v.isGenericDict()) return "dict";
  if (v.isList()) return "list";
  if (v.isTuple()) return "tuple";
  if (v.isString()) return "str";
  if (v.isBool()) return "bool";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isTensor()) return "Tensor";
  return v.tagKind();
}

const c10::IValue* find(const IDict& d, const std::string& key) {
  auto it = d.find(key);
  return it == d.end() ? nullptr : &it->value();
}

c10::IValue cpu_copy(const torch::Tensor& t) { return t.detach().to(torch::kCPU).clone(); }

c10::impl::GenericList string_list(const std::vector<std::string>& items) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const std::string& s : items) list.push_back(s);
  return list;
}

double number(const IDict& group, const std::string& key, const std::string& path, double fallback) {
  const c10::IValue* v = find(group, key);
  if (v == nullptr) return fallback;
  if (v->isDouble()) return v->toDouble();
  if (v->isInt()) return static_cast<double>(v->toInt());
  if (v->isBool()) return v->toBool() ? 1.0 : 0.0;
  throw_input_error(path, "optimizer.param_groups[]." + key, "must be a number", ivalue_kind(*v));
}

bool flag(const IDict& group, const std::string& key, const std::string& path, bool fallback) {
  const c10::IValue* v = find(group, key);
  if (v == nullptr) return fallback;
  if (v->isBool()) return v->toBool();
  throw_input_error(path, "optimizer.param_groups[]." + key, "must be a bool", ivalue_kind(*v));
}

torch::Tensor state_tensor(const IDict& state, const std::string& key, const std::string& name,
                           const std::string& path, const torch::Tensor& like) {
  const c10::IValue* v = find(state, key);
  if (v == nullptr || !v->isTensor()) {
    throw_input_error(path, "optimizer.state[" + py_repr(name) + "][" + py_repr(key) + "]",
                      "must be a tensor", v == nullptr ? "missing" : ivalue_kind(*v));
  }
  torch::Tensor t = v->toTensor();
  if (t.sizes() != like.sizes()) {
    throw_input_error(path, "optimizer.state[" + py_repr(name) + "][" + py_repr(key) + "]",
                      "must have the parameter's shape " + shape_text(like.sizes()), shape_text(t.sizes()));
  }
  return t.to(like.device(), like.scalar_type()).clone();
}

}  // namespace

NamedTensors module_state(torch::nn::Module& module) {
  NamedTensors state;
  for (const auto& m : module.named_modules()) {
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      state.emplace_back(prefix + p.key(), p.value());
    }
    for (const auto& b : m.value()->named_buffers(/*recurse=*/false)) {
      state.emplace_back(prefix + b.key(), b.value());
    }
  }
  return state;
}

ParameterNames canonical_parameter_names(torch::nn::Module& module) {
  ParameterNames names;
  for (const auto& p : module.named_parameters()) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  return names;  // emplace keeps the first name of a tensor registered twice
}

std::vector<char> pickle_plain(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> file;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    file.insert(file.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return file;
}

IDict new_dict() { return IDict(c10::StringType::get(), c10::AnyType::get()); }

IDict build_checkpoint(IDict model, IDict optimizer, int64_t step, const std::string& plan_json,
                       const std::string& graph_sha256) {
  IDict root = new_dict();
  root.insert("format", std::string(kCheckpointFormat));
  root.insert("version", kCheckpointVersion);
  root.insert("model", std::move(model));
  root.insert("optimizer", std::move(optimizer));
  root.insert("step", step);
  root.insert("plan", plan_json);
  root.insert("graph_sha256", graph_sha256);
  return root;
}

std::string optimizer_class_name(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) return "Adam";
  return "";
}

IDict optimizer_state_by_name(const torch::optim::Optimizer& optimizer, const ParameterNames& names) {
  const std::string cls = optimizer_class_name(optimizer);
  if (cls.empty()) {
    throw InputError("checkpoint: the optimizer must be torch::optim::SGD or torch::optim::Adam, "
                     "whose state maps onto Python's (docs/formats.md \"Checkpoint\")");
  }
  IDict state = new_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const auto& group : optimizer.param_groups()) {
    IDict g = new_dict();
    if (cls == "SGD") {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      g.insert("lr", o.lr());
      g.insert("momentum", o.momentum());
      g.insert("dampening", o.dampening());
      g.insert("weight_decay", o.weight_decay());
      g.insert("nesterov", o.nesterov());
    } else {
      const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
      g.insert("lr", o.lr());
      g.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
      g.insert("eps", o.eps());
      g.insert("weight_decay", o.weight_decay());
      g.insert("amsgrad", o.amsgrad());
    }
    std::vector<std::string> params;
    for (const torch::Tensor& p : group.params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      if (name == names.end()) continue;
      params.push_back(name->second);
      auto found = optimizer.state().find(p.unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;  // never took a step
      IDict s = new_dict();
      if (cls == "SGD") {
        const auto& st = static_cast<const torch::optim::SGDParamState&>(*found->second);
        if (st.momentum_buffer().defined()) s.insert("momentum_buffer", cpu_copy(st.momentum_buffer()));
      } else {
        const auto& st = static_cast<const torch::optim::AdamParamState&>(*found->second);
        // Python's Adam keeps step as a float32 scalar tensor
        s.insert("step", torch::tensor(static_cast<float>(st.step())));
        s.insert("exp_avg", cpu_copy(st.exp_avg()));
        s.insert("exp_avg_sq", cpu_copy(st.exp_avg_sq()));
        if (st.max_exp_avg_sq().defined()) s.insert("max_exp_avg_sq", cpu_copy(st.max_exp_avg_sq()));
      }
      if (!s.empty()) state.insert(name->second, s);
    }
    g.insert("params", string_list(params));
    groups.push_back(g);
  }
  IDict out = new_dict();
  out.insert("class", cls);
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

IDict merge_optimizer_states(const std::vector<IDict>& parts) {
  HP_INTERNAL_ASSERT(!parts.empty(), "no optimizer state to merge");
  const std::string cls = parts[0].at("class").toStringRef();
  IDict state = new_dict();
  std::vector<IDict> groups;
  std::vector<std::vector<std::string>> group_params;
  for (const IDict& part : parts) {
    if (part.at("class").toStringRef() != cls) {
      throw InputError("checkpoint: every stage must use the same optimizer class (got " + cls +
                       " and " + part.at("class").toStringRef() + ")");
    }
    for (const auto& entry : part.at("state").toGenericDict()) {
      if (!state.contains(entry.key())) state.insert(entry.key(), entry.value());
    }
    const auto part_groups = part.at("param_groups").toList();
    for (size_t i = 0; i < part_groups.size(); ++i) {
      const IDict group = part_groups.get(i).toGenericDict();
      if (i == groups.size()) {
        groups.push_back(group.copy());
        group_params.emplace_back();
      }
      for (const c10::IValue& name : group.at("params").toList()) {
        const std::string& n = name.toStringRef();
        auto& params = group_params[i];
        if (std::find(params.begin(), params.end(), n) == params.end()) params.push_back(n);
      }
    }
  }
  c10::impl::GenericList merged_groups(c10::AnyType::get());
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].insert_or_assign("params", string_list(group_params[i]));
    merged_groups.push_back(groups[i]);
  }
  IDict out = new_dict();
  out.insert("class", cls);
  out.insert("state", state);
  out.insert("param_groups", merged_groups);
  return out;
}

IDict read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": checkpoint cannot be read (no such file)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue root;
  try {
    root = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw InputError(path + ": checkpoint must be a file written by save_checkpoint (got " +
                     what.substr(0, what.find('\n')) + ")");
  }
  if (!root.isGenericDict()) {
    throw_input_error(path, "format", "must be '" + std::string(kCheckpointFormat) + "'", ivalue_kind(root));
  }
  IDict d = root.toGenericDict();
  const c10::IValue* format = find(d, "format");
  if (format == nullptr || !format->isString() || format->toStringRef() != kCheckpointFormat) {
    throw_input_error(path, "format", "must be '" + std::string(kCheckpointFormat) + "'",
                      format == nullptr ? "missing"
                      : format->isString() ? "'" + format->toStringRef() + "'"
                                           : ivalue_kind(*format));
  }
  const c10::IValue* version = find(d, "version");
  if (version == nullptr || !version->isInt() || version->toInt() != kCheckpointVersion) {
    throw_input_error(path, "version", "must be " + std::to_string(kCheckpointVersion),
                      version == nullptr ? "missing"
                      : version->isInt() ? std::to_string(version->toInt())
                                         : ivalue_kind(*version));
  }
  const std::pair<const char*, const char*> fields[] = {
      {"model", "dict"}, {"optimizer", "dict"}, {"step", "int"}, {"plan", "str"}, {"graph_sha256", "str"}};
  for (const auto& [field, kind] : fields) {
    const c10::IValue* v = find(d, field);
    const std::string got = v == nullptr ? "NoneType" : ivalue_kind(*v);
    if (got != kind) throw_input_error(path, field, std::string("must be a ") + kind, got);
  }
  return d;
}

void check_model(const IDict& checkpoint, torch::nn::Module& module, const std::string& path) {
  const IDict theirs = checkpoint.at("model").toGenericDict();
  const std::string what = module_class_name(module);
  std::set<std::string> mine;
  for (const auto& [key, t] : module_state(module)) {
    mine.insert(key);
    const c10::IValue* c = find(theirs, key);
    if (c == nullptr) {
      throw InputError(path + ": model[" + py_repr(key) + "] must be in the checkpoint: " + what +
                       " has it, the checkpoint is of another model");
    }
    if (!c->isTensor() || c->toTensor().sizes() != t.sizes() || c->toTensor().scalar_type() != t.scalar_type()) {
      const std::string got = c->isTensor() ? dtype_name(c->toTensor().scalar_type()) + shape_text(c->toTensor().sizes())
                                            : ivalue_kind(*c);
      throw InputError(path + ": model[" + py_repr(key) + "] must be " + dtype_name(t.scalar_type()) +
                       shape_text(t.sizes()) + " as in " + what + " (got " + got +
                       "): the checkpoint is of another model");
    }
  }
  std::vector<std::string> extra;
  for (const auto& entry : theirs) {
    if (!mine.count(entry.key().toStringRef())) extra.push_back(entry.key().toStringRef());
  }
  if (!extra.empty()) {
    throw InputError(path + ": model[" + py_repr(extra[0]) + "] is not a parameter or buffer of " + what +
                     " (" + std::to_string(extra.size()) + " such keys): the checkpoint is of another model");
  }
  std::set<std::string> known;
  for (const auto& p : module.named_parameters()) known.insert(p.key());
  const IDict optimizer = checkpoint.at("optimizer").toGenericDict();
  std::vector<std::string> named;
  if (const c10::IValue* state = find(optimizer, "state"); state != nullptr && state->isGenericDict()) {
    for (const auto& entry : state->toGenericDict()) named.push_back(entry.key().toStringRef());
  }
  if (const c10::IValue* groups = find(optimizer, "param_groups"); groups != nullptr && groups->isList()) {
    for (const c10::IValue& g : groups->toList()) {
      if (!g.isGenericDict()) continue;
      if (const c10::IValue* params = find(g.toGenericDict(), "params"); params != nullptr && params->isList()) {
        for (const c10::IValue& n : params->toList()) {
          if (n.isString()) named.push_back(n.toStringRef());
        }
      }
    }
  }
  for (const std::string& name : named) {
    if (!known.count(name)) {
      throw InputError(path + ": optimizer state names " + py_repr(name) + ", which is not a parameter of " + what);
    }
  }
}

void load_model_state(const IDict& checkpoint, torch::nn::Module& module) {
  const IDict theirs = checkpoint.at("model").toGenericDict();
  torch::NoGradGuard no_grad;
  for (auto& [key, t] : module_state(module)) t.copy_(theirs.at(key).toTensor());
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const ParameterNames& names,
                          const IDict& saved, const std::string& path) {
  const std::string cls = optimizer_class_name(optimizer);
  const c10::IValue* saved_class = find(saved, "class");
  if (cls.empty() || saved_class == nullptr || !saved_class->isString() || saved_class->toStringRef() != cls) {
    throw_input_error(path, "optimizer.class",
                      "must be the optimizer resumed (" + (cls.empty() ? std::string("not SGD or Adam") : cls) + ")",
                      saved_class != nullptr && saved_class->isString() ? "'" + saved_class->toStringRef() + "'"
                                                                        : "missing");
  }
  const c10::IValue* state_value = find(saved, "state");
  const c10::IValue* groups_value = find(saved, "param_groups");
  if (state_value == nullptr || !state_value->isGenericDict()) {
    throw_input_error(path, "optimizer.state", "must be a dict", state_value ? ivalue_kind(*state_value) : "missing");
  }
  if (groups_value == nullptr || !groups_value->isList()) {
    throw_input_error(path, "optimizer.param_groups", "must be a list", groups_value ? ivalue_kind(*groups_value) : "missing");
  }
  const IDict state = state_value->toGenericDict();
  std::unordered_map<std::string, IDict> group_of;
  for (const c10::IValue& g : groups_value->toList()) {
    if (!g.isGenericDict()) throw_input_error(path, "optimizer.param_groups[]", "must be a dict", ivalue_kind(g));
    const IDict group = g.toGenericDict();
    const c10::IValue* params = find(group, "params");
    if (params == nullptr || !params->isList()) {
      throw_input_error(path, "optimizer.param_groups[].params", "must be a list of names", "missing");
    }
    for (const c10::IValue& n : params->toList()) group_of.emplace(n.toStringRef(), group);
  }
  for (auto& group : optimizer.param_groups()) {
    std::optional<IDict> source;
    for (const torch::Tensor& p : group.params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      if (name == names.end()) continue;
      if (!source) {
        if (auto g = group_of.find(name->second); g != group_of.end()) source = g->second;
      }
      const c10::IValue* s = find(state, name->second);
      if (s == nullptr) continue;
      if (!s->isGenericDict()) {
        throw_input_error(path, "optimizer.state[" + py_repr(name->second) + "]", "must be a dict", ivalue_kind(*s));
      }
      const IDict st = s->toGenericDict();
      void* key = p.unsafeGetTensorImpl();
      if (cls == "SGD") {
        auto param_state = std::make_unique<torch::optim::SGDParamState>();
        param_state->momentum_buffer(state_tensor(st, "momentum_buffer", name->second, path, p));
        optimizer.state()[key] = std::move(param_state);
      } else {
        auto param_state = std::make_unique<torch::optim::AdamParamState>();
        const c10::IValue* step = find(st, "step");
        if (step == nullptr || !(step->isTensor() || step->isInt() || step->isDouble())) {
          throw_input_error(path, "optimizer.state[" + py_repr(name->second) + "]['step']", "must be a number",
                            step == nullptr ? "missing" : ivalue_kind(*step));
        }
        const double steps = step->isTensor() ? step->toTensor().item<double>()
                             : step->isInt()  ? static_cast<double>(step->toInt())
                                              : step->toDouble();
        param_state->step(static_cast<int64_t>(steps));
        param_state->exp_avg(state_tensor(st, "exp_avg", name->second, path, p));
        param_state->exp_avg_sq(state_tensor(st, "exp_avg_sq", name->second, path, p));
        if (find(st, "max_exp_avg_sq") != nullptr) {
          param_state->max_exp_avg_sq(state_tensor(st, "max_exp_avg_sq", name->second, path, p));
        }
        optimizer.state()[key] = std::move(param_state);
      }
    }
    if (!source) continue;  // keep this group's own hyperparameters
    if (cls == "SGD") {
      auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
      o.lr(number(*source, "lr", path, o.lr()));
      o.momentum(number(*source, "momentum", path, o.momentum()));
      o.dampening(number(*source, "dampening", path, o.dampening()));
      o.weight_decay(number(*source, "weight_decay", path, o.weight_decay()));
      o.nesterov(flag(*source, "nesterov", path, o.nesterov()));
    } else {
      auto& o = static_cast<torch::optim::AdamOptions&>(group.options());
      o.lr(number(*source, "lr", path, o.lr()));
      if (const c10::IValue* betas = find(*source, "betas"); betas != nullptr) {
        const bool pair = (betas->isTuple() && betas->toTupleRef().elements().size() == 2) ||
                          (betas->isList() && betas->toList().size() == 2);
        if (!pair) throw_input_error(path, "optimizer.param_groups[].betas", "must be a pair of numbers", ivalue_kind(*betas));
        auto at = [&](size_t i) {
          const c10::IValue v = betas->isTuple() ? betas->toTupleRef().elements()[i] : betas->toList().get(i);
          if (!v.isDouble() && !v.isInt()) {
            throw_input_error(path, "optimizer.param_groups[].betas", "must be a pair of numbers", ivalue_kind(v));
          }
          return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
        };
        o.betas(std::make_tuple(at(0), at(1)));
      }
      o.eps(number(*source, "eps", path, o.eps()));
      o.weight_decay(number(*source, "weight_decay", path, o.weight_decay()));
      o.amsgrad(flag(*source, "amsgrad", path, o.amsgrad()));
    }
  }
}

}  // namespace hybridplan
