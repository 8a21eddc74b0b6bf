# CUDA and NCCL are optional: when the toolkit and NCCL are found, the NCCL code is compiled
# and linked in every build (no GPU is needed for that); it runs only where a GPU is visible.
# Only host code uses them (cuda_runtime.h, nccl.h), so no CUDA compiler is required.
set(GRADHUB_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root searched for cudart and NCCL")

find_path(GRADHUB_CUDART_INCLUDE_DIR cuda_runtime.h
  HINTS "${GRADHUB_CUDA_ROOT}/include" ENV CUDA_HOME PATH_SUFFIXES include)
find_library(GRADHUB_CUDART_LIBRARY cudart
  HINTS "${GRADHUB_CUDA_ROOT}/lib64" "${GRADHUB_CUDA_ROOT}/lib" ENV CUDA_HOME PATH_SUFFIXES lib64 lib)
find_path(GRADHUB_NCCL_INCLUDE_DIR nccl.h
  HINTS "${GRADHUB_CUDA_ROOT}/include" ENV NCCL_HOME PATH_SUFFIXES include)
find_library(GRADHUB_NCCL_LIBRARY nccl
  HINTS "${GRADHUB_CUDA_ROOT}/lib64" "${GRADHUB_CUDA_ROOT}/lib" ENV NCCL_HOME PATH_SUFFIXES lib64 lib)

set(GRADHUB_HAVE_CUDA OFF)
set(GRADHUB_HAVE_NCCL OFF)
if(GRADHUB_CUDART_INCLUDE_DIR AND GRADHUB_CUDART_LIBRARY)
  set(GRADHUB_HAVE_CUDA ON)
  add_library(gradhub::cudart UNKNOWN IMPORTED)
  set_target_properties(gradhub::cudart PROPERTIES
    IMPORTED_LOCATION "${GRADHUB_CUDART_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${GRADHUB_CUDART_INCLUDE_DIR}")
  if(GRADHUB_NCCL_INCLUDE_DIR AND GRADHUB_NCCL_LIBRARY)
    set(GRADHUB_HAVE_NCCL ON)
    add_library(gradhub::nccl UNKNOWN IMPORTED)
    set_target_properties(gradhub::nccl PROPERTIES
      IMPORTED_LOCATION "${GRADHUB_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${GRADHUB_NCCL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES gradhub::cudart)
  endif()
endif()
message(STATUS "gradhub: CUDA runtime ${GRADHUB_HAVE_CUDA} (${GRADHUB_CUDART_LIBRARY}), "
               "NCCL ${GRADHUB_HAVE_NCCL} (${GRADHUB_NCCL_LIBRARY})")
