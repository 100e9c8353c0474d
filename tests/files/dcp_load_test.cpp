// The tensor items of PyTorch DCP checkpoints (torch.save'd zips at byte ranges of .distcp files): every
// item dcp.save wrote at build time (scripts/write_dcp_checkpoints.py) reads back as the values it saved,
// and crafted or damaged items (dcp_bad_items/) are refused with a DTensorError naming the file, the range,
// the item and what was wrong, never a crash.

#include <gmock/gmock.h>

#include <ATen/ATen.h>

#include <filesystem>

#include "../support/build_paths.h"
#include "../support/tensor_assertions.h"
#include "dtensor/dcp.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace dcp = dtensor::checkpoint::dcp;
namespace fs = std::filesystem;

std::string written_dir(const std::string& name) { return std::string(build_paths::checkpoint_interop) + "/dcp_written/" + name; }

// scripts/checkpoint_values.py's value() (the script's TENSORS by index), computed here on its own.
at::Tensor script_value(int64_t index, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor x = at::arange(n, at::kDouble).remainder(97).sub(48).mul(0.25).add(static_cast<double>(index));
  if (dtype == at::kLong) x = x.mul(4);
  return x.reshape(shape).to(dtype);
}

// What scripts/write_dcp_checkpoints.py saved under `fqn` (its TENSORS, and dcp_single's nested one).
at::Tensor saved_value(const std::string& fqn) {
  if (fqn == "nested.inner") return at::arange(6, at::kInt).reshape({2, 3});
  static const std::vector<std::tuple<std::string, std::vector<int64_t>, at::ScalarType>> tensors = {
      {"w", {7, 5}, at::kFloat},    {"emb.weight", {10, 3}, at::kBFloat16}, {"bias", {5}, at::kHalf},
      {"counts", {3, 2}, at::kLong}, {"scale", {}, at::kDouble},            {"mask", {4}, at::kBool}};
  for (size_t i = 0; i < tensors.size(); ++i)
    if (std::get<0>(tensors[i]) == fqn) return script_value(static_cast<int64_t>(i), std::get<1>(tensors[i]), std::get<2>(tensors[i]));
  throw std::runtime_error("no value for " + fqn);
}

// Every chunk of every tensor, read on its own, is that part of what was saved.
TEST(DcpTensorItems, EveryItemHoldsItsChunkOfTheSavedValues) {
  for (const char* name : {"dcp_single", "dcp_sharded"}) {
    SCOPED_TRACE(name);
    const dcp::DcpMetadata md = dcp::read_metadata(written_dir(name));
    int items = 0;
    for (const auto& [index, storage] : md.storage) {
      const auto* t = std::get_if<dcp::DcpTensor>(&md.entries.at(index.fqn));
      if (!t) continue;
      SCOPED_TRACE(index.fqn);
      const auto chunk = std::find_if(t->chunks.begin(), t->chunks.end(), [&](const dcp::DcpChunk& c) { return c.offsets == *index.offset; });
      ASSERT_NE(chunk, t->chunks.end());
      at::Tensor want = saved_value(index.fqn);
      for (size_t d = 0; d < chunk->sizes.size(); ++d) want = want.narrow(static_cast<int64_t>(d), chunk->offsets[d], chunk->sizes[d]);
      EXPECT_TRUE(tensors_equal(dcp::read_tensor_item(written_dir(name), storage, index.fqn, *chunk, t->dtype), want));
      ++items;
    }
    EXPECT_GT(items, 6);
  }
}

dcp::DcpStorage whole_file(const std::string& file) {
  return dcp::DcpStorage{file, 0, static_cast<int64_t>(fs::file_size(written_dir("dcp_bad_items") + "/" + file)), {}};
}

