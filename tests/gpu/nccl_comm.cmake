# NcclCommunicator on one GPU (test_nccl_comm.cpp). Included by the main
# build (tests/mpi/comm, where the communicator is built) and by
# tests/gpu/CMakeLists.txt for the standalone GPU build, which has no MPI:
# there the comm sources it needs are compiled here, without MPI. Skipped
# (exit 77) when no device is visible; not built without NCCL.
include_guard(GLOBAL)
get_filename_component(trident_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
if(TARGET trident_comm)
  if(NOT TRIDENT_HAVE_NCCL)
    return()
  endif()
  set(nccl_comm_lib trident_comm)
else()
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS /usr/lib/x86_64-linux-gnu)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(STATUS "trident gpu: no NCCL found, test_nccl_comm not built")
    return()
  endif()
  add_library(trident_comm_nccl_only STATIC
    ${trident_root}/src/comm/comm.cpp ${trident_root}/src/comm/flight_recorder.cpp
    ${trident_root}/src/comm/p2p_plan.cpp
    ${trident_root}/src/comm/nccl/nccl_communicator.cpp ${trident_root}/src/comm/op_buffers.cpp
    ${trident_root}/kernels/api/buffer_uses.cpp ${trident_root}/src/core/clock.cpp
    ${trident_root}/src/core/error.cpp)
  target_include_directories(trident_comm_nccl_only PUBLIC ${trident_root}/include
                             PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(trident_comm_nccl_only PUBLIC CUDA::cudart ${NCCL_LIBRARY})
  set(nccl_comm_lib trident_comm_nccl_only)
endif()
add_executable(test_nccl_comm ${trident_root}/tests/gpu/test_nccl_comm.cpp)
target_link_libraries(test_nccl_comm PRIVATE ${nccl_comm_lib} CUDA::cudart)
if(TARGET trident_warnings)
  target_link_libraries(test_nccl_comm PRIVATE trident_warnings)
endif()
add_test(NAME test_nccl_comm COMMAND test_nccl_comm)
# Its timeout case waits 5 s for the deadline and up to 20 s for the blocked
# stream to be released.
set_tests_properties(test_nccl_comm PROPERTIES LABELS gpu TIMEOUT 60 SKIP_RETURN_CODE 77)
