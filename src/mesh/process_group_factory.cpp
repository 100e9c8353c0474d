#include "process_group_factory.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>

#ifdef DTENSOR_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "dtensor/errors.h"

#ifdef DTENSOR_WITH_MPI
#include "mpi/mpi_backend.h"
#endif

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

c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int64_t>& ranks, int world_rank,
                                                     c10::DeviceType device, CommBackend backend,
                                                     std::chrono::milliseconds timeout) {
  const int rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), world_rank) - ranks.begin());
  const int size = static_cast<int>(ranks.size());
  const std::string device_name = c10::DeviceTypeName(device);
  if (device == c10::DeviceType::CPU && backend == CommBackend::Gloo) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(gloo_device());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  }
  if (device == c10::DeviceType::CPU && backend == CommBackend::Mpi) {
#ifdef DTENSOR_WITH_MPI
    return make_mpi_backend(store, ranks, world_rank, timeout);
#else
    throw DTensorError("the MPI backend was asked for, but dtensor was built without MPI (CMake did not find it, or "
                       "-DDTENSOR_WITH_MPI=OFF); install Open MPI (libopenmpi-dev) and rebuild, or use Gloo");
#endif
  }
  if (device == c10::DeviceType::CUDA && backend == CommBackend::Nccl) {
#ifdef DTENSOR_WITH_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
    throw DTensorError("a CUDA DeviceMesh needs NCCL, but dtensor was built without it; reconfigure with "
                       "-DDTENSOR_WITH_NCCL=ON on a machine with the CUDA toolkit, or use a CPU mesh");
#endif
  }
  throw DTensorError("no " + to_string(backend) + " process groups for " + device_name +
                     " tensors; CPU meshes use Gloo or MPI, CUDA meshes NCCL");
}

}  // namespace dtensor::detail
