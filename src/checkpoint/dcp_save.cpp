// PyTorch DCP's format written: the pieces a save writes (save_plan.h), each torch.save'd into this
// rank's `__<rank>_0.distcp` as FileSystemWriter lays them out, and rank 0's pickled `.metadata` naming
// every chunk and where its bytes are.

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>

#include "../io/json.h"
#include "../io/pickle_writer.h"
#include "dtensor/dcp.h"
#include "dtensor/errors.h"
#include "dtypes.h"
#include "durable_file.h"
#include "save_plan.h"

namespace dtensor::checkpoint::dcp {
namespace {

using io::PickleWriter;
using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kCurrentVersion = "1.0.0";  // filesystem.py's CURRENT_DCP_VERSION in 2.15

std::string rank_file(int64_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

// Where one chunk's bytes went: tensor `name`'s piece `chunk`, in its writer's file.
struct Written {
  std::string name;
  size_t chunk = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

void to_json(json& j, const Written& w) { j = json{w.name, w.chunk, w.offset, w.length}; }
void from_json(const json& j, Written& w) {
  w = {j.at(0).get<std::string>(), j.at(1).get<size_t>(), j.at(2).get<int64_t>(), j.at(3).get<int64_t>()};
}

// This rank's file: each piece it writes as torch.save writes the tensor alone (a zip of data.pkl and
// the storage, readable by torch.load with weights_only), one after another.
std::vector<Written> write_rank_file(const std::vector<checkpoint::detail::Saved>& saved, int rank, const fs::path& path) {
  std::string bytes;
  std::vector<Written> written;
  for (const checkpoint::detail::Saved& s : saved)
    for (size_t k = 0; k < s.pieces.size(); ++k) {
      const Piece& p = s.pieces[k];
      if (!checkpoint::detail::writes(p, rank)) continue;
      at::Tensor data = p.box.empty() ? at::empty(p.box.shape, s.local.options()) : s.local;
      // Its own storage, holding the values only (torch.save keeps a view's whole storage).
      data = data.to(at::kCPU).resolve_conj().resolve_neg().contiguous().clone();
      const std::vector<char> item = torch::jit::pickle_save(data);
      written.push_back({s.name, k, static_cast<int64_t>(bytes.size()), static_cast<int64_t>(item.size())});
      bytes.append(item.data(), item.size());
    }
  if (!written.empty()) checkpoint::detail::write_durably(path.string(), bytes);
  return written;
}

void torch_size(PickleWriter& w, const Shape& shape) {
  w.global("torch", "Size").mark().mark();
  for (int64_t d : shape) w.integer(d);
  w.tuple_from_mark().tuple_from_mark().reduce();
}

// TensorProperties' state, as its __getstate__ gives it: (dtype, layout, requires_grad, memory
// format, pin_memory, strides).
void tensor_properties(PickleWriter& w, const checkpoint::detail::Saved& s) {
  w.global(kMetadataModule, "TensorProperties").empty_tuple().newobj().mark();
  w.global("torch", checkpoint::detail::torch_dtype_name(s.scalar_type, s.name));
  w.global("torch.serialization", "_get_layout").mark().string("torch.strided").tuple_from_mark().reduce();
  w.boolean(false);
  w.global(kMetadataModule, "_MEM_FORMAT_ENCODING").mark().integer(0).tuple_from_mark().reduce();  // contiguous
  w.boolean(false).none().tuple_from_mark().build();
}

void tensor_storage_metadata(PickleWriter& w, const checkpoint::detail::Saved& s) {
  w.global(kMetadataModule, "TensorStorageMetadata").empty_tuple().newobj().empty_dict().mark();
  w.string("properties");
  tensor_properties(w, s);
  w.string("size");
  torch_size(w, s.global_shape);
  w.string("chunks").empty_list().mark();
  for (const Piece& p : s.pieces) {
    w.global(kMetadataModule, "ChunkStorageMetadata").empty_tuple().newobj().empty_dict().mark();
    w.string("offsets");
    torch_size(w, p.box.offset);
    w.string("sizes");
    torch_size(w, p.box.shape);
    w.setitems().build();
  }
  w.appends().setitems().build();
}

void storage_entry(PickleWriter& w, const checkpoint::detail::Saved& s, const Written& item, int64_t writer) {
  w.global(kMetadataModule, "MetadataIndex").empty_tuple().newobj().empty_dict().mark();
  w.string("fqn").string(s.name).string("offset");
  torch_size(w, s.pieces[item.chunk].box.offset);
  w.string("index").integer(static_cast<int64_t>(item.chunk)).setitems().build();
  w.global("torch.distributed.checkpoint.filesystem", "_StorageInfo").empty_tuple().newobj().empty_dict().mark();
  w.string("relative_path").string(rank_file(writer)).string("offset").integer(item.offset);
  w.string("length").integer(item.length).setitems().build();
}

// Metadata(state_dict_metadata, planner_data, storage_data, storage_meta, version), as pickle.dump
// writes it; `written[r]` is what rank r wrote.
std::string metadata_pickle(const std::vector<checkpoint::detail::Saved>& saved, const std::vector<std::vector<Written>>& written) {
  std::map<std::string, const checkpoint::detail::Saved*> by_name;
  for (const checkpoint::detail::Saved& s : saved) by_name[s.name] = &s;
  PickleWriter w;
  w.global(kMetadataModule, "Metadata").empty_tuple().newobj().empty_dict().mark();
  w.string("state_dict_metadata").empty_dict().mark();
  for (const checkpoint::detail::Saved& s : saved) {
    w.string(s.name);
    tensor_storage_metadata(w, s);
  }
  w.setitems();
  w.string("planner_data").empty_dict().mark();  // flatten_state_dict's mapping: a flat name is its own path
  for (const checkpoint::detail::Saved& s : saved) w.string(s.name).mark().string(s.name).tuple_from_mark();
  w.setitems();
  w.string("storage_data").empty_dict().mark();
  for (size_t rank = 0; rank < written.size(); ++rank)
    for (const Written& item : written[rank]) storage_entry(w, *by_name.at(item.name), item, static_cast<int64_t>(rank));
  w.setitems();
  w.string("storage_meta").none().string("version").string(kCurrentVersion);
  w.setitems().build();
  return w.finish();
}

}  // namespace

void save(const State& state, const std::string& dir) {
  const checkpoint::detail::Prepared prepared = checkpoint::detail::prepare(state, SaveOptions{}, /*staged=*/false);
  const checkpoint::detail::Job& job = prepared.job;
  std::exception_ptr error;
  std::vector<Written> mine;
  try {
    fs::create_directories(dir);
    mine = write_rank_file(prepared.saved, job.rank, fs::path(dir) / rank_file(job.rank));
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "writing " + dir);
  const std::vector<std::string> gathered = job.gather(json(mine).dump());
  error = nullptr;
  if (job.rank == 0) try {
      std::vector<std::vector<Written>> written;
      for (const std::string& text : gathered) written.push_back(json::parse(text).get<std::vector<Written>>());
      checkpoint::detail::sync_directory(dir);
      checkpoint::detail::write_durably((fs::path(dir) / ".metadata").string(), metadata_pickle(prepared.saved, written));
      checkpoint::detail::sync_directory(dir);
    } catch (...) {
      error = std::current_exception();
    }
  job.agree(error, "writing " + dir + "/.metadata");
}

}  // namespace dtensor::checkpoint::dcp
