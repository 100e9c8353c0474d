// Loading a PyTorch DCP checkpoint (FileSystemWriter's .distcp files) onto any mesh and layout: each
// tensor item is a torch.save'd zip archive at a byte range of a .distcp file, read with the zip reader
// (src/io/zip_archive.h) confined to that range and its data.pkl with the restricted unpickler's
// torch.save table; each rank opens only the items whose chunks overlap its shards and copies the
// overlaps with the loader's own box code (intersect, runs_within, fill_part).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <memory>

#include "../io/checked_int.h"
#include "../io/zip_archive.h"
#include "dcp_item.h"
#include "dcp_pickle_field.h"
#include "dtensor/api.h"
#include "dtensor/dcp.h"
#include "dtensor/errors.h"
#include "dtensor/pieces.h"
#include "job.h"
#include "loading.h"

namespace dtensor::checkpoint::dcp {
namespace detail {
namespace {

// A tensor's data.pkl is a few hundred bytes; a bytes entry's (a list of parameter names) a few kilobytes.
constexpr int64_t kMaxDataPklBytes = int64_t{1} << 20;

// A typed storage class of _rebuild_tensor_v2 ("torch.FloatStorage") -> its dtype.
std::optional<c10::ScalarType> storage_dtype(const std::string& cls) {
  static const std::map<std::string, c10::ScalarType> classes = {
      {"torch.DoubleStorage", c10::kDouble},     {"torch.FloatStorage", c10::kFloat},        {"torch.HalfStorage", c10::kHalf},
      {"torch.BFloat16Storage", c10::kBFloat16}, {"torch.LongStorage", c10::kLong},          {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},       {"torch.CharStorage", c10::kChar},          {"torch.ByteStorage", c10::kByte},
      {"torch.BoolStorage", c10::kBool},         {"torch.ComplexFloatStorage", c10::kComplexFloat},
      {"torch.ComplexDoubleStorage", c10::kComplexDouble}};
  const auto it = classes.find(cls);
  if (it == classes.end()) return std::nullopt;
  return it->second;
}

std::vector<int64_t> ints_of(const Field& f) {
  std::vector<int64_t> out;
  for (const Field& e : f.elements()) out.push_back(e.as_int());
  return out;
}

}  // namespace

// A tensor item, opened and checked: where its elements are in its storage's record.
struct TensorItem {
  std::unique_ptr<io::ZipArchive> zip;
  const io::ZipEntry* record = nullptr;  // data/<key>: the storage's bytes
  c10::ScalarType dtype = c10::kFloat;
  int64_t storage_numel = 0;
  int64_t storage_offset = 0;  // elements
  std::vector<int64_t> sizes, strides;
  bool row_major = true;  // the strides of a contiguous tensor of `sizes`
};

SavedItem open_saved_item(const std::string& dir, const DcpStorage& storage, const std::string& what, const io::PickleRules& rules) {
  const std::string path = (std::filesystem::path(dir) / storage.relative_path).string();
  const auto end = io::checked_add(storage.offset, storage.length);
  const std::string name = path + ": bytes [" + std::to_string(storage.offset) + ", " +
                           (end ? std::to_string(*end) : std::string("past int64")) + ") (" + what + ")";
  if (!storage.transform_descriptors.empty())
    throw DTensorError(name + ": stored through the transforms '" + storage.transform_descriptors.front() +
                       "'...: dtensor reads untransformed items only (FileSystemWriter without extensions)");
  auto zip = std::make_unique<io::ZipArchive>(path, storage.offset, storage.length, name);
  if (const io::ZipEntry* order = zip->find("byteorder")) {
    const std::string text = zip->read_text(*order, 16);
    if (text != "little") zip->fail(*order, "byte order '" + text.substr(0, 16) + "': dtensor reads little-endian items only");
  }
  const io::ZipEntry* pkl = zip->find("data.pkl");
  if (!pkl) throw DTensorError(name + ": no data.pkl: not a torch.save'd item (DCP's TORCH_SAVE format)");
  PickleTree tree = io::unpickle_restricted(zip->read_text(*pkl, kMaxDataPklBytes), name + ": data.pkl", rules);
  return {std::move(zip), std::move(tree)};
}

TensorItem open_tensor_item(const std::string& dir, const DcpStorage& storage, const std::string& fqn, const DcpChunk& chunk,
                            c10::ScalarType dtype) {
  SavedItem saved = open_saved_item(dir, storage, "item " + name_text(fqn) + " at " + ints_str(chunk.offsets), io::torch_tensor_pickle());
  TensorItem item;
  item.zip = std::move(saved.zip);
  const io::ZipArchive& zip = *item.zip;
  const PickleTree& tree = saved.tree;
  const Field root(tree, tree.root(), "tensor");
  const bool v3 = root.kind() == PickleKind::Object && root.value().text == "torch._utils._rebuild_tensor_v3";
  const std::vector<Field> args = root.reduced_args(v3 ? "torch._utils._rebuild_tensor_v3" : "torch._utils._rebuild_tensor_v2");
  // v2: (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]); v3 adds the dtype.
  const size_t want = v3 ? 7 : 6;
  if (args.size() != want && !(args.size() == want + 1 && args[want].is_none()))
    root.fail(std::to_string(args.size()) + " arguments to the rebuild function, not " + std::to_string(want) +
              " (a tensor with Python attributes is not a checkpoint's chunk)");

  // The storage: BINPERSID of ('storage', class, key, location, numel).
  const Field& pid_field = args[0];
  if (pid_field.kind() != PickleKind::PersistentId) pid_field.expected("the storage's persistent id");
  const Field pid = pid_field.child(pid_field.value().items.at(0), ".pid");
  const std::vector<Field> p = pid.elements();
  if (p.size() != 5) pid.fail("a persistent id of " + std::to_string(p.size()) + " values, not 5");
  if (p[0].as_string() != "storage") p[0].fail("a persistent id of kind " + name_text(p[0].as_string()) + ", not 'storage'");
  if (p[1].kind() != PickleKind::Global) p[1].expected("a storage class");
  const std::string& cls = p[1].value().text;
  const std::string& key = p[2].as_string();
  p[3].as_string();  // the location it was saved from ("cpu")
  const int64_t numel = p[4].as_int();
  if (v3) {
    if (cls != "torch.storage.UntypedStorage") p[1].expected("torch.storage.UntypedStorage (what _rebuild_tensor_v3 takes)");
    item.dtype = dtype_of(args[6]);
  } else {
    const auto typed = storage_dtype(cls);
    if (!typed) p[1].expected("a typed storage class (torch.FloatStorage...)");
    item.dtype = *typed;
  }
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(item.dtype));
  // UntypedStorage counts bytes, a typed storage elements.
  if (v3 && numel % element_size) p[4].fail("an untyped storage of " + std::to_string(numel) + " bytes for elements of " +
                                            std::to_string(element_size) + " bytes");
  item.storage_numel = v3 ? numel / element_size : numel;
  item.record = zip.find("data/" + key);
  if (!item.record) p[2].fail("the storage's record 'data/" + key.substr(0, 100) + "' is not in the archive");
  const auto record_bytes = io::checked_mul(item.storage_numel, element_size);
  if (!record_bytes || *record_bytes != item.record->size)
    p[4].fail("a storage of " + std::to_string(item.storage_numel) + " " + c10::toString(item.dtype) + " elements in a record of " +
              std::to_string(item.record->size) + " bytes");

