// The session's state: the state_dict with the trainer's entries (checkpoints), its digests, and the
// broadcasts that make the workers' models alike.
#include <cstring>
#include <map>

#include "train/session.h"

namespace accordion {

void Session::broadcastState(int root) {
  auto& refs = model_.state();
  if (group_->onDevice()) backend_->synchronize();  // the group's collectives run after the model's work
  for (Parameter* p : refs.parameters) group_->broadcast(p->value.data(), p->value.numel(), root);
  broadcastBuffers(root);
}

int64_t Session::broadcastBuffers(int root) {
  const std::vector<Buffer*>& buffers = model_.state().buffers;
  if (buffers.empty() || group_->size() < 2) return 0;
  int64_t total = 0;
  for (const Buffer* b : buffers) total += b->value.numel();
  ensureShape(bufferPack_, {total}, *backend_);
  int64_t offset = 0;
  for (const Buffer* b : buffers) {
    backend_->copy(bufferPack_.data() + offset, b->value.data(), b->value.bytes());
    offset += b->value.numel();
  }
  if (group_->onDevice()) backend_->synchronize();  // the group's collectives run after the model's work
  group_->broadcast(bufferPack_.data(), total, root);
  offset = 0;
  for (Buffer* b : buffers) {
    backend_->copy(b->value.data(), bufferPack_.data() + offset, b->value.bytes());
    offset += b->value.numel();
  }
  return total;
}

// FNV-1a over 64-bit words (the tail bytes zero-padded), then a final avalanche: not cryptographic,
// but any changed bit changes the digest with overwhelming probability.
static uint64_t digestOf(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull ^ bytes.size();
  const size_t words = bytes.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + 8 * words, bytes.size() - 8 * words);
  h = (h ^ tail) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::vector<std::pair<std::string, uint64_t>> Session::stateDigests() {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const StateEntry& e : state(false)) out.emplace_back(e.name, digestOf(e.bytes));
  return out;
}

static StateEntry int64Entry(const std::string& name, Shape shape, const int64_t* values) {
  StateEntry e{name, "I64", shape, std::vector<uint8_t>(numelOf(shape) * sizeof(int64_t))};
  std::memcpy(e.bytes.data(), values, e.bytes.size());
  return e;
}

std::vector<StateEntry> Session::state(bool includeTrainer) {
  auto& refs = model_.state();
  // Tensors live on the backend's device: each is downloaded into its entry, all read after one wait.
  auto floatEntry = [this](const std::string& name, const Tensor& t) {
    StateEntry e{name, "F32", t.shape(), std::vector<uint8_t>(t.bytes())};
    backend_->download(e.bytes.data(), t.data(), t.bytes());
    return e;
  };
  std::vector<StateEntry> out;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) out.push_back(floatEntry(refs.parameters[index]->name, refs.parameters[index]->value));
    if (kind == 1) out.push_back(floatEntry(refs.buffers[index]->name, refs.buffers[index]->value));
    if (kind == 2) out.push_back(int64Entry(refs.counters[index].name, {}, refs.counters[index].value));
  }
  if (includeTrainer) {
    Sgd& opt = optimizer_;
    for (size_t k = 0; k < refs.parameters.size(); ++k)
      out.push_back(floatEntry("optimizer.momentum_buffer." + refs.parameters[k]->name, opt.momentumBuffers()[k]));
    const int64_t started = opt.started() ? 1 : 0;
    out.push_back(int64Entry("optimizer.started", {}, &started));
    GradientReducer& reducer = *reducer_;
    if (reducer.compressor() != Compressor::None) {
      std::vector<double> levels(reducer.size());
      for (size_t k = 0; k < reducer.size(); ++k) {
        levels[k] = reducer.level(k);
        for (auto [key, tensor] : reducer.compressorState(k))
          out.push_back(floatEntry("compressor." + key + "." + reducer.parameter(k).name, *tensor));
      }
      StateEntry e{"compressor.levels", "F64", {static_cast<int64_t>(levels.size())}, std::vector<uint8_t>(levels.size() * 8)};
      std::memcpy(e.bytes.data(), levels.data(), e.bytes.size());
      out.push_back(std::move(e));
    }
    auto streams = model_.randomStreams();
    for (size_t i = 0; i < streams.size(); ++i) {
      Random::State s = streams[i]->state();
      out.push_back(int64Entry("rng.dropout." + std::to_string(i), {4}, reinterpret_cast<const int64_t*>(s.words)));
    }
  }
  backend_->synchronize();
  return out;
}

