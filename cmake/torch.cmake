# Finds the installed torch (the one `python` imports) and the CUDA toolkit, without torch's own
# CMake package: that one probes cuDNN, NVTX and friends we do not use. We need headers, six
# libraries and the C++ ABI flag torch was built with.
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
find_package(CUDAToolkit 12.8 REQUIRED)

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "fast-ulysses: `import torch` failed in ${Python_EXECUTABLE}. The extension "
    "builds against the torch already installed: install torch first, then build without build "
    "isolation (pip install --no-build-isolation ...), so the build sees that torch")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_DIR)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(GET _torch_info 2 TORCH_VERSION)
list(GET _torch_info 3 TORCH_CUDA_VERSION)
message(STATUS "fast-ulysses: torch ${TORCH_VERSION} (CUDA ${TORCH_CUDA_VERSION}) at ${TORCH_DIR}")

string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${TORCH_CUDA_VERSION}")
if(NOT _torch_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
  message(FATAL_ERROR "fast-ulysses: torch was built with CUDA ${TORCH_CUDA_VERSION} but nvcc is "
    "${CUDAToolkit_VERSION}; their major versions must match")
endif()

add_library(fu_torch INTERFACE)
target_include_directories(fu_torch SYSTEM INTERFACE
  ${TORCH_DIR}/include ${TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(fu_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
target_link_directories(fu_torch INTERFACE ${TORCH_DIR}/lib)
target_link_libraries(fu_torch INTERFACE c10 torch torch_cpu)

# torch's Python bindings (THPVariable, its exception translation): for the modules' functions
# that take tensors from Python (csrc/ops/fast_entry.cpp, module_c.cpp).
add_library(fu_torch_python INTERFACE)
target_link_libraries(fu_torch_python INTERFACE fu_torch torch_python)

add_library(fu_torch_cuda INTERFACE)
target_compile_definitions(fu_torch_cuda INTERFACE USE_CUDA)
target_link_libraries(fu_torch_cuda INTERFACE fu_torch c10_cuda torch_cuda CUDA::cudart)
target_include_directories(fu_torch_cuda SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})

# A Python extension module whose only job is to load the library (its TORCH_LIBRARY blocks
# register the ops at load time). Torch's libraries are found through torch's own RPATH once
# `import torch` has run, which fast_ulysses/__init__.py guarantees.
function(fast_ulysses_module name)
  Python_add_library(${name} MODULE WITH_SOABI ${ARGN})
  set_target_properties(${name} PROPERTIES INSTALL_RPATH "$ORIGIN;${TORCH_DIR}/lib")
  install(TARGETS ${name} LIBRARY DESTINATION fast_ulysses)
endfunction()
