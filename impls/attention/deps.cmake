# The flash kernels in portable SIMD (Highway, every target built, chosen at run time) are their own
# library: they must not be compiled with -march=native (memtrade_common's flags), or only the native
# target exists.
add_library(memtrade_attention_simd STATIC ${CMAKE_CURRENT_LIST_DIR}/simd/flash_simd.cpp)
target_link_libraries(memtrade_attention_simd PUBLIC memtrade_simd)
set(deps memtrade_attention_simd)
