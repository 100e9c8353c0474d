// dtensor's zip reader against LibTorch's (PyTorchStreamReader, the oracle) on the suite's archives,
// stored as torch.export writes them and deflated as a zip tool rewrites them; and its refusals of
// damaged data, which it notices as the bytes go by (CRC-32, deflate's own checks).

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>

#include <random>

#include "../../src/io/zip_archive.h"
#include "dtensor/graph/program.h"
#include "file_helpers.h"

namespace dtensor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string oracle_record(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name) {
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

TEST(ZipArchive, ReadsWhatLibTorchReads) {
  for (const std::string archive : {"mlp.pt2", "mlp_deflated.pt2", "gpt_joint.pt2"}) {
    SCOPED_TRACE(archive);
    const io::ZipArchive zip(graph_model(archive));
    caffe2::serialize::PyTorchStreamReader reader(graph_model(archive));
    std::vector<std::string> names;
    for (const io::ZipEntry& e : zip.entries()) names.push_back(e.name);
    std::vector<std::string> expected;
    for (const std::string& name : reader.getAllRecords())
      if (!name.empty() && name.back() != '/') expected.push_back(name);  // directory entries: LibTorch lists them, dtensor leaves them out
    std::sort(names.begin(), names.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(names, expected);
    for (const io::ZipEntry& e : zip.entries()) {
      std::string bytes(static_cast<size_t>(e.size), '\0');
      zip.read_into(e, bytes.data());
      EXPECT_EQ(bytes, oracle_record(reader, e.name)) << e.name;
    }
  }
}

TEST(ZipArchive, RangesInAnyOrderEqualTheRecordsBytes) {
  for (const std::string archive : {"gpt_joint.pt2", "mlp_deflated.pt2"}) {
    SCOPED_TRACE(archive);
    const io::ZipArchive zip(graph_model(archive));
    caffe2::serialize::PyTorchStreamReader reader(graph_model(archive));
    std::mt19937 random(7);
    for (const io::ZipEntry& e : zip.entries()) {
      if (e.size == 0) continue;
      const std::string whole = oracle_record(reader, e.name);
      std::vector<std::pair<int64_t, int64_t>> spans;  // offset, bytes: random, unordered, overlapping
      for (int k = 0; k < 6; ++k) {
        const int64_t offset = std::uniform_int_distribution<int64_t>(0, e.size - 1)(random);
        spans.emplace_back(offset, std::uniform_int_distribution<int64_t>(0, e.size - offset)(random));
      }
      spans.emplace_back(0, e.size);
      std::vector<std::string> out;
      for (const auto& [offset, bytes] : spans) out.emplace_back(static_cast<size_t>(bytes), '\0');
      std::vector<io::RecordRange> ranges;
      for (size_t k = 0; k < spans.size(); ++k) ranges.push_back({spans[k].first, spans[k].second, out[k].data()});
      zip.read_ranges(e, ranges);
      for (size_t k = 0; k < spans.size(); ++k)
        EXPECT_EQ(out[k], whole.substr(static_cast<size_t>(spans[k].first), static_cast<size_t>(spans[k].second))) << e.name;
    }
  }
}

TEST(ZipArchive, RangesOutsideTheRecordAreRefused) {
  const io::ZipArchive zip(graph_model("mlp.pt2"));
  const io::ZipEntry& e = *zip.find("data/weights/weight_0");
  char byte = 0;
  for (const auto& [offset, bytes] : std::vector<std::pair<int64_t, int64_t>>{{e.size, 1}, {-1, 1}, {INT64_MAX, 2}, {0, -1}})
    EXPECT_THAT(error_of([&] { zip.read_ranges(e, {{offset, bytes, &byte}}); }),
                AllOf(HasSubstr("zip entry 'mlp/data/weights/weight_0'"), HasSubstr("lies outside its 2048 bytes")));
}

// The end record is looked for in the last KiB first; a comment longer than that moves it further
// back, and the archive still reads. A record signature inside the comment is not taken for the end
// record: its comment would not end at the file's end.
TEST(ZipArchive, AnArchiveCommentLongerThanAKiBIsReadPast) {
  std::string bytes = read_bytes(graph_model("mlp.pt2"));
  const size_t end_record = bytes.size() - 22;
  ASSERT_EQ(get_u32(bytes, end_record), 0x06054b50u);
  std::string comment(3000, 'c');
  comment.replace(2500, 4, "PK\x05\x06");
  put_u16(bytes, end_record + 20, static_cast<uint16_t>(comment.size()));
  const std::string path = scratch("long_comment.pt2");
  write_bytes(path, bytes + comment);
  const io::ZipArchive zip(path);
  const io::ZipArchive original(graph_model("mlp.pt2"));
  ASSERT_EQ(zip.entries().size(), original.entries().size());
  const io::ZipEntry& e = *zip.find("data/weights/weight_0");
  std::string read(static_cast<size_t>(e.size), '\0'), expected(read);
  zip.read_into(e, read.data());
  original.read_into(*original.find("data/weights/weight_0"), expected.data());
  EXPECT_EQ(read, expected);
}

TEST(ZipArchive, AFlippedByteOutsideTheRangesStillFailsTheCrc) {
  std::string bytes = read_bytes(graph_model("mlp.pt2"));
  const auto entries = raw_zip_entries(bytes);
  const RawZipEntry& w = raw_zip_entry(entries, "weights/weight_0");
  bytes[raw_zip_data(bytes, w) + w.size - 1] ^= 0x40;  // the last byte
  const std::string path = scratch("flipped_last.pt2");
  write_bytes(path, bytes);
  const io::ZipArchive zip(path);
  char first[16];
  EXPECT_THAT(error_of([&] { zip.read_ranges(*zip.find("data/weights/weight_0"), {{0, 16, first}}); }),
              AllOf(HasSubstr(path), HasSubstr("zip entry 'mlp/data/weights/weight_0'"), HasSubstr("CRC-32 mismatch")));
}

TEST(ZipArchive, DamagedDeflateDataIsRefused) {
  const std::string original = read_bytes(graph_model("mlp_deflated.pt2"));
  const auto entries = raw_zip_entries(original);
  const RawZipEntry& w = raw_zip_entry(entries, "weights/weight_0");
  const size_t data = raw_zip_data(original, w);
  const uint32_t compressed = get_u32(original, w.central + kCentralCompressed);
  // A flipped byte inside the stream (deflate or the CRC notices), and an uncompressed size claiming
  // far more than deflate can produce from these bytes.
  std::string flipped = original;
  flipped[data + compressed / 2] ^= 0x55;
  std::string bomb = original;
  put_u32(bomb, w.central + kCentralSize, 0xFFFFFFF0u);
  put_u32(bomb, w.local + 22, 0xFFFFFFF0u);
  for (const auto& [name, bytes, what] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"flipped_deflate.pt2", flipped, "zip entry 'mlp/data/weights/weight_0'"},
           {"bomb.pt2", bomb, "more than deflate can expand"}}) {
    SCOPED_TRACE(name);
    const std::string path = scratch(name);
    write_bytes(path, bytes);
    const std::string error = error_of([&] {
      const io::ZipArchive zip(path);
      std::string out(static_cast<size_t>(zip.find("data/weights/weight_0")->size), '\0');
      zip.read_into(*zip.find("data/weights/weight_0"), out.data());
    });
    EXPECT_THAT(error, AllOf(HasSubstr(path), HasSubstr(what)));
  }
}

TEST(ZipArchive, ADeflatedArchiveRunsLikeTheStoredOne) {
  graph::Program stored = graph::load_program(graph_model("mlp.pt2"));
  graph::Program deflated = graph::load_program(graph_model("mlp_deflated.pt2"));
  const at::Tensor x = at::randn({4, 16});
  EXPECT_TRUE(at::equal(graph::run(stored, {x})[0].toTensor(), graph::run(deflated, {x})[0].toTensor()));
}

}  // namespace
}  // namespace dtensor::testing