  // The tensor in its storage.
  item.storage_offset = args[1].as_int();
  item.sizes = ints_of(args[2]);
  item.strides = ints_of(args[3]);  // as_int: non-negative, as torch.save writes them
  if (item.strides.size() != item.sizes.size())
    args[3].fail(std::to_string(item.strides.size()) + " strides for " + std::to_string(item.sizes.size()) + " dims");
  args[4].as_bool();  // requires_grad
  const std::vector<Field> hooks = args[5].reduced_args("collections.OrderedDict");
  if (!hooks.empty()) args[5].fail("backward hooks made from " + std::to_string(hooks.size()) + " arguments (a saved chunk has none)");
  const auto tensor_numel = io::checked_numel(item.sizes);
  if (!tensor_numel) args[2].fail("a size of more elements than int64 counts");
  const auto extent = io::checked_extent(item.sizes, item.strides);
  const auto last = extent ? io::checked_add(item.storage_offset, *extent) : std::nullopt;
  if (*tensor_numel > 0 && (!last || *last > item.storage_numel))
    args[2].fail("a tensor of size " + ints_str(item.sizes) + ", stride " + ints_str(item.strides) + " at offset " +
                 std::to_string(item.storage_offset) + " reaches past its storage of " + std::to_string(item.storage_numel) +
                 " elements");
  int64_t expected_stride = 1;  // a suffix product of the sizes: at most their product, which fits
  for (size_t d = item.sizes.size(); d-- > 0 && *tensor_numel > 0;) {
    if (item.sizes[d] != 1 && item.strides[d] != expected_stride) item.row_major = false;
    expected_stride *= item.sizes[d];
  }

