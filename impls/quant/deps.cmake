# The portable SIMD kernels (Highway, every target built, chosen at run time) are their own library:
# they must not be compiled with -march=native (memtrade_common's flags), or only the native target exists.
add_library(memtrade_quant_simd STATIC ${CMAKE_CURRENT_LIST_DIR}/simd/matvec_simd.cpp
            ${CMAKE_CURRENT_LIST_DIR}/simd/matvec_a16.cpp
            ${CMAKE_CURRENT_LIST_DIR}/simd/matvec_a8.cpp ${CMAKE_CURRENT_LIST_DIR}/simd/int_activations.cpp)
target_link_libraries(memtrade_quant_simd PUBLIC memtrade_simd)
set(deps memtrade_quant_simd)
