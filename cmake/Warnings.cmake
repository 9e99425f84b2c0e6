# Warning flags for rvd's own code: every target defined after this file is
# included (the top-level CMakeLists includes it after proto/, whose
# generated code is not ours). RVD_WERROR=ON makes them errors (make test).
# CUDA sources get the same flags for their host code (-Xcompiler); nvcc's
# device-side diagnostics are its own.
set(RVD_CXX_WARNINGS -Wall -Wextra)
set(RVD_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra)
if(RVD_WERROR)
  list(APPEND RVD_CXX_WARNINGS -Werror)
  list(APPEND RVD_CUDA_WARNINGS -Xcompiler=-Werror)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${RVD_CXX_WARNINGS}>"
                    "$<$<COMPILE_LANGUAGE:CUDA>:${RVD_CUDA_WARNINGS}>")
