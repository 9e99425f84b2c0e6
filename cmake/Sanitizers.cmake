# RVD_FUZZ: libFuzzer's coverage instrumentation on every target (the
# fuzz targets link libFuzzer itself), always with ASan and UBSan.
if(RVD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RVD_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++): "
                        "libFuzzer is part of clang")
  endif()
  if(NOT RVD_SANITIZE)
    set(RVD_SANITIZE address,undefined)
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# RVD_SANITIZE: instrument every target (our code, tests, the rvd binary)
# with the named sanitizers. Undefined behaviour aborts at the first report
# (-fno-sanitize-recover) so that a test fails instead of printing and
# passing. Debian's libraries (gRPC, absl, protobuf, OpenBLAS) stay
# uninstrumented: ASan still sees every access our code makes, and
# tests/sanitizers/*.supp names what those libraries report (see there).
if(RVD_SANITIZE)
  set(RVD_SANITIZE_FLAGS -fsanitize=${RVD_SANITIZE} -fno-omit-frame-pointer)
  if(RVD_SANITIZE MATCHES "undefined")
    list(APPEND RVD_SANITIZE_FLAGS -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${RVD_SANITIZE_FLAGS}>")
  add_link_options(-fsanitize=${RVD_SANITIZE})
  message(STATUS "rvd: sanitizers ${RVD_SANITIZE}")
endif()
