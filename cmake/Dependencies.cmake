# Third-party libraries, all from Debian packages (scripts/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_package(PkgConfig REQUIRED)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
find_package(SQLite3 REQUIRED)
# PCRE2 (libpcre2-dev): the tokenizers' pre-tokenizer regexes (Unicode properties, lookahead, JIT).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Eigen (header-only; OLS and the special functions of the analysis: betainc, igammac).
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
# zlib (zlib1g-dev): CRC-32 of what a resumed run rebuilds from --model (core/checksum.h).
find_package(ZLIB REQUIRED)
# XGBoost's C API (tree-model importances of the analysis). Debian's xgboost-config.cmake also
# imports the `xgboost` CLI, which libxgboost-dev does not ship, so the library is found directly.
find_library(XGBOOST_LIB NAMES xgboost REQUIRED)
find_path(XGBOOST_INCLUDE_DIR xgboost/c_api.h REQUIRED)
add_library(scalelab_xgboost INTERFACE)
target_link_libraries(scalelab_xgboost INTERFACE ${XGBOOST_LIB})
target_include_directories(scalelab_xgboost SYSTEM INTERFACE ${XGBOOST_INCLUDE_DIR})

# OpenBLAS, preferably the OpenMP build: our own kernels use OpenMP, and sharing one thread
# pool avoids two sets of spinning threads fighting over the cores between GEMMs.
find_library(OPENBLAS_LIB NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
  NO_DEFAULT_PATH)
if(NOT OPENBLAS_LIB)
  find_library(OPENBLAS_LIB NAMES openblas REQUIRED)
endif()
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp
  /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include REQUIRED)
get_filename_component(OPENBLAS_LIB_DIR ${OPENBLAS_LIB} DIRECTORY)
add_library(scalelab_openblas INTERFACE)
target_link_libraries(scalelab_openblas INTERFACE ${OPENBLAS_LIB})
target_include_directories(scalelab_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
# rpath to the variant we linked, so the system's alternatives choice does not swap it.
target_link_options(scalelab_openblas INTERFACE "-Wl,-rpath,${OPENBLAS_LIB_DIR}")
message(STATUS "scalelab: OpenBLAS ${OPENBLAS_LIB}")

# Data-parallel communication (src/dist): MPI (OpenMPI) for host memory, NCCL (the CUDA toolkit's
# libnccl) for device memory. Everything src/dist needs is carried by scalelab_distributed_deps, with
# SCALELAB_HAVE_MPI / SCALELAB_HAVE_NCCL telling the sources which implementation to compile
# (without them they compile implementations that throw "built without MPI/NCCL").
add_library(scalelab_distributed_deps INTERFACE)
find_package(MPI COMPONENTS C QUIET)
option(SCALELAB_WITH_MPI "Build the MPI communicator (OpenMPI)" ${MPI_C_FOUND})
if(SCALELAB_WITH_MPI)
  if(NOT MPI_C_FOUND)
    message(FATAL_ERROR "SCALELAB_WITH_MPI=ON but MPI was not found: install libopenmpi-dev "
                        "(scripts/deps.sh) or configure with -DSCALELAB_WITH_MPI=OFF")
  endif()
  target_link_libraries(scalelab_distributed_deps INTERFACE MPI::MPI_C)
  # The C API only: the deprecated C++ bindings would need libmpi_cxx.
  target_compile_definitions(scalelab_distributed_deps INTERFACE SCALELAB_HAVE_MPI=1 OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  message(STATUS "scalelab: MPI ${MPI_C_VERSION} (${MPIEXEC_EXECUTABLE})")
endif()
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
  find_path(NCCL_INCLUDE_DIR nccl.h)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY nccl)
endif()
if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND SCALELAB_WITH_MPI)
  set(SCALELAB_NCCL_DEFAULT ON)
else()
  set(SCALELAB_NCCL_DEFAULT OFF)
