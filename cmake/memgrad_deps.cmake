# The dependencies that ship no CMake package, each wrapped in an imported target: memgrad::openblas
# (OpenBLAS built on OpenMP, Debian's libopenblas-openmp-dev, so BLAS and our kernels share one
# thread pool, with the folder of its cblas.h) and memgrad::stb (Debian's libstb: stb_image,
# _resize, _write). Included by CMakeLists.txt and by the installed memgrad-config.cmake, so a
# project that calls find_package(memgrad) finds them the way memgrad's own build did.
if(NOT TARGET memgrad::openblas)
  find_library(MG_OPENBLAS NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
    NO_DEFAULT_PATH)
  if(NOT MG_OPENBLAS)
    find_library(MG_OPENBLAS NAMES openblas REQUIRED)
  endif()
  find_path(MG_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas-openmp openblas REQUIRED
    HINTS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp)
  add_library(memgrad::openblas UNKNOWN IMPORTED)
  set_target_properties(memgrad::openblas PROPERTIES IMPORTED_LOCATION "${MG_OPENBLAS}"
    INTERFACE_INCLUDE_DIRECTORIES "${MG_CBLAS_INCLUDE}")
endif()
if(NOT TARGET memgrad::stb)
  find_library(MG_STB NAMES stb REQUIRED)
  add_library(memgrad::stb UNKNOWN IMPORTED)
  set_target_properties(memgrad::stb PROPERTIES IMPORTED_LOCATION "${MG_STB}")
endif()
