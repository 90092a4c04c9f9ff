// leak_ext_step, leak_ext_static, clean_ext_step, clean_ext_static: a loop whose only CUDA
// allocation is one call per step into a CUDA extension (ext_step.c), dlopen'ed RTLD_LOCAL
// from the directory of this executable. Built four times:
//   EXT_LIB    libcorpus_ext_step.so (dynamic runtime) or libcorpus_ext_step_static.so
//              (static runtime: the driver through cuGetProcAddress_v2);
//   EXT_LEAKY  1: ext_step_keep(), 2 MiB kept per step (LEAK at ext_step_keep, onset step 0;
//              live at exit: steps x 2 MiB); 0: ext_step_scratch(), 2 MiB freed in the call
//              (CLEAN; nothing live at exit).
// Exactly one allocation per step, then 5 ms of compute (corpus_compute): without markers the
// stream's period is one event, and only its pace in time marks the steps.
#include "corpus.h"
#include <limits.h>
#include <unistd.h>

#ifndef EXT_LIB
#error "EXT_LIB names the extension to load"
#endif

static void* load_ext(void) {
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return NULL;
    path[n] = 0;
    char* slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) + sizeof "/" EXT_LIB > sizeof path) return NULL;
    strcpy(slash, "/" EXT_LIB);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) fprintf(stderr, "ext_step_main: %s\n", dlerror());
    return h;
}

int main(void) {
    void* h = load_ext();
    if (!h) return 2;
    void (*op)(void) = (void (*)(void))dlsym(h, EXT_LEAKY ? "ext_step_keep" : "ext_step_scratch");
    if (!op) return 3;
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        op();
        corpus_compute();
        corpus_end_step(s);
    }
    printf("%s: ok\n", EXT_LEAKY ? "leak_ext_step" : "clean_ext_step");
    return 0;
}