endif()
option(SCALELAB_WITH_NCCL "Build the NCCL communicator (needs the CUDA toolkit, libnccl and MPI)"
  ${SCALELAB_NCCL_DEFAULT})
if(SCALELAB_WITH_NCCL)
  if(NOT (CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND SCALELAB_WITH_MPI))
    message(FATAL_ERROR "SCALELAB_WITH_NCCL=ON needs the CUDA toolkit with nccl.h/libnccl "
                        "(e.g. /usr/local/cuda) and SCALELAB_WITH_MPI=ON (NCCL is bootstrapped over MPI)")
  endif()
  add_library(scalelab_nccl UNKNOWN IMPORTED)
  set_target_properties(scalelab_nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  target_link_libraries(scalelab_distributed_deps INTERFACE scalelab_nccl CUDA::cudart)
  target_compile_definitions(scalelab_distributed_deps INTERFACE SCALELAB_HAVE_NCCL=1)
  message(STATUS "scalelab: NCCL ${NCCL_LIBRARY} (CUDA ${CUDAToolkit_VERSION})")
endif()

# The CUDA backend (src/kernels/cuda/): built whenever the toolkit is found, so CI compiles and
# links every kernel on every run; SCALELAB_WITH_CUDA=OFF builds kernels/no_cuda/ instead.
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
  set(SCALELAB_CUDA_DEFAULT ON)
else()
  set(SCALELAB_CUDA_DEFAULT OFF)
endif()
option(SCALELAB_WITH_CUDA "Build the CUDA backend (needs the CUDA toolkit)" ${SCALELAB_CUDA_DEFAULT})
if(SCALELAB_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER OR NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "SCALELAB_WITH_CUDA=ON needs the CUDA toolkit (nvcc, cudart, cuBLASLt), e.g. /usr/local/cuda")
  endif()
  # Ampere (sm_80) and Hopper (sm_90); kernels that use Hopper-only instructions add sm_90a.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know that nvcc 12+ supports C++20: tell it the flag, then ask for it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  message(STATUS "scalelab: CUDA backend (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  # cuDNN's fused SDPA for flash attention: cuDNN from the toolkit, its header-only C++ frontend
  # from scripts/cudnn-frontend.sh (third_party/cudnn-frontend). Without either, the CUDA backend
  # uses its own flash kernels.
  find_path(SCALELAB_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h
    PATHS ${PROJECT_SOURCE_DIR}/third_party/cudnn-frontend/include NO_DEFAULT_PATH)
  find_path(SCALELAB_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(SCALELAB_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
  if(SCALELAB_CUDNN_FRONTEND_INCLUDE AND SCALELAB_CUDNN_INCLUDE AND SCALELAB_CUDNN_LIBRARY)
    set(SCALELAB_CUDNN_DEFAULT ON)
  else()
    set(SCALELAB_CUDNN_DEFAULT OFF)
  endif()
  option(SCALELAB_WITH_CUDNN "Flash attention through cuDNN's SDPA (needs cuDNN 9 and scripts/cudnn-frontend.sh)"
    ${SCALELAB_CUDNN_DEFAULT})
  if(SCALELAB_WITH_CUDNN)
    if(NOT SCALELAB_CUDNN_DEFAULT)
      message(FATAL_ERROR "SCALELAB_WITH_CUDNN=ON needs cuDNN (cudnn.h, libcudnn) and the frontend: run scripts/cudnn-frontend.sh")
    endif()
    message(STATUS "scalelab: cuDNN SDPA for flash attention (${SCALELAB_CUDNN_LIBRARY})")
  else()
    message(STATUS "scalelab: no cuDNN SDPA (cuDNN or its frontend not found: scripts/cudnn-frontend.sh); own flash kernels")
  endif()
else()
  message(STATUS "scalelab: no CUDA backend (toolkit not found or SCALELAB_WITH_CUDA=OFF)")
endif()
