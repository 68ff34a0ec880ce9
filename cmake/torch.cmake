# LibTorch half of the build: the C++ profiler and executor (csrc/profiler, csrc/executor), their
# Catch2 tests (tests/cpp/torch) and the C++ examples. Torch comes from the pip wheel
# (torch==2.13.0): `make build` passes -DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils;
# print(torch.utils.cmake_prefix_path)').
find_package(Torch REQUIRED)

file(GLOB HP_TORCH_SOURCES CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/csrc/profiler/*.cc ${CMAKE_SOURCE_DIR}/csrc/executor/*.cc
     ${CMAKE_SOURCE_DIR}/csrc/models/*.cc)
add_library(hp_torch SHARED ${HP_TORCH_SOURCES})
target_include_directories(hp_torch PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/csrc>)
# ${TORCH_LIBRARIES} by target name (it lists libc10.so by its path): the installed
# hybridplanTorchTargets.cmake then names targets that the consumer's find_package(Torch) defines.
target_link_libraries(hp_torch PUBLIC hp_core torch torch_library c10)
# The version every rank reports in the rank agreement (executor/rank_agreement.h); Python's
# hybridplan.__version__ must equal it (tests/python/test_reliability.py).
target_compile_definitions(hp_torch PRIVATE HYBRIDPLAN_VERSION="${PROJECT_VERSION}")
# Most of hp_torch's files include <torch/torch.h>, whose parse is most of their compile (25-45 s
# each on a 2-core host): it is parsed once, as the target's precompiled header (measured: the
# target's compile from scratch took 304 s of CPU with it, 454 s without). The tests and
# examples do not reuse it: they are executables (-fPIE), and GCC refuses a -fPIC header there.
target_precompile_headers(hp_torch PRIVATE <torch/torch.h>)

# The executor's Gloo process groups (csrc/executor/process_groups.cc) include ProcessGroupGloo.hpp,
# which the torch wheel ships without the gloo headers it includes. Debian's libgloo-dev provides
# them (headers only: the gloo symbols come from libtorch_cpu.so; never link libgloo.so, it would
# bring a second, older gloo). See process_groups.h for why this is ABI-safe.
find_path(HP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
if(NOT HP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers not found: apt-get install libgloo-dev (scripts/install-deps.sh)")
endif()
target_include_directories(hp_torch SYSTEM PRIVATE ${HP_GLOO_INCLUDE_DIR})

if(HYBRIDPLAN_BUILD_TESTS)
  file(GLOB HP_TORCH_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cpp/torch/*.cc)
  if(HP_TORCH_TESTS)
    add_executable(torch_tests ${CMAKE_SOURCE_DIR}/tests/cpp/catch_main.cc ${HP_TORCH_TESTS})
    target_include_directories(torch_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests/cpp)
    target_link_libraries(torch_tests PRIVATE hp_torch ${HP_CATCH_LIBS})
    target_compile_definitions(torch_tests PRIVATE HYBRIDPLAN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                   HYBRIDPLAN_TEST_VERSION="${PROJECT_VERSION}")
    add_test(NAME torch_tests COMMAND torch_tests)
    set_tests_properties(torch_tests PROPERTIES
      ENVIRONMENT "HYBRIDPLAN_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYBRIDPLAN_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  endif()
endif()

# Each examples/cpp/<name>.cc is one LibTorch program: build/bin/<name>.
file(GLOB HP_CPP_EXAMPLES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/examples/cpp/*.cc)
foreach(example ${HP_CPP_EXAMPLES})
  get_filename_component(example_name ${example} NAME_WE)
  add_executable(${example_name} ${example})
  target_link_libraries(${example_name} PRIVATE hp_torch CLI11::CLI11)
  list(APPEND HP_CPP_EXAMPLE_TARGETS ${example_name})
endforeach()
# The executor's multi-process tests spawn the example programs (HYBRIDPLAN_BIN_DIR).
if(TARGET torch_tests AND HP_CPP_EXAMPLE_TARGETS)
  add_dependencies(torch_tests ${HP_CPP_EXAMPLE_TARGETS})
endif()
