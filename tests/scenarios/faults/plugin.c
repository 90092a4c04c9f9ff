// libfault_plugin.so: a plugin with its own libcudart dependency, loaded and unloaded by
// dlclose_main. plugin_alloc keeps blocks in a static table; plugin_free frees the last ones.
// Built a second time with -DPREFIX=second as libfault_second.so (second_alloc, second_free):
// the same code at the same offsets, as a rebuilt or reloaded extension would be.
#include "scenario.h"

#ifndef PREFIX
#define PREFIX plugin
#endif
#define NAME2(p, f) p##_##f
#define NAME(p, f) NAME2(p, f)

static void* blocks[16];
static int count;

__attribute__((noinline)) void NAME(PREFIX, alloc)(int n, size_t bytes) {
    for (int i = 0; i < n && count < 16; i++) CHECK(cudaMalloc(&blocks[count++], bytes));
}

__attribute__((noinline)) void NAME(PREFIX, free)(int n) {
    for (int i = 0; i < n && count > 0; i++) CHECK(cudaFree(blocks[--count]));
}
