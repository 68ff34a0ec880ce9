# What `cmake --install` and a wheel (pyproject.toml, scikit-build-core) install.
#
# cmake --install <build> --prefix P   (a build configured with -DHYBRIDPLAN_WITH_TORCH=ON|OFF)
#   P/bin/hybridplan                           the CLI
#   P/include/hybridplan/common/*.h, planner/<role>/*.h   torch-free headers
#                                              (<hybridplan/planner/searches/search.h>)
#   P/include/hybridplan/{profiler,executor,models}/*.h, P/lib/libhp_torch.so   with LibTorch
#   P/lib/libhp_core.a, P/lib/cmake/hybridplan/hybridplanConfig.cmake exporting
#     hybridplan::planner  (torch-free: Graph, Cluster, Job, Plan, evaluate, search, explain)
#     hybridplan::torch    (profiler, executor, models; only from a LibTorch build)
#   so that a consumer writes  find_package(hybridplan REQUIRED COMPONENTS planner [torch]).
# A wheel (SKBUILD) installs only the CLI into the scripts folder and hybridplan._C next to the
# Python package: the planner, relocatable, without torch.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(SKBUILD)
  install(TARGETS hybridplan RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
  if(TARGET _C)
    install(TARGETS _C LIBRARY DESTINATION hybridplan)
  endif()
  return()
endif()

set(HP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hybridplan)
set(HP_INCLUDE_DIR ${CMAKE_INSTALL_INCLUDEDIR}/hybridplan)

install(TARGETS hybridplan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set_target_properties(hp_core PROPERTIES EXPORT_NAME planner)
install(TARGETS hp_core EXPORT hybridplanPlannerTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT hybridplanPlannerTargets NAMESPACE hybridplan:: DESTINATION ${HP_CMAKE_DIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/csrc/common ${CMAKE_SOURCE_DIR}/csrc/planner
        DESTINATION ${HP_INCLUDE_DIR} FILES_MATCHING PATTERN "*.h")

if(TARGET hp_torch)
  # The installed library finds libtorch where it was built against (the torch wheel's lib/).
  set_target_properties(hp_torch PROPERTIES EXPORT_NAME torch INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS hp_torch EXPORT hybridplanTorchTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT hybridplanTorchTargets NAMESPACE hybridplan:: DESTINATION ${HP_CMAKE_DIR})
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/csrc/profiler ${CMAKE_SOURCE_DIR}/csrc/executor
                    ${CMAKE_SOURCE_DIR}/csrc/models
          DESTINATION ${HP_INCLUDE_DIR} FILES_MATCHING PATTERN "*.h")
endif()

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/hybridplanConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/hybridplanConfig.cmake
                              INSTALL_DESTINATION ${HP_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/hybridplanConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/hybridplanConfig.cmake
              ${CMAKE_BINARY_DIR}/hybridplanConfigVersion.cmake
        DESTINATION ${HP_CMAKE_DIR})
