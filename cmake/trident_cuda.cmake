# The CUDA kernels library, shared by the main build and the standalone GPU
# test build (tests/gpu/CMakeLists.txt), so its sources and flags are listed
# once. Needs enable_language(CUDA) and find_package(CUDAToolkit) first.
set(TRIDENT_ROOT ${CMAKE_CURRENT_LIST_DIR}/..)

# CMake 3.25 knows nvcc's dialect flags up to C++17 only, and a C++20 target
# (the project's standard) then fails at generate time. nvcc 12+ takes
# -std=c++20; newer CMake versions define these themselves.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

# trident_cuda_kernels(TARGET BASE_TARGET): every kernels/cuda/*.cu, linked
# to cudart and cuBLAS and to the library that holds Error, Allocator and the
# CPU kernels' shared parts (Workspace, check_attn_shape).
function(trident_cuda_kernels target core)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${TRIDENT_ROOT}/kernels/cuda/*.cu
       ${TRIDENT_ROOT}/kernels/cuda/*.cpp)
  add_library(${target} STATIC ${srcs})
  # kernels/include: the internal headers, PRIVATE (see the main CMakeLists.txt)
  target_include_directories(${target} PUBLIC ${TRIDENT_ROOT}/include
                             PRIVATE ${TRIDENT_ROOT}/kernels/include)
  # cuBLAS is dlopen'ed (kernels/cuda/cublas_api.cpp), not linked: see there.
  target_link_libraries(${target} PUBLIC ${core} CUDA::cudart ${CMAKE_DL_LIBS})
  target_compile_definitions(${target} PUBLIC TRIDENT_HAVE_CUDA=1)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                        CUDA_EXTENSIONS OFF)
  # No --use_fast_math: the fp32 kernels are compared with the CPU reference
  # at 1e-5.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
endfunction()
