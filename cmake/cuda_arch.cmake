# The GPU architectures of a build, decided here and nowhere else.
# FAST_ULYSSES_CUDA_ARCH=90 (or a comma-separated list, "90,100") picks; unset, it is all four
# supported ones. The list is recorded in fast_ulysses/_build_info.py (see `fast-ulysses doctor`).
#
# The copy path has no device code (the transport issues copies and stream memory operations
# only); the fused QK RMSNorm + RoPE scatter (csrc/kernels) has. Any .cu file switches device code
# on, below: CUDA is enabled as a language and compiled for every listed architecture (SASS for
# each, plus PTX of the newest so a later GPU can JIT it), against the shared CUDA runtime that
# torch loads (a static one would be a second runtime in the process).
set(FAST_ULYSSES_SUPPORTED_ARCHS 80 90 100 120)
if(DEFINED ENV{FAST_ULYSSES_CUDA_ARCH} AND NOT "$ENV{FAST_ULYSSES_CUDA_ARCH}" STREQUAL "")
  string(REPLACE "," ";" FAST_ULYSSES_CUDA_ARCHS "$ENV{FAST_ULYSSES_CUDA_ARCH}")
else()
  set(FAST_ULYSSES_CUDA_ARCHS ${FAST_ULYSSES_SUPPORTED_ARCHS})
endif()
foreach(_arch IN LISTS FAST_ULYSSES_CUDA_ARCHS)
  if(NOT _arch IN_LIST FAST_ULYSSES_SUPPORTED_ARCHS)
    message(FATAL_ERROR "FAST_ULYSSES_CUDA_ARCH=$ENV{FAST_ULYSSES_CUDA_ARCH}: ${_arch} is not "
      "one of the supported architectures ${FAST_ULYSSES_SUPPORTED_ARCHS}")
  endif()
endforeach()
string(REPLACE ";" "," FAST_ULYSSES_CUDA_ARCHS_CSV "${FAST_ULYSSES_CUDA_ARCHS}")

file(GLOB_RECURSE _fast_ulysses_cu_files CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/csrc/*.cu")
if(_fast_ulysses_cu_files)
  set(FAST_ULYSSES_DEVICE_CODE ON)
  set(CMAKE_CUDA_ARCHITECTURES "")
  foreach(_arch IN LISTS FAST_ULYSSES_CUDA_ARCHS)
    list(APPEND CMAKE_CUDA_ARCHITECTURES "${_arch}-real")
  endforeach()
  # PTX of the newest listed, whatever order the list was given in ("90,80" too).
  set(_sorted ${FAST_ULYSSES_CUDA_ARCHS})
  list(SORT _sorted COMPARE NATURAL)
  list(GET _sorted -1 _newest)
  list(APPEND CMAKE_CUDA_ARCHITECTURES "${_newest}-virtual")
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)  # the shared runtime is linked explicitly
  set(CMAKE_CUDA_STANDARD 17)
  enable_language(CUDA)
  # The modules link with the C++ linker, and a library with CUDA code would otherwise add nvcc's
  # implicit link libraries and directories to them. When nvcc's host compiler is a wrapper with
  # a libstdc++ of its own (docs/INSTALL.md, "Known build pitfall"), its directory then comes
  # ahead of the system's on the link line and fast_ulysses._cuda can end up with a second,
  # static libstdc++, which crashes on the first C++ exception (every ValueError for a bad call).
  # The kernel needs only the shared CUDA runtime, which csrc/kernels/CMakeLists.txt links.
  set(CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES "")
  set(CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES "")
  message(STATUS "fast-ulysses: device code for CUDA architectures ${FAST_ULYSSES_CUDA_ARCHS_CSV}")
else()
  set(FAST_ULYSSES_DEVICE_CODE OFF)
  message(STATUS "fast-ulysses: no device code (no .cu file); CUDA architectures "
    "${FAST_ULYSSES_CUDA_ARCHS_CSV} recorded only")
endif()
