# Finds NCCL (nccl.h and libnccl), by default where the CUDA toolkit lives.
# Defines NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY and the target NCCL::NCCL.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT} /usr/local/cuda
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT} /usr/local/cuda
  PATH_SUFFIXES lib64 lib)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} ([0-9]+).*" "\\1" NCCL_${_part} "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