void Session::loadState(const std::vector<StateEntry>& entries) {
  std::map<std::string, const StateEntry*> byName;
  for (const auto& e : entries) {
    if (byName.count(e.name)) throw EngineError("ERR_STATE_MISMATCH", "the state has two entries named '" + e.name + "'");
    byName[e.name] = &e;
  }
  std::vector<std::string> missing;
  std::map<std::string, bool> known;  // every name the model or its trainer reads
  auto find = [&](const std::string& name, const char* dtype, const Shape& shape, bool required) -> const StateEntry* {
    known[name] = true;
    auto it = byName.find(name);
    if (it == byName.end()) {
      if (required) missing.push_back(name);
      return nullptr;
    }
    const StateEntry& e = *it->second;
    if (e.dtype != dtype || e.shape != shape)
      throw EngineError("ERR_STATE_MISMATCH", "entry '" + name + "' is " + e.dtype + " " + shapeString(e.shape) +
                                                  " but the model expects " + dtype + " " + shapeString(shape));
    return &e;
  };
  auto& refs = model_.state();
  // Validate everything before changing anything, so a bad state leaves the session untouched.
  // Tensors are uploaded to the backend's device; counters live on the host.
  std::vector<std::pair<const StateEntry*, void*>> copies, hostCopies;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) copies.emplace_back(find(refs.parameters[index]->name, "F32", refs.parameters[index]->value.shape(), true),
                                       refs.parameters[index]->value.data());
    if (kind == 1) copies.emplace_back(find(refs.buffers[index]->name, "F32", refs.buffers[index]->value.shape(), true),
                                       refs.buffers[index]->value.data());
    if (kind == 2) hostCopies.emplace_back(find(refs.counters[index].name, "I64", {}, true), refs.counters[index].value);
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
    return out;
  };
  if (!missing.empty())
    throw EngineError("ERR_STATE_MISMATCH", std::string(missing.size() == 1 ? "the state has no entry " : "the state has no entries ") +
                                                list(missing));
  // Unknown model entries are refused (strict, as PyTorch's load_state_dict). Trainer entries of
  // another configuration (another compressor, no momentum) are not the model's and are skipped.
  // The language model's decoder.weight (PyTorch's state_dict lists the tied weight twice) must
  // equal encoder.weight: an untied model cannot load into this one.
  std::vector<std::string> unknown;
  for (const auto& [name, e] : byName) {
    if (known.count(name)) continue;
    if (name.rfind("optimizer.", 0) == 0 || name.rfind("compressor.", 0) == 0 || name.rfind("rng.", 0) == 0) continue;
    if (name == "decoder.weight" && model_.language() && byName.count("encoder.weight")) {
      const StateEntry& encoder = *byName.at("encoder.weight");
      if (e->dtype != encoder.dtype || e->shape != encoder.shape || e->bytes != encoder.bytes)
        throw EngineError("ERR_STATE_MISMATCH",
                          "entry 'decoder.weight' differs from 'encoder.weight': this language model ties its decoder to its "
                          "embedding and cannot load an untied model's weights");
      continue;
    }
    unknown.push_back(name);
  }
  if (!unknown.empty())
    throw EngineError("ERR_STATE_MISMATCH", std::string(unknown.size() == 1 ? "the state has an unknown entry " : "the state has unknown entries ") +
                                                list(unknown) + " (not in this " + model_.spec().architecture + "'s state_dict)");
  for (size_t k = 0; k < refs.parameters.size(); ++k) {
    Tensor& buffer = optimizer_.momentumBuffers()[k];
    if (auto e = find("optimizer.momentum_buffer." + refs.parameters[k]->name, "F32", buffer.shape(), false))
      copies.emplace_back(e, buffer.data());
  }
  const StateEntry* started = find("optimizer.started", "I64", {}, false);
  GradientReducer& reducer = *reducer_;
  const StateEntry* levels = reducer.compressor() != Compressor::None
                                 ? find("compressor.levels", "F64", {static_cast<int64_t>(reducer.size())}, false)
                                 : nullptr;
  if (levels) {
    const double* v = reinterpret_cast<const double*>(levels->bytes.data());
    for (size_t k = 0; k < reducer.size(); ++k)
      if (reducer.parameter(k).value.rank() > 1) reducer.checkLevel(v[k], "saved level of '" + reducer.parameter(k).name + "'");
  }
  std::vector<std::pair<const StateEntry*, Random*>> streams;
  auto randomStreams = model_.randomStreams();
  for (size_t i = 0; i < randomStreams.size(); ++i)
    if (auto e = find("rng.dropout." + std::to_string(i), "I64", {4}, false)) streams.emplace_back(e, randomStreams[i]);

  // Levels first: a level change re-draws Q, which the saved Q then overwrites.
  if (levels) {
    const double* v = reinterpret_cast<const double*>(levels->bytes.data());
    for (size_t k = 0; k < reducer.size(); ++k)
      if (reducer.parameter(k).value.rank() > 1) reducer.setLevel(k, v[k]);
  }
  for (size_t k = 0; k < reducer.size(); ++k)
    for (auto [key, tensor] : reducer.compressorState(k))
      if (auto e = find("compressor." + key + "." + reducer.parameter(k).name, "F32", tensor->shape(), false))
        backend_->upload(tensor->data(), e->bytes.data(), e->bytes.size());
  for (auto [entry, target] : copies) backend_->upload(target, entry->bytes.data(), entry->bytes.size());
  for (auto [entry, target] : hostCopies) std::memcpy(target, entry->bytes.data(), entry->bytes.size());
  if (started) optimizer_.setStarted(*reinterpret_cast<const int64_t*>(started->bytes.data()) != 0);
  for (auto [entry, stream] : streams) {
    Random::State s;
    std::memcpy(s.words, entry->bytes.data(), sizeof(s.words));
    stream->setState(s);
  }
}


}  // namespace accordion
