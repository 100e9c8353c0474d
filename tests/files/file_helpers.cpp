#include "file_helpers.h"

#include <caffe2/serialize/inline_container.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../support/build_paths.h"

namespace dtensor::testing {
namespace fs = std::filesystem;

std::string pytorch_checkpoint(const std::string& name) {
  return std::string(build_paths::checkpoint_interop) + "/pytorch_written/" + name;
}

std::string scratch(const std::string& name) {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("dtensor-file-tests-" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  const fs::path p = dir / name;
  fs::remove_all(p);
  return p.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void rewrite_archive(const std::string& src, const std::string& dst,
                     const std::function<std::optional<std::string>(const std::string&, const std::string&)>& edit) {
  caffe2::serialize::PyTorchStreamReader reader(src);
  caffe2::serialize::PyTorchStreamWriter writer(dst);
  writer.setMinVersion(6);
  for (const auto& name : reader.getAllRecords()) {
    // The writer adds these itself.
    if (name == ".data/version" || name == "byteorder" || name == ".data/serialization_id" || name == "version") continue;
    auto [data, size] = reader.getRecord(name);
    const auto content = edit(name, std::string(static_cast<const char*>(data.get()), size));
    if (content) writer.writeRecord(name, content->data(), content->size());
  }
  writer.writeEndOfFile();
}

std::string with_model_text(const std::string& archive, const std::string& name, const std::function<void(std::string&)>& edit) {
  const std::string path = scratch(name);
  rewrite_archive(graph_model(archive), path, [&](const std::string& record, const std::string& content) {
    if (record != "models/model.json") return std::optional<std::string>(content);
    std::string text = content;
    edit(text);
    return std::optional<std::string>(text);
  });
  return path;
}

std::string with_model_json(const std::string& archive, const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  return with_model_text(archive, name, [&](std::string& text) {
    auto model = nlohmann::json::parse(text);
    edit(model);
    text = model.dump();
  });
}

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

uint32_t get_u32(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes.at(at + static_cast<size_t>(i)));
  return v;
}

static uint16_t get_u16(const std::string& bytes, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(bytes.at(at)) | (static_cast<unsigned char>(bytes.at(at + 1)) << 8));
}

void put_u16(std::string& bytes, size_t at, uint16_t value) {
  for (int i = 0; i < 2; ++i) bytes.at(at + static_cast<size_t>(i)) = static_cast<char>((value >> (8 * i)) & 0xFF);
}

void put_u32(std::string& bytes, size_t at, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes.at(at + static_cast<size_t>(i)) = static_cast<char>((value >> (8 * i)) & 0xFF);
}

std::vector<RawZipEntry> raw_zip_entries(const std::string& bytes) {
  const size_t end = bytes.rfind(std::string("PK\x05\x06", 4));
  if (end == std::string::npos) throw std::runtime_error("no end record");
  const size_t count = get_u16(bytes, end + 10);
  size_t at = get_u32(bytes, end + 16);
  std::vector<RawZipEntry> out;
  for (size_t i = 0; i < count; ++i) {
    if (get_u32(bytes, at) != 0x02014b50) throw std::runtime_error("not a central directory header");
    const size_t name = get_u16(bytes, at + 28), extra = get_u16(bytes, at + 30), comment = get_u16(bytes, at + 32);
    out.push_back({bytes.substr(at + 46, name), at, get_u32(bytes, at + 42), get_u32(bytes, at + kCentralSize)});
    at += 46 + name + extra + comment;
  }
  return out;
}

const RawZipEntry& raw_zip_entry(const std::vector<RawZipEntry>& entries, const std::string& name_suffix) {
  for (const RawZipEntry& e : entries)
    if (e.name.size() >= name_suffix.size() && e.name.compare(e.name.size() - name_suffix.size(), name_suffix.size(), name_suffix) == 0)
      return e;
  throw std::runtime_error("no zip entry named *" + name_suffix);
}

size_t raw_zip_data(const std::string& bytes, const RawZipEntry& entry) {
  return entry.local + kLocalHeaderSize + get_u16(bytes, entry.local + kLocalNameLength) + get_u16(bytes, entry.local + kLocalNameLength + 2);
}

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::pair<std::string, std::string> safetensors_parts(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file.at(static_cast<size_t>(i)));
  return {file.substr(8, n), file.substr(8 + n)};
}

std::string checkpoint_dir(const std::string& name, const std::vector<std::pair<std::string, std::string>>& files) {
  const std::string dir = scratch(name);
  fs::create_directories(dir);
  for (const auto& [file, bytes] : files) write_bytes(dir + "/" + file, bytes);
  return dir;
}

std::string copy_dir(const std::string& src, const std::string& name,
                     const std::function<std::string(const std::string&, const std::string&)>& edit) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string file = entry.path().filename().string();
    files.emplace_back(file, edit(file, read_bytes(entry.path().string())));
  }
  return checkpoint_dir(name, files);
}

}  // namespace dtensor::testing
