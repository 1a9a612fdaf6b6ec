# cuda_archs.cmake — which GPU architectures libddpd-cuda.so is compiled for, from the
# DDPD_CUDA_ARCHS option (README "Build options"), after enable_language(CUDA):
#   native  the GPUs this machine has (CMake's detection at configure time); on a machine
#           without one, 90 only: a fast one-architecture build, which CI builds
#   all     the release (docker/Dockerfile): a cubin for each major architecture of
#           DDPD_CUDA_ALL_ARCHS that this nvcc compiles, and PTX of the newest, which the
#           driver compiles for GPUs newer than the build
#   a list  CMAKE_CUDA_ARCHITECTURES's own form: "80;90" (a cubin and PTX each), "80-real"
#           (a cubin only), "90-virtual" (PTX only)
# ddpd_cuda_archs(<archs var> <code var>) sets the first to the CUDA_ARCHITECTURES list and
# the second to what the module reports it holds, nvcc's names separated by spaces
# ("sm_75 sm_80 ... compute_120", cuda/dev.cu's DDPD_CUDA_CODE). An entry this nvcc does
# not compile is a configure error naming what it does compile, except under `all`, where it
# is left out with a message (CUDA 13 dropped Volta, 7.0: build with CUDA 12 for it).

# The major architectures from Volta on: V100, T4, A100, A10/RTX 30, L4/L40S/RTX 40, H100,
# B200, RTX 50. The emulated module's default fat binary is this list too
# (DDPD_CUDA_EMU_DEFAULT_CODE), with PTX of the newest.
set(DDPD_CUDA_ALL_ARCHS 70 75 80 86 89 90 100 120)

# "sm_70 sm_75 ... compute_120" for a CUDA_ARCHITECTURES list.
function(ddpd_cuda_code_names archs out)
  set(names "")
  set(ptx "")
  foreach(a IN LISTS archs)
    string(REGEX MATCH "^([0-9]+[a-z]?)(-real|-virtual)?$" _m "${a}")
    set(num "${CMAKE_MATCH_1}")
    if(NOT CMAKE_MATCH_2 STREQUAL "-virtual")
      list(APPEND names "sm_${num}")
    endif()
    if(NOT CMAKE_MATCH_2 STREQUAL "-real")
      list(APPEND ptx "compute_${num}")
    endif()
  endforeach()
  list(APPEND names ${ptx})
  string(REPLACE ";" " " names "${names}")
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

function(ddpd_cuda_archs out_archs out_code)
  # What this nvcc compiles: its compute_NN names (nvcc --list-gpu-arch, CUDA 11.5 on).
  execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-arch OUTPUT_VARIABLE _list
                  RESULT_VARIABLE _rc ERROR_QUIET)
  string(REGEX MATCHALL "compute_[0-9]+" _supported "${_list}")
  string(REPLACE "compute_" "" _supported "${_supported}")
  if(NOT _rc EQUAL 0 OR NOT _supported)
    message(FATAL_ERROR "DDPD_CUDA_ARCHS: '${CMAKE_CUDA_COMPILER} --list-gpu-arch' did not list the "
                        "architectures it compiles (CUDA 11.5 or newer is needed)")
  endif()
  set(want "${DDPD_CUDA_ARCHS}")
  set(archs "")
  if(want STREQUAL "all")
    set(kept "")
    foreach(a IN LISTS DDPD_CUDA_ALL_ARCHS)
      if(a IN_LIST _supported)
        list(APPEND kept ${a})
      else()
        message(STATUS "DDPD_CUDA_ARCHS=all: nvcc ${CMAKE_CUDA_COMPILER_VERSION} does not compile for "
                       "compute capability ${a}: left out (Volta, 7.0, needs CUDA 12)")
      endif()
    endforeach()
    if(NOT kept)
      message(FATAL_ERROR "DDPD_CUDA_ARCHS=all: nvcc compiles none of ${DDPD_CUDA_ALL_ARCHS}")
    endif()
  elseif(want STREQUAL "native")
    set(kept "")
    foreach(a IN LISTS CMAKE_CUDA_ARCHITECTURES_NATIVE)
      string(REPLACE "-real" "" a "${a}")
      list(APPEND kept ${a})
    endforeach()
    if(NOT kept)
      message(STATUS "DDPD_CUDA_ARCHS=native: no GPU found at configure time: building for 90 only")
      set(kept 90)
    endif()
    list(REMOVE_DUPLICATES kept)
    foreach(a IN LISTS kept)
      if(NOT a IN_LIST _supported)
        message(FATAL_ERROR "DDPD_CUDA_ARCHS=native: this machine has a GPU of compute capability ${a}, "
                            "which nvcc ${CMAKE_CUDA_COMPILER_VERSION} does not compile for")
      endif()
    endforeach()
  else()
    # A list as CMAKE_CUDA_ARCHITECTURES takes it, checked here so that a typo fails now
    # with the list nvcc has, not in the middle of the build.
    foreach(a IN LISTS want)
      string(REGEX MATCH "^([0-9]+)[a-z]?(-real|-virtual)?$" _m "${a}")
      if(NOT _m)
        message(FATAL_ERROR "DDPD_CUDA_ARCHS: '${a}' is not an architecture (native, all, or a list "
                            "such as 80;90 or 80-real;90)")
      endif()
      if(NOT CMAKE_MATCH_1 IN_LIST _supported)
        string(REPLACE ";" " " _s "${_supported}")
        message(FATAL_ERROR "DDPD_CUDA_ARCHS: nvcc ${CMAKE_CUDA_COMPILER_VERSION} does not compile for "
                            "${CMAKE_MATCH_1}; it compiles for ${_s}")
      endif()
    endforeach()
    set(archs "${want}")
  endif()
  if(NOT archs)
    # native and all: a cubin each, and PTX of the newest as well.
    list(SORT kept COMPARE NATURAL)
    list(POP_BACK kept newest)
    foreach(a IN LISTS kept)
      list(APPEND archs "${a}-real")
    endforeach()
    list(APPEND archs "${newest}")
  endif()
  ddpd_cuda_code_names("${archs}" code)
  set(${out_archs} "${archs}" PARENT_SCOPE)
  set(${out_code} "${code}" PARENT_SCOPE)
endfunction()
