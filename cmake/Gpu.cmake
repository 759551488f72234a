# CUDA and NCCL are optional. Without them every CPU part builds and configure says once what it
# skipped (the summary at the end of the root CMakeLists.txt).
option(SHARDPLAN_ENABLE_CUDA "Build the CUDA/NCCL parts when a toolkit is found" ON)
# The `cuda` preset: a configure that finds no CUDA toolkit or no NCCL fails instead of skipping.
option(SHARDPLAN_REQUIRE_CUDA "Fail the configure unless CUDA and NCCL are found" OFF)
set(SHARDPLAN_HAVE_CUDA OFF)
set(SHARDPLAN_HAVE_NCCL OFF)
if(SHARDPLAN_ENABLE_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    # CMake 3.25 knows no C++20 flag for nvcc: the .cu files are C++17 (they include only the
    # CUDA headers and their own declarations).
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(SHARDPLAN_HAVE_CUDA ON)
    endif()
  endif()
endif()

if(SHARDPLAN_HAVE_CUDA)
  # NCCL: the toolkit's folder, a system install, or the one inside Python's nvidia-nccl package
  # (SHARDPLAN_NCCL_ROOT, as scripts/gpu_check.sh passes it).
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${SHARDPLAN_NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  # The library beside the header it is compiled against first (a wheel's nvidia/nccl/include
  # and nvidia/nccl/lib, which ship libnccl.so.2 only): a system libnccl.so elsewhere must not win
  # over it. NAMES_PER_DIR: each folder is searched for every name before the next folder.
  if(NCCL_INCLUDE_DIR)
    get_filename_component(_nccl_root ${NCCL_INCLUDE_DIR} DIRECTORY)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      PATHS ${_nccl_root} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  endif()
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${SHARDPLAN_NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(nccl UNKNOWN IMPORTED)
    set_target_properties(nccl PROPERTIES
      IMPORTED_LOCATION ${NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    set(SHARDPLAN_HAVE_NCCL ON)
  endif()
endif()

if(SHARDPLAN_REQUIRE_CUDA AND NOT (SHARDPLAN_HAVE_CUDA AND SHARDPLAN_HAVE_NCCL))
  message(FATAL_ERROR "SHARDPLAN_REQUIRE_CUDA: CUDA found: ${SHARDPLAN_HAVE_CUDA}, NCCL found: "
                      "${SHARDPLAN_HAVE_NCCL} (set CMAKE_CUDA_COMPILER, SHARDPLAN_NCCL_ROOT)")
endif()
if(NOT SHARDPLAN_HAVE_CUDA)
  list(APPEND SHARDPLAN_SKIPPED "CUDA (GPU executor backend, cuBLAS GEMM calibration)")
endif()
if(NOT SHARDPLAN_HAVE_NCCL)
  list(APPEND SHARDPLAN_SKIPPED "NCCL (calibrate --backend nccl, GPU collectives)")
endif()
