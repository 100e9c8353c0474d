// Gloo: TCP between any processes, CPU tensors; the default for CPU meshes. Only this file includes
// Gloo's headers.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <string>

#include "dtensor/comm_backend.h"

namespace dtensor {
namespace {

// Loopback unless the job spans machines: GLOO_SOCKET_IFNAME picks an interface (as in PyTorch), and a
// non-local MASTER_ADDR means the peers are elsewhere, so bind to this host's resolvable address.
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  const char* master = std::getenv("MASTER_ADDR");
  const std::string addr = master ? master : "";
  if (addr.empty() || addr == "127.0.0.1" || addr == "localhost" || addr == "::1")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const CommBackendDescription::GroupRequest& request) {
  auto options = c10d::ProcessGroupGloo::Options::create(request.timeout);
  options->devices.push_back(gloo_device());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(request.store, request.rank, static_cast<int>(request.ranks.size()),
                                                     options);
}

[[maybe_unused]] const bool kRegistered = (register_comm_backend({
                                               .backend = CommBackend::Gloo,
                                               .device = c10::DeviceType::CPU,
                                               .c10d_type = static_cast<int>(c10d::ProcessGroup::BackendType::GLOO),
                                               .default_for_device = true,
                                               .make_group = make_gloo_group,
                                           }),
                                           true);

}  // namespace
}  // namespace dtensor
