# Where pcsd's build finds nvcc, in one place for CMakeLists.txt and tools/gpu_node.sh.
#
# First hit wins (CUDACXX / -DCMAKE_CUDA_COMPILER, which CMake reads itself, come before all):
#   1. $CUDA_HOME/bin/nvcc
#   2. $CUDA_PATH/bin/nvcc
#   3. nvcc on PATH
#   4. /usr/local/cuda/bin/nvcc (PCSD_CUDA_SYSTEM_ROOT names another folder)
#   5. NVIDIA's pip packages in the site folders of the Python that builds (every folder of its
#      `nvidia` namespace package): nvidia/cu13/bin/nvcc (nvidia-cuda-nvcc 13: nvcc, headers and
#      the runtime together, libraries in lib/, not lib64/), nvidia/cu12/bin/nvcc, then
#      nvidia/cuda_nvcc/bin/nvcc (the CUDA 12 wheels, the runtime apart in nvidia/cuda_runtime/).
#
# pcsd_find_nvcc(<nvcc> <how> <tried> [PYTHON <exe>]) sets <nvcc> to the path (or ""), <how> to
# where it came from, <tried> to what was looked at (for the one-line message when none is found).
# pcsd_cuda_hints(<nvcc>) sets what FindCUDAToolkit needs for a pip layout: CUDAToolkit_ROOT,
# CUDA_CUDART (the wheels ship libcudart.so.13 but no unversioned libcudart.so) and, for the CUDA
# 12 wheels, the runtime's include folder in CMAKE_CUDA_FLAGS.
#
# Script mode, one line on stdout (tools/gpu_node.sh, tests/test_gpu_node.py):
#   cmake -DPYTHON=python3 -P cmake/pcsd_nvcc.cmake
#     -> "nvcc: /usr/local/cuda/bin/nvcc (/usr/local/cuda)"  or  "nvcc: not found (looked at ...)"

