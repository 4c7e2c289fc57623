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
