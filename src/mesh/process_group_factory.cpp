#include "process_group_factory.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <string>

#ifdef DTENSOR_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "dtensor/errors.h"

namespace dtensor::detail {
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

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int size, c10::DeviceType device,
                                                     std::chrono::milliseconds timeout) {
  if (device == c10::DeviceType::CPU) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(gloo_device());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  }
  if (device == c10::DeviceType::CUDA) {
#ifdef DTENSOR_WITH_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
    throw DTensorError("a CUDA DeviceMesh needs NCCL, but dtensor was built without it; reconfigure with "
                       "-DDTENSOR_WITH_NCCL=ON on a machine with the CUDA toolkit, or use a CPU mesh");
#endif
  }
  throw DTensorError(std::string("no process group backend for device type ") + c10::DeviceTypeName(device) +
                     "; DeviceMesh supports CPU (Gloo) and CUDA (NCCL)");
}

}  // namespace dtensor::detail
