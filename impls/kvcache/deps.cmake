# The decode-attention kernel in portable SIMD (Highway, every target built, chosen at run time) is its
# own library: it must not be compiled with -march=native (memtrade_common's flags), or only the native
# target exists.
add_library(memtrade_kvcache_simd STATIC ${CMAKE_CURRENT_LIST_DIR}/simd/decode_simd.cpp)
target_link_libraries(memtrade_kvcache_simd PUBLIC memtrade_simd)
set(deps memtrade_model memtrade_kvcache_simd)
