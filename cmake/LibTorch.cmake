# LibTorch from the PyPI wheel in the project's venv, as an imported target of our own.
#
# Why not find_package(Torch): the wheel is a CUDA build whose TorchConfig needs a CUDA toolkit at
# configure time; we need only c10 and torch_cpu (c10d and Gloo live there). This is the route
# torch.utils.cpp_extension takes. Debian's old LibTorch under /usr must never be picked up, so the
# location is explicit (DTENSOR_TORCH_DIR, set by ./dev from the venv) and printed.

set(DTENSOR_TORCH_DIR "" CACHE PATH "site-packages/torch directory of the LibTorch to build against")
if(NOT DTENSOR_TORCH_DIR)
  message(FATAL_ERROR "DTENSOR_TORCH_DIR is not set: run ./dev (it installs torch into a venv and passes it), "
                      "or pass -DDTENSOR_TORCH_DIR=<venv>/lib/python3.X/site-packages/torch")
endif()
if(NOT EXISTS "${DTENSOR_TORCH_DIR}/lib/libtorch_cpu.so" OR NOT EXISTS "${DTENSOR_TORCH_DIR}/include/ATen/ATen.h")
  message(FATAL_ERROR "DTENSOR_TORCH_DIR=${DTENSOR_TORCH_DIR} does not hold a LibTorch (lib/libtorch_cpu.so, include/ATen/ATen.h)")
endif()

file(STRINGS "${DTENSOR_TORCH_DIR}/version.py" _torch_version_line REGEX "^__version__")
string(REGEX REPLACE "^__version__ *= *'([^']*)'.*" "\\1" DTENSOR_TORCH_VERSION "${_torch_version_line}")
set(DTENSOR_TORCH_CXX11_ABI "1" CACHE STRING "_GLIBCXX_USE_CXX11_ABI of the LibTorch build (read from torch._C by ./dev)")
message(STATUS "dtensor: LibTorch ${DTENSOR_TORCH_VERSION} from ${DTENSOR_TORCH_DIR} (_GLIBCXX_USE_CXX11_ABI=${DTENSOR_TORCH_CXX11_ABI})")

add_library(dtensor_torch INTERFACE)
add_library(dtensor::torch ALIAS dtensor_torch)
target_include_directories(dtensor_torch SYSTEM INTERFACE
  "${DTENSOR_TORCH_DIR}/include"
  "${DTENSOR_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(dtensor_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${DTENSOR_TORCH_CXX11_ABI} USE_DISTRIBUTED USE_C10D_GLOO)
target_link_libraries(dtensor_torch INTERFACE
  "${DTENSOR_TORCH_DIR}/lib/libtorch_cpu.so" "${DTENSOR_TORCH_DIR}/lib/libc10.so")
# Executables find the wheel's libraries (and their own $ORIGIN-relative deps) through an RPATH.
target_link_options(dtensor_torch INTERFACE "LINKER:-rpath,${DTENSOR_TORCH_DIR}/lib")
set(DTENSOR_PYTHON "" CACHE FILEPATH "python of the venv holding that torch (for the torchrun launch test)")
