// PyTorch DCP's .metadata: the restricted unpickler's tree (src/io/restricted_pickle.h) mapped onto
// dtensor::checkpoint::dcp's structs, every field checked by a schema (the dataclasses of
// torch/distributed/checkpoint/metadata.py and filesystem.py's _StorageInfo in PyTorch 2.15), never
// by walking the tree freely (it may share values or hold cycles).

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "../io/checked_int.h"
#include "../io/restricted_pickle.h"
#include "dcp_pickle_field.h"
#include "dtensor/dcp.h"
#include "dtensor/errors.h"

namespace dtensor::checkpoint::dcp {
namespace {

namespace fs = std::filesystem;
using io::PickleKind;
using io::PickleRef;
using io::PickleTree;
using detail::dtype_of;
using detail::Field;
using detail::ints_str;
using detail::name_text;

constexpr int64_t kMaxMetadataBytes = int64_t{1} << 30;
constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";

// The members of a dataclass's state dict: `required` must be there, anything outside `required` and
// `optional` is refused (a field this reader does not know would be ignored silently otherwise).
std::map<std::string, Field> dataclass_members(const Field& state, const std::string& cls, const std::vector<std::string>& required,
                                               const std::vector<std::string>& optional) {
  std::map<std::string, Field> m = state.members();
  for (const std::string& name : required)
    if (!m.count(name)) state.fail("the " + cls + " has no field " + name_text(name));
  for (const auto& [name, field] : m)
    if (std::find(required.begin(), required.end(), name) == required.end() &&
        std::find(optional.begin(), optional.end(), name) == optional.end())
      field.fail("a field " + cls + " of PyTorch 2.15 does not have");
  return m;
}

// TensorProperties' __getstate__: (dtype, layout, requires_grad, memory format encoding, pin_memory[, strides]).
void read_properties(const Field& f, DcpTensor& t) {
  const auto state = f.object_state(std::string(kMeta) + "TensorProperties");
  if (!state) f.fail("a TensorProperties without its state");
  const std::vector<Field> p = state->elements();
  if (p.size() != 5 && p.size() != 6) state->fail("a TensorProperties state of " + std::to_string(p.size()) + " values, not 5 or 6");
  t.dtype = dtype_of(p[0]);
  const std::vector<Field> layout = p[1].reduced_args("torch.serialization._get_layout");
  if (layout.size() != 1 || layout[0].kind() != PickleKind::String || layout[0].as_string() != "torch.strided")
    p[1].fail("a layout other than torch.strided (DCP saves dense tensors)");
  t.requires_grad = p[2].as_bool();
  const std::vector<Field> format = p[3].reduced_args(std::string(kMeta) + "_MEM_FORMAT_ENCODING");
  if (format.size() != 1) p[3].fail("a memory format made from " + std::to_string(format.size()) + " arguments");
  format[0].as_int(0, 2);  // contiguous, channels last, preserve
  t.pin_memory = p[4].as_bool();
  if (p.size() == 6 && !p[5].is_none()) {
    t.strides.emplace();
    for (const Field& s : p[5].elements()) t.strides->push_back(s.as_int());
    if (t.strides->size() != t.size.size())
      p[5].fail(std::to_string(t.strides->size()) + " strides for a tensor of " + std::to_string(t.size.size()) + " dims");
  }
}

// The chunks must lie inside the tensor, be disjoint, and hold all of its elements together (what DCP's
// planner checks when it saves: _validate_global_plan).
void check_tiling(const Field& f, const DcpTensor& t) {
  const auto total = io::checked_numel(t.size);
  if (!total) f.fail("a tensor of size " + ints_str(t.size) + " has more elements than int64 counts");
  std::optional<int64_t> held = 0;  // nullopt past int64: then chunks overlap, which the sweep reports
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const DcpChunk& c = t.chunks[i];
    for (size_t d = 0; d < t.size.size(); ++d) {
      const auto end = io::checked_add(c.offsets[d], c.sizes[d]);
      if (!end || *end > t.size[d])
        f.fail("chunk " + std::to_string(i) + " at " + ints_str(c.offsets) + " of sizes " + ints_str(c.sizes) +
               " lies outside the tensor's size " + ints_str(t.size));
    }
    if (held) held = io::checked_add(*held, *io::checked_numel(c.sizes));  // inside the tensor: it fits
  }
  // Overlaps, by a sweep along the dim whose chunk offsets differ most (as the catalog's check_tiling):
  // each chunk against the ones starting before it ends there. Empty chunks overlap nothing and are
  // left out, so that many of them cost no pairs.
  const size_t ndim = t.size.size();
  std::vector<size_t> order;
  for (size_t i = 0; i < t.chunks.size(); ++i)
    if (io::checked_numel(t.chunks[i].sizes) != 0) order.push_back(i);
  size_t sweep = 0, most = 0;
  for (size_t d = 0; d < ndim; ++d) {
    std::set<int64_t> starts;
    for (size_t i : order) starts.insert(t.chunks[i].offsets[d]);
    if (starts.size() > most) most = starts.size(), sweep = d;
  }
  const auto start = [&](size_t i) { return ndim ? t.chunks[i].offsets[sweep] : 0; };
  const auto stop = [&](size_t i) { return ndim ? t.chunks[i].offsets[sweep] + t.chunks[i].sizes[sweep] : 1; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
  for (size_t a = 0; a < order.size(); ++a)
    for (size_t b = a + 1; b < order.size() && start(order[b]) < stop(order[a]); ++b) {
      const DcpChunk& x = t.chunks[order[a]];
      const DcpChunk& y = t.chunks[order[b]];
      bool shared = true;
      for (size_t d = 0; d < ndim && shared; ++d)
        shared = std::max(x.offsets[d], y.offsets[d]) < std::min(x.offsets[d] + x.sizes[d], y.offsets[d] + y.sizes[d]);
      if (shared)
        f.fail("chunks " + std::to_string(std::min(order[a], order[b])) + " at " + ints_str(t.chunks[std::min(order[a], order[b])].offsets) +
               " and " + std::to_string(std::max(order[a], order[b])) + " at " + ints_str(t.chunks[std::max(order[a], order[b])].offsets) +
               " overlap");
    }
  if (held != total)
    f.fail("the chunks hold " + std::to_string(*held) + " of the tensor's " + std::to_string(*total) + " elements (size " +
           ints_str(t.size) + ")");
}

DcpTensor read_tensor(const Field& f, const std::optional<Field>& state) {
  if (!state) f.fail("a TensorStorageMetadata without its state");
  const std::string cls = "TensorStorageMetadata";
  auto m = dataclass_members(*state, cls, {"properties", "size", "chunks"}, {});
  DcpTensor t;
  t.size = m.at("size").as_size();
  read_properties(m.at("properties"), t);
  for (const Field& c : m.at("chunks").list()) {
    const auto cs = c.object_state(std::string(kMeta) + "ChunkStorageMetadata");
    if (!cs) c.fail("a ChunkStorageMetadata without its state");
    auto cm = dataclass_members(*cs, "ChunkStorageMetadata", {"offsets", "sizes"}, {});
    DcpChunk chunk{cm.at("offsets").as_size(), cm.at("sizes").as_size()};
    if (chunk.offsets.size() != t.size.size()) cm.at("offsets").fail(std::to_string(chunk.offsets.size()) + " offsets for a tensor of " + std::to_string(t.size.size()) + " dims");
    if (chunk.sizes.size() != t.size.size()) cm.at("sizes").fail(std::to_string(chunk.sizes.size()) + " sizes for a tensor of " + std::to_string(t.size.size()) + " dims");
    t.chunks.push_back(std::move(chunk));
  }
  check_tiling(m.at("chunks"), t);
  return t;
}

DcpEntry read_entry(const Field& f) {
  if (f.kind() == PickleKind::Object && f.value().text == std::string(kMeta) + "BytesStorageMetadata") {
    if (const auto state = f.object_state(f.value().text)) dataclass_members(*state, "BytesStorageMetadata", {}, {});
    return DcpBytes{};
  }
  if (f.kind() != PickleKind::Object || f.value().text != std::string(kMeta) + "TensorStorageMetadata")
    f.expected("a TensorStorageMetadata or BytesStorageMetadata object");
  return read_tensor(f, f.object_state(f.value().text));
}

DcpItemIndex read_index(const Field& f) {
  const auto state = f.object_state(std::string(kMeta) + "MetadataIndex");
  if (!state) f.fail("a MetadataIndex without its state");
  auto m = dataclass_members(*state, "MetadataIndex", {"fqn"}, {"offset", "index"});
  DcpItemIndex index;
  index.fqn = m.at("fqn").as_string();
  if (m.count("offset") && !m.at("offset").is_none()) index.offset = m.at("offset").as_size();
  if (m.count("index") && !m.at("index").is_none()) index.index = m.at("index").as_int();
  return index;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

DcpStorage read_storage(const Field& f) {
  const auto state = f.object_state("torch.distributed.checkpoint.filesystem._StorageInfo");
  if (!state) f.fail("a _StorageInfo without its state");
  auto m = dataclass_members(*state, "_StorageInfo", {"relative_path", "offset", "length"}, {"transform_descriptors"});
  DcpStorage s;
  s.relative_path = m.at("relative_path").as_string();
  if (!is_plain_file_name(s.relative_path))
    m.at("relative_path").fail("the path " + name_text(s.relative_path) + " is not a file of the checkpoint's directory");
  s.offset = m.at("offset").as_int();
  s.length = m.at("length").as_int();
  if (!io::checked_add(s.offset, s.length)) m.at("length").fail("offset + length is past int64");
  if (m.count("transform_descriptors") && !m.at("transform_descriptors").is_none())
    for (const Field& d : m.at("transform_descriptors").elements(true)) s.transform_descriptors.push_back(d.as_string());
  return s;
}

// A path as pickled (pathlib's REDUCE on its parts): the parts joined with '/'.
std::optional<std::string> read_checkpoint_id(const Field& f) {
  if (f.is_none()) return std::nullopt;
  if (f.kind() == PickleKind::String) return f.as_string();
  if (f.kind() != PickleKind::Object || !f.value().reduced || f.value().text.rfind("pathlib.", 0) != 0) f.expected("None, a string or a path");
  std::string path;
  for (const Field& part : f.reduced_args(f.value().text)) {
    const std::string& p = part.as_string();
    path += path.empty() || path.back() == '/' ? p : "/" + p;
  }
  return path;
}

DcpStorageMeta read_storage_meta(const Field& f) {
  const auto state = f.object_state(std::string(kMeta) + "StorageMeta");
  DcpStorageMeta sm;
  if (!state) return sm;
  auto m = dataclass_members(*state, "StorageMeta", {}, {"checkpoint_id", "save_id", "load_id", "modules"});
  if (m.count("checkpoint_id")) sm.checkpoint_id = read_checkpoint_id(m.at("checkpoint_id"));
  if (m.count("save_id")) sm.save_id = m.at("save_id").as_optional_string();
  if (m.count("load_id")) sm.load_id = m.at("load_id").as_optional_string();
  if (m.count("modules"))
    for (const Field& mod : m.at("modules").elements(true)) sm.modules.push_back(mod.as_string());
  return sm;
}

// Every item has its storage once: each chunk of each tensor (by its offsets) and each bytes entry.
void check_storage(const Field& f, const DcpMetadata& md) {
  std::map<std::string, std::set<std::vector<int64_t>>> chunk_offsets;  // fqn -> its chunks' offsets
  for (const auto& [fqn, entry] : md.entries)
    if (const auto* t = std::get_if<DcpTensor>(&entry))
      for (const DcpChunk& c : t->chunks) chunk_offsets[fqn].insert(c.offsets);
  std::map<std::string, std::set<std::vector<int64_t>>> stored;  // fqn -> offsets seen (bytes: {})
  const std::vector<std::pair<Field, Field>> fields = f.items();
  for (size_t i = 0; i < md.storage.size(); ++i) {
    const DcpItemIndex& index = md.storage[i].first;
    const Field& key = fields[i].first;
    const auto entry = md.entries.find(index.fqn);
    if (entry == md.entries.end()) key.fail("storage for " + name_text(index.fqn) + ", which state_dict_metadata does not list");
    if (std::holds_alternative<DcpTensor>(entry->second)) {
      if (!index.offset) key.fail("storage for the tensor " + name_text(index.fqn) + " without a chunk offset");
      if (!chunk_offsets[index.fqn].count(*index.offset))
        key.fail("storage for a chunk of " + name_text(index.fqn) + " at " + ints_str(*index.offset) + ", which it does not have");
      if (!stored[index.fqn].insert(*index.offset).second)
        key.fail("a second storage for the chunk of " + name_text(index.fqn) + " at " + ints_str(*index.offset));
    } else {
      if (index.offset) key.fail("storage for the bytes entry " + name_text(index.fqn) + " with a chunk offset");
      if (!stored[index.fqn].insert(std::vector<int64_t>{}).second) key.fail("a second storage for the bytes entry " + name_text(index.fqn));
    }
  }
  for (const auto& [fqn, entry] : md.entries) {
    const auto* t = std::get_if<DcpTensor>(&entry);
    const size_t want = t ? t->chunks.size() : 1;
    const size_t have = stored.count(fqn) ? stored.at(fqn).size() : 0;
    if (have != want)  // two chunks at the same offsets (empty ones; others overlap) have storage for one
      f.fail("the entry " + name_text(fqn) + " has storage for " + std::to_string(have) + " of its " + std::to_string(want) + " items");
  }
}

}  // namespace

DcpMetadata parse_metadata(std::string_view bytes, const std::string& source) {
  const PickleTree tree = io::unpickle_restricted(bytes, source);
  const Field root(tree, tree.root(), "Metadata");
  const auto state = root.object_state(std::string(kMeta) + "Metadata");
  if (!state) root.fail("a Metadata without its state");
  auto m = dataclass_members(*state, "Metadata", {"state_dict_metadata", "storage_data"}, {"planner_data", "storage_meta", "version"});
  DcpMetadata md;
  for (const auto& [fqn, entry] : m.at("state_dict_metadata").members(true)) md.entries.emplace(fqn, read_entry(entry));
  const Field& storage = m.at("storage_data");
  for (const auto& [key, value] : storage.items()) md.storage.emplace_back(read_index(key), read_storage(value));
  check_storage(storage, md);
  if (m.count("version")) md.version = m.at("version").as_optional_string();
  if (m.count("storage_meta") && !m.at("storage_meta").is_none()) md.storage_meta = read_storage_meta(m.at("storage_meta"));
  return md;
}

DcpMetadata read_metadata(const std::string& path) {
  const fs::path file = fs::is_directory(path) ? fs::path(path) / ".metadata" : fs::path(path);
  const std::string name = file.string();
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) throw DTensorError("DCP checkpoint: cannot read " + name + ": " + error.message());
  if (size > static_cast<uint64_t>(kMaxMetadataBytes))
    throw DTensorError(name + ": " + std::to_string(size) + " bytes, more than a DCP .metadata file holds (at most " +
                       std::to_string(kMaxMetadataBytes) + "): refused");
  std::ifstream in(file, std::ios::binary);
  std::string bytes(size, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size))) throw DTensorError("DCP checkpoint: cannot read " + name);
  return parse_metadata(bytes, name);
}

}  // namespace dtensor::checkpoint::dcp
