# NCCL and cuDNN for the CUDA backend: where they are, or a clear message that they are not.
#
# Why this is more than find_library(nccl): a GPU machine whose CUDA libraries came with PyTorch often has NCCL and
# cuDNN only as the nvidia-* Python wheels (nvidia-nccl-cu13, nvidia-cudnn-cu13). Those ship versioned names only
# (libnccl.so.2, libcudnn.so.9, no unversioned .so for the linker to find) and keep their headers beside the
# library under site-packages/nvidia/<name>/include, where no compiler looks. So we search, in this order:
#   1. MT_NCCL_ROOT / MT_CUDNN_ROOT when given (a folder with include/ and lib/),
#   2. the CUDA toolkit's folders, then the system's,
#   3. the folders of the `nvidia` Python package of the first python3 on PATH (the wheels).
# The header is looked for beside the library found first (see mt_find_gpu_library).
#
# Sets: NCCL_LIB, NCCL_INCLUDE, MT_HAVE_NCCL; CUDNN_LIB, CUDNN_INCLUDE (both empty when cuDNN is not found);
# MT_GPU_LIBRARY_DIRS (the folders of the libraries found, also written colon-separated to
# <build>/gpu_library_dirs.txt for LD_LIBRARY_PATH: cuDNN dlopens its engine libraries from there at run time). Without NCCL the CUDA backend is still built; NCCL groups then fail with a message that
# says NCCL was not found (comm/cuda/nccl_missing.cpp). Without cuDNN, train.attention = "cudnn" is refused.

set(MT_NCCL_ROOT "" CACHE PATH "A folder holding NCCL's include/ and lib/ (searched first)")
set(MT_CUDNN_ROOT "" CACHE PATH "A folder holding cuDNN's include/ and lib/ (searched first)")

set(MT_GPU_LIBRARY_DIRS "")
set(_mt_wheel_dirs "")
find_program(MT_PYTHON3 python3)
if(MT_PYTHON3)
  execute_process(COMMAND ${MT_PYTHON3} -c "import nvidia; print(';'.join(nvidia.__path__))"
                  OUTPUT_VARIABLE _mt_nvidia_paths OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE _mt_py_rc TIMEOUT 30)
  if(_mt_py_rc EQUAL 0)
    foreach(p IN LISTS _mt_nvidia_paths)
      # nvidia/nccl, nvidia/cudnn, and CUDA 13's nvidia/cu13 layout
      file(GLOB _mt_sub LIST_DIRECTORIES true ${p}/*)
      list(APPEND _mt_wheel_dirs ${_mt_sub})
    endforeach()
  endif()
endif()

# mt_find_gpu_library(<prefix> <root> <header> <names>...): sets <prefix>_LIB and <prefix>_INCLUDE.
function(mt_find_gpu_library prefix root header)
  set(names ${ARGN})
  if(root)
    find_library(${prefix}_LIB NAMES ${names} PATHS ${root} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  endif()
  find_library(${prefix}_LIB NAMES ${names} HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS ${_mt_wheel_dirs}
               PATH_SUFFIXES lib lib64)
  if(${prefix}_LIB)
    get_filename_component(libdir ${${prefix}_LIB} DIRECTORY)
    # The header beside the library first (a wheel's or a root's include/); else the toolkit's and the system's
    # include folders, never another wheel's, so a header and a library of two installations do not pair.
    find_path(${prefix}_INCLUDE ${header} PATHS ${libdir}/../include NO_DEFAULT_PATH)
    find_path(${prefix}_INCLUDE ${header} HINTS ${CUDAToolkit_INCLUDE_DIRS})
    set(dirs ${MT_GPU_LIBRARY_DIRS})
    list(APPEND dirs ${libdir})
    list(REMOVE_DUPLICATES dirs)
    set(MT_GPU_LIBRARY_DIRS ${dirs} PARENT_SCOPE)
  endif()
endfunction()

mt_find_gpu_library(NCCL "${MT_NCCL_ROOT}" nccl.h nccl libnccl.so.2)
mt_find_gpu_library(CUDNN "${MT_CUDNN_ROOT}" cudnn.h cudnn libcudnn.so.9)

if(NCCL_LIB AND NCCL_INCLUDE)
  set(MT_HAVE_NCCL ON)
  message(STATUS "NCCL: ${NCCL_LIB} (headers in ${NCCL_INCLUDE})")
else()
  set(MT_HAVE_NCCL OFF)
  message(WARNING "NCCL not found (library: ${NCCL_LIB}, nccl.h: ${NCCL_INCLUDE}). The CUDA backend is built "
                  "without it: GPU process groups (several GPUs, the nccl tests) will refuse to run. Install NCCL "
                  "(libnccl-dev), or pass -DMT_NCCL_ROOT=<folder with include/ and lib/>.")
endif()
string(REPLACE ";" ":" _mt_dirs "${MT_GPU_LIBRARY_DIRS}")
file(WRITE ${CMAKE_BINARY_DIR}/gpu_library_dirs.txt "${_mt_dirs}")
if(CUDNN_LIB AND NOT CUDNN_INCLUDE)
  message(WARNING "cuDNN's library was found (${CUDNN_LIB}) but not cudnn.h: building without cuDNN attention")
  set(CUDNN_LIB "")
endif()