function(_pcsd_python_nvidia_dirs python out)
  set(dirs "")
  if(python)
    execute_process(
      COMMAND "${python}" -c
              "import importlib.util as u; s = u.find_spec('nvidia'); print(';'.join(s.submodule_search_locations or []) if s else '')"
      OUTPUT_VARIABLE dirs
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      set(dirs "")
    endif()
  endif()
  set(${out} "${dirs}" PARENT_SCOPE)
endfunction()

function(pcsd_find_nvcc out_nvcc out_how out_tried)
  cmake_parse_arguments(arg "" "PYTHON" "" ${ARGN})
  set(paths "")  # the candidates in order, each with where it came from (hows)
  set(hows "")
  set(tried "")  # what the one-line message lists when none is there
  foreach(var CUDA_HOME CUDA_PATH)
    if("$ENV{${var}}" STREQUAL "")
      list(APPEND tried "${var} unset")
    else()
      list(APPEND paths "$ENV{${var}}/bin/nvcc")
      list(APPEND hows "${var}")
      list(APPEND tried "${var}=$ENV{${var}} (no bin/nvcc)")
    endif()
  endforeach()
  if(NOT "$ENV{PATH}" STREQUAL "")
    string(REPLACE ":" ";" path_dirs "$ENV{PATH}")
    find_program(_pcsd_nvcc_on_path nvcc PATHS ${path_dirs} NO_DEFAULT_PATH NO_CACHE)
    if(_pcsd_nvcc_on_path)
      list(APPEND paths "${_pcsd_nvcc_on_path}")
      list(APPEND hows "PATH")
    endif()
  endif()
  list(APPEND tried "PATH")
  set(system "/usr/local/cuda")
  if(DEFINED PCSD_CUDA_SYSTEM_ROOT)
    set(system "${PCSD_CUDA_SYSTEM_ROOT}")
  endif()
  list(APPEND paths "${system}/bin/nvcc")
  list(APPEND hows "${system}")
  list(APPEND tried "${system}/bin")
  _pcsd_python_nvidia_dirs("${arg_PYTHON}" nvidia_dirs)
  foreach(d IN LISTS nvidia_dirs)
    foreach(sub cu13 cu12 cuda_nvcc)
      list(APPEND paths "${d}/${sub}/bin/nvcc")
      list(APPEND hows "NVIDIA's pip package, nvidia/${sub}")
    endforeach()
  endforeach()
  if(arg_PYTHON)
    list(APPEND tried "NVIDIA's pip packages of ${arg_PYTHON}")
  endif()
  foreach(path how IN ZIP_LISTS paths hows)
    if(EXISTS "${path}" AND NOT IS_DIRECTORY "${path}")
      set(${out_nvcc} "${path}" PARENT_SCOPE)
      set(${out_how} "${how}" PARENT_SCOPE)
      set(${out_tried} "" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  string(REPLACE ";" ", " tried "${tried}")
  set(${out_nvcc} "" PARENT_SCOPE)
  set(${out_how} "" PARENT_SCOPE)
  set(${out_tried} "${tried}" PARENT_SCOPE)
endfunction()

# The folder holding the CUDA runtime library beside <root> (root = nvcc's bin/..): its lib64 or
# lib, else the CUDA 12 wheels' nvidia/cuda_runtime/lib. Sets <out_dir> and <out_cudart> (the
# library file FindCUDAToolkit should take: libcudart.so, else the versioned one), "" when none.
function(_pcsd_runtime_lib root out_dir out_cudart)
  get_filename_component(parent "${root}" DIRECTORY)
  foreach(dir "${root}/lib64" "${root}/lib" "${parent}/cuda_runtime/lib")
    if(EXISTS "${dir}/libcudart.so")
      set(${out_dir} "${dir}" PARENT_SCOPE)
      set(${out_cudart} "${dir}/libcudart.so" PARENT_SCOPE)
      return()
    endif()
    file(GLOB versioned "${dir}/libcudart.so.*")
    if(versioned)
      list(SORT versioned)
      list(GET versioned 0 first)
      set(${out_dir} "${dir}" PARENT_SCOPE)
      set(${out_cudart} "${first}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_dir} "" PARENT_SCOPE)
  set(${out_cudart} "" PARENT_SCOPE)
endfunction()

# Hints for enable_language(CUDA) and find_package(CUDAToolkit) from the nvcc that was found.
macro(pcsd_cuda_hints nvcc)
  get_filename_component(_pcsd_cuda_bin "${nvcc}" DIRECTORY)
  get_filename_component(_pcsd_cuda_root "${_pcsd_cuda_bin}" DIRECTORY)
  if(NOT DEFINED CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT "${_pcsd_cuda_root}")
  endif()
  _pcsd_runtime_lib("${_pcsd_cuda_root}" _pcsd_cuda_libdir _pcsd_cudart)
  if(_pcsd_cudart AND NOT DEFINED CUDA_CUDART AND NOT _pcsd_cudart MATCHES "/libcudart\\.so$")
    set(CUDA_CUDART "${_pcsd_cudart}" CACHE FILEPATH "the CUDA runtime library (pcsd: NVIDIA's pip layout)")
  endif()
  get_filename_component(_pcsd_cuda_parent "${_pcsd_cuda_root}" DIRECTORY)
  if(NOT EXISTS "${_pcsd_cuda_root}/include/cuda_runtime.h" AND EXISTS "${_pcsd_cuda_parent}/cuda_runtime/include/cuda_runtime.h")
    set(ENV{CUDAFLAGS} "$ENV{CUDAFLAGS} -I${_pcsd_cuda_parent}/cuda_runtime/include")
  endif()
endmacro()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED PYTHON)
    set(PYTHON "")
  endif()
  pcsd_find_nvcc(_nvcc _how _tried PYTHON "${PYTHON}")
  if(_nvcc)
    set(_line "nvcc: ${_nvcc} (${_how})")
  else()
    set(_line "nvcc: not found (looked at ${_tried})")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "${_line}")
endif()
