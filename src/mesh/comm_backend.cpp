#include "dtensor/comm_backend.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "backend_environment.h"
#include "dtensor/errors.h"

namespace dtensor {
namespace {

// Registered backends by name. The map's keys never move, so the CommBackend values handed out view
// storage that outlives every mesh.
struct Registry {
  std::mutex mutex;
  std::map<std::string, CommBackendDescription, std::less<>> by_name;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::string to_string(CommBackend backend) { return std::string(backend.name()); }

void register_comm_backend(CommBackendDescription description) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name(description.backend.name());
  auto [it, added] = r.by_name.try_emplace(name, description);
  if (!added) it->second = description;
  it->second.backend = CommBackend(it->first);
}

const CommBackendDescription& comm_backend_description(CommBackend backend) {
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_name.find(backend.name());
    if (it != r.by_name.end()) return it->second;
  }
  std::string known;
  for (const auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    const std::string names = comm_backends_for(device);
    if (!names.empty()) known += (known.empty() ? "" : "; ") + names + " for " + c10::DeviceTypeName(device, true) + " meshes";
  }
  throw DTensorError("no communication backend '" + to_string(backend) + "' in this build of dtensor (it has " +
                     (known.empty() ? "none" : known) + ")" +
                     (backend == CommBackend::Mpi ? "; MPI needs Open MPI (libopenmpi-dev) when dtensor is built" : ""));
}

std::string comm_backends_for(c10::DeviceType device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string out;
  for (const auto& [name, description] : r.by_name)
    if (description.device == device) out += (out.empty() ? "" : " or ") + name;
  return out;
}

bool mpi_built_in() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.by_name.count(std::string(CommBackend::Mpi.name())) > 0;
}

namespace detail {

std::optional<CommBackend> backend_from_environment() {
  const char* value = std::getenv("DTENSOR_BACKEND");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string name = value;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_name.find(name);
    if (it != r.by_name.end() && it->second.device == c10::DeviceType::CPU) return it->second.backend;
  }
  throw DTensorError("DTENSOR_BACKEND='" + name + "' is not a backend for CPU meshes; use " +
                     comm_backends_for(c10::DeviceType::CPU));
}

std::vector<CommBackendDescription> comm_backends() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<CommBackendDescription> out;
  for (const auto& [name, description] : r.by_name) out.push_back(description);
  return out;
}

}  // namespace detail

}  // namespace dtensor
