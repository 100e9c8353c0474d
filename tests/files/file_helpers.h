#pragma once
// Helpers for the untrusted-file tests: the suite's own files (the .pt2 archives the build exports, the
// checkpoints PyTorch writes at build time), and ways to damage copies of them. The zip and
// safetensors views here are written independently of dtensor's readers, so that a test's bad input
// does not depend on the code it tests.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../support/error_of.h"
#include "../support/test_models.h"
#include "dtensor/errors.h"

namespace dtensor::testing {

std::string pytorch_checkpoint(const std::string& name);  // a checkpoint directory PyTorch wrote at build time
// A fresh path (file or directory) under this process's scratch directory.
std::string scratch(const std::string& name);

std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);

// ---- .pt2 archives --------------------------------------------------------------------------------------

// Copies archive `src` to `dst` record by record through LibTorch's writer; `edit(name, content)`
// returns the new content, or nullopt to drop the record.
void rewrite_archive(const std::string& src, const std::string& dst,
                     const std::function<std::optional<std::string>(const std::string&, const std::string&)>& edit);
// A copy of graph model `archive` named `name`, its models/model.json changed by `edit`.
std::string with_model_json(const std::string& archive, const std::string& name, const std::function<void(nlohmann::json&)>& edit);
// The same, editing the text (for what a json object cannot hold: duplicate keys, deep nesting).
std::string with_model_text(const std::string& archive, const std::string& name, const std::function<void(std::string&)>& edit);
// `depth` nested arrays, as JSON text.
std::string nested_arrays(size_t depth);

// Where one entry's headers sit in a zip file's bytes.
struct RawZipEntry {
  std::string name;
  size_t central;  // its central directory header
  size_t local;    // its local header
  uint32_t size;   // its size (as the central directory says)
};
// Every entry of a zip file (no zip64 extension needed: the suite's archives are small).
std::vector<RawZipEntry> raw_zip_entries(const std::string& bytes);
const RawZipEntry& raw_zip_entry(const std::vector<RawZipEntry>& entries, const std::string& name_suffix);
// Where an entry's data starts (after its local header, name and extra field).
size_t raw_zip_data(const std::string& bytes, const RawZipEntry& entry);
void put_u16(std::string& bytes, size_t at, uint16_t value);
void put_u32(std::string& bytes, size_t at, uint32_t value);
uint32_t get_u32(const std::string& bytes, size_t at);
// Offsets of fields in zip headers.
inline constexpr size_t kLocalMethod = 8, kLocalCrc = 14, kLocalNameLength = 26, kLocalHeaderSize = 30;
inline constexpr size_t kCentralMethod = 10, kCentralCrc = 16, kCentralCompressed = 20, kCentralSize = 24;

// ---- safetensors files ----------------------------------------------------------------------------------

// A safetensors file: the 8-byte header length, `header` as given, then `data`.
std::string safetensors_bytes(const std::string& header, const std::string& data);
// The header text and the data of a safetensors file.
std::pair<std::string, std::string> safetensors_parts(const std::string& file);
// A directory holding `files` (name -> bytes).
std::string checkpoint_dir(const std::string& name, const std::vector<std::pair<std::string, std::string>>& files);
// A copy of directory `src` named `name`, each file passed through `edit(file name, bytes)`.
std::string copy_dir(const std::string& src, const std::string& name,
                     const std::function<std::string(const std::string&, const std::string&)>& edit);

}  // namespace dtensor::testing