at::Tensor read_crafted(const std::string& name) {
  return dcp::read_tensor_item(written_dir("dcp_bad_items"), whole_file(name + ".item"), "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kFloat);
}

// Row-major, transposed in its storage (stride (1, 2)), and _rebuild_tensor_v3 on an UntypedStorage.
TEST(DcpTensorItems, ReadsTheLayoutsTorchSaveWrites) {
  const at::Tensor want = at::arange(6, at::kFloat).reshape({2, 3});
  for (const char* name : {"good", "transposed", "v3"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(tensors_equal(read_crafted(name), want));
  }
}

void expect_item_refused(const std::string& name, const std::vector<std::string>& parts) {
  SCOPED_TRACE(name);
  const std::string error = error_of([&] { read_crafted(name); });
  EXPECT_THAT(error, AllOf(HasSubstr(name + ".item: bytes [0, "), HasSubstr("(item 'w' at [0, 0])")));
  for (const std::string& part : parts) EXPECT_THAT(error, HasSubstr(part));
}

TEST(DcpTensorItems, RefusesDamagedOrCraftedItems) {
  expect_item_refused("truncated", {"not a valid zip archive"});
  expect_item_refused("storage_too_small", {"field 'tensor(2)'", "reaches past its storage of 6 elements"});
  expect_item_refused("record_size", {"a storage of 7 Float elements in a record of 24 bytes"});
  expect_item_refused("wrong_dtype", {"a tensor of Double, but the metadata says 'w' is Float"});
  expect_item_refused("wrong_size", {"a tensor of size [3, 2], but the metadata's chunk has sizes [2, 3]"});
  expect_item_refused("evil_global", {"data.pkl: byte", "global 'posix.system' is not one a torch.save'd tensor holds"});
  expect_item_refused("missing_record", {"the storage's record 'data/1' is not in the archive"});
  expect_item_refused("hooks", {"expects a dict below its items, found a collections.OrderedDict object"});
}

TEST(DcpTensorItems, RefusesRangesOutsideTheFile) {
  dcp::DcpStorage storage = whole_file("good.item");
  storage.offset = storage.length + 10;
  EXPECT_THAT(error_of([&] { dcp::read_tensor_item(written_dir("dcp_bad_items"), storage, "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kFloat); }),
              AllOf(HasSubstr("good.item: bytes ["), HasSubstr("lies outside the file's")));
  storage.offset = 1;  // one byte short at the end
  storage.length -= 1;
  EXPECT_THAT(error_of([&] { dcp::read_tensor_item(written_dir("dcp_bad_items"), storage, "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kFloat); }),
              HasSubstr("good.item: bytes [1, "));
  // An item of another chunk's sizes or dtype than the metadata says.
  EXPECT_THAT(error_of([&] { dcp::read_tensor_item(written_dir("dcp_bad_items"), whole_file("good.item"), "w", dcp::DcpChunk{{0, 0}, {3, 2}}, at::kFloat); }),
              HasSubstr("the metadata's chunk has sizes [3, 2]"));
  EXPECT_THAT(error_of([&] { dcp::read_tensor_item(written_dir("dcp_bad_items"), whole_file("good.item"), "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kHalf); }),
              HasSubstr("the metadata says 'w' is Half"));
}

// Every prefix of a real item is refused cleanly (a truncated .distcp file, or a length too short).
TEST(DcpTensorItems, RefusesEveryTruncation) {
  const dcp::DcpStorage good = whole_file("good.item");
  for (int64_t n = 0; n < good.length; n += 7) {
    dcp::DcpStorage s = good;
    s.length = n;
    EXPECT_THAT(error_of([&] { dcp::read_tensor_item(written_dir("dcp_bad_items"), s, "w", dcp::DcpChunk{{0, 0}, {2, 3}}, at::kFloat); }),
                HasSubstr("good.item: bytes [0, " + std::to_string(n) + ")"))
        << n;
  }
}

// Bytes entries read as the Python values dcp.save torch.save'd (write_dcp_checkpoints.py's dcp_objects).
TEST(DcpObjects, ReadsEveryBuiltinKindAsAnIValue) {
  const std::string dir = written_dir("dcp_objects");
  const auto lr = dcp::read_objects(dir, "lr");
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr.at("lr").toDouble(), 0.05);
  const c10::IValue betas = dcp::read_objects(dir, "betas").at("betas");
  ASSERT_TRUE(betas.isTuple());
  EXPECT_EQ(betas.toTupleRef().elements().at(1).toDouble(), 0.999);
  const auto n = dcp::read_objects(dir, "n");  // names, nested, nothing
  ASSERT_EQ(n.size(), 3u);
  const c10::List<c10::IValue> names = n.at("names").toList();
  EXPECT_EQ(names.get(1).toStringRef(), "head.weight");
  EXPECT_TRUE(n.at("nothing").isNone());
  const c10::List<c10::IValue> nested = n.at("nested").toList();  // [[1, 2.5], ("deep", [False])]
  EXPECT_EQ(nested.get(0).toListRef().at(0).toInt(), 1);
  EXPECT_EQ(nested.get(0).toListRef().at(1).toDouble(), 2.5);
  EXPECT_EQ(nested.get(1).toTupleRef().elements().at(0).toStringRef(), "deep");
  EXPECT_FALSE(nested.get(1).toTupleRef().elements().at(1).toListRef().at(0).toBool());
  EXPECT_TRUE(dcp::read_objects(dir, "flag").at("flag").toBool());
  const c10::Dict<c10::IValue, c10::IValue> keyed = dcp::read_objects(dir, "keyed").at("keyed").toTupleRef().elements().at(0).toGenericDict();
  EXPECT_EQ(keyed.at(std::string("x")).toInt(), -3);
  EXPECT_TRUE(keyed.at(int64_t{2}).isNone());
}

// A value the pickle refers to many times is made once and shared (as Python shares it): 200000
// references to one 400 KB string cost one string, not 80 GB of copies.
TEST(DcpObjects, SharesAValueThePickleRefersToAgain) {
  const c10::IValue value = dcp::read_object_item(written_dir("dcp_bad_items"), whole_file("shared_string.item"), "shared");
  const auto& list = value.toListRef();
  ASSERT_EQ(list.size(), 200000u);
  EXPECT_EQ(list.front().toStringRef().size(), 400000u);
  EXPECT_EQ(&list.front().toStringRef(), &list.back().toStringRef());
}

TEST(DcpObjects, RefusesObjectsOfClassesAndTensors) {
  const std::string dir = written_dir("dcp_objects");
  EXPECT_THAT(error_of([&] { dcp::read_objects(dir, "when"); }), AllOf(HasSubstr("bytes entry 'when'"), HasSubstr("datetime")));
  EXPECT_THAT(error_of([&] { dcp::read_objects(dir, "pair"); }), AllOf(HasSubstr("bytes entry 'pair'"), HasSubstr("_rebuild_tensor")));
}

}  // namespace
}  // namespace dtensor::testing