  // Against the metadata.
  if (item.dtype != dtype)
    root.fail("a tensor of " + std::string(c10::toString(item.dtype)) + ", but the metadata says " + name_text(fqn) + " is " +
              c10::toString(dtype));
  if (item.sizes != chunk.sizes)
    args[2].fail("a tensor of size " + ints_str(item.sizes) + ", but the metadata's chunk has sizes " + ints_str(chunk.sizes));
  return item;
}

// The elements of `part` (inside the item's chunk `chunk`, global coordinates), row-major, into `out`.
void read_item_part(const TensorItem& item, const Box& chunk, const Box& part, char* out) {
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(item.dtype));
  if (item.row_major) {
    std::vector<io::RecordRange> ranges;
    for (const ContiguousRun& run : runs_within(chunk, part))
      ranges.push_back({(item.storage_offset + run.piece_offset) * element_size, run.length * element_size,
                        out + run.part_offset * element_size});
    item.zip->read_ranges(*item.record, std::move(ranges));
    return;
  }
  // Other strides (a transposed tensor saved as it was): the whole storage, then the part by view.
  at::Tensor storage = at::empty({item.storage_numel}, at::TensorOptions().dtype(item.dtype));
  item.zip->read_into(*item.record, storage.data_ptr());
  at::Tensor region = storage.as_strided(item.sizes, item.strides, item.storage_offset);
  for (size_t d = 0; d < part.shape.size(); ++d)
    region = region.narrow(static_cast<int64_t>(d), part.offset[d] - chunk.offset[d], part.shape[d]);
  at::from_blob(out, part.shape, at::TensorOptions().dtype(item.dtype)).copy_(region);
}

}  // namespace detail

at::Tensor read_tensor_item(const std::string& dir, const DcpStorage& storage, const std::string& fqn, const DcpChunk& chunk,
                            c10::ScalarType dtype) {
  const detail::TensorItem item = detail::open_tensor_item(dir, storage, fqn, chunk, dtype);
  at::Tensor out = at::empty(chunk.sizes, at::TensorOptions().dtype(dtype));
  const Box box{chunk.offsets, chunk.sizes};
  if (out.numel() > 0) detail::read_item_part(item, box, box, static_cast<char*>(out.data_ptr()));
  return out;
}

LoadResult load(const State& state, const std::string& dir, const LoadOptions& options) {
  if (options.node_local)
    throw DTensorError("dcp::load: node_local loading is for dtensor's own checkpoints; every rank must see " + dir);
  checkpoint::detail::check_partitioned(options.partitioned, options.node_local, options.world, "load");
  const checkpoint::detail::Job job = checkpoint::detail::Job::of(state, options.world, "dcp::load");
  LoadResult result;
  std::exception_ptr error;
  try {
    const DcpMetadata md = read_metadata(dir);
    std::set<std::string> tensors;
    for (const auto& [fqn, entry] : md.entries) {
      if (std::holds_alternative<DcpTensor>(entry)) {
        tensors.insert(fqn);
      } else {
        if (state.count(fqn))
          throw DTensorError("dcp::load: " + dir + " holds " + name_text(fqn) +
                             " as bytes (a torch.save'd Python object, not a tensor): dtensor does not load those; leave it out of the state");
        result.skipped.push_back(fqn);
      }
    }
    checkpoint::detail::match_names(state, tensors, "dcp::load", dir, options.strict, result, options.partitioned);
    std::map<std::pair<std::string, std::vector<int64_t>>, const DcpStorage*> storage_of;
    for (const auto& [index, storage] : md.storage)
      if (index.offset) storage_of[{index.fqn, *index.offset}] = &storage;
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : state) {
      if (!tensors.count(name)) continue;
      const DcpTensor& saved = std::get<DcpTensor>(md.entries.at(name));
      if (tensor.sizes().vec() != saved.size)
        throw DTensorError("dcp::load: tensor " + name_text(name) + " has shape " + ints_str(tensor.sizes().vec()) + " but " + dir +
                           " holds it with shape " + ints_str(saved.size) +
                           "; build the model with the checkpoint's sizes or leave this tensor out (strict = false)");
      auto target = checkpoint::detail::target_of(name, tensor);
      if (!target) continue;
      auto& [box, destination] = *target;
      for (const DcpChunk& chunk : saved.chunks) {
        const Box chunk_box{chunk.offsets, chunk.sizes};
        const auto part = intersect(chunk_box, box);
        if (!part) continue;
        const auto where = storage_of.find({name, chunk.offsets});
        if (where == storage_of.end())  // read_metadata checks it; kept for a DcpMetadata made otherwise
          throw DTensorError("dcp::load: " + dir + ": the chunk of " + name_text(name) + " at " + ints_str(chunk.offsets) + " has no storage");
        const detail::TensorItem item = detail::open_tensor_item(dir, *where->second, name, chunk, saved.dtype);
        result.bytes_read += checkpoint::detail::fill_part(*part, box, destination, saved.dtype,
                                                           [&](char* out) { detail::read_item_part(item, chunk_box, *part, out); });
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "loading the DCP checkpoint " + dir);
  return result;
}

}  // namespace dtensor::checkpoint::dcp
