# `cmake --install BUILD [--prefix P]`: rvd and rvctl into P/bin, and the C++
# client as a package other projects use:
#   find_package(rvd CONFIG REQUIRED)   # CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE rvd::client)
# The package holds the static libraries rvd::client links (rvd_client,
# rvd_proto, rvd_kernels and the OpenBLAS wrapper the CPU engine links), the
# headers they expose under P/include (client/cpp/, kernels/, rvd/v1/), and
# rvdConfig.cmake, which finds the Debian packages they depend on.
# tests/package/ builds client/examples/ against an installed copy.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RVD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rvd)

# Exported as rvd::client, rvd::proto, rvd::kernels, rvd::openblas.
set_target_properties(rvd_client PROPERTIES EXPORT_NAME client)
set_target_properties(rvd_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(rvd_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(rvd_openblas PROPERTIES EXPORT_NAME openblas)

# A package built with sanitizers (make asan) is instrumented code: whatever
# links it needs the sanitizer runtimes too.
if(RVD_SANITIZE)
  target_link_options(rvd_client INTERFACE
                      $<INSTALL_INTERFACE:-fsanitize=${RVD_SANITIZE}>)
endif()

install(TARGETS rvd rvctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS rvd_client rvd_proto rvd_kernels rvd_openblas
        EXPORT rvdTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The headers keep the paths the sources include them by.
install(FILES
          client/cpp/channel.h client/cpp/model_loader.h
          client/cpp/rvd_client.h client/cpp/safetensors.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/client/cpp)
install(FILES kernels/call_contract.h kernels/engine.h kernels/v_layout.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kernels)
install(FILES
          ${PROJECT_BINARY_DIR}/proto/gen/rvd/v1/rvd.pb.h
          ${PROJECT_BINARY_DIR}/proto/gen/rvd/v1/rvd.grpc.pb.h
          proto/rvd/v1/limits.h proto/rvd/v1/rvd.proto
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/rvd/v1)

install(EXPORT rvdTargets NAMESPACE rvd:: DESTINATION ${RVD_CMAKE_DIR})
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/rvdConfig.cmake.in
  ${PROJECT_BINARY_DIR}/rvdConfig.cmake
  INSTALL_DESTINATION ${RVD_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/rvdConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rvdConfig.cmake
              ${PROJECT_BINARY_DIR}/rvdConfigVersion.cmake
        DESTINATION ${RVD_CMAKE_DIR})
