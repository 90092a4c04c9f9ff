// Run as a setuid program (AT_SECURE) by another user: loads the library named by argv[1]
// with dlopen (which secure execution allows, unlike LD_PRELOAD: the way a library reaches a
// setuid program through /etc/ld.so.preload or a plugin), asks it to mark a step (its lazy
// start), then prints what its environment holds now. Links nothing of CUDA: in secure
// execution the loader ignores LD_LIBRARY_PATH.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static const char* or_unset(const char* v) { return v ? v : "(unset)"; }

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "secure_dlopen: %s\n", dlerror());
        return 3;
    }
    void (*mark)(const char*) = (void (*)(const char*))dlsym(lib, "oomtrace_mark");
    if (mark) mark("step");
    printf("PYTHONPATH=%s\n", or_unset(getenv("PYTHONPATH")));
    printf("OOMTRACE_TORCH=%s\n", or_unset(getenv("OOMTRACE_TORCH")));
    printf("OOMTRACE_LIB=%s\n", or_unset(getenv("OOMTRACE_LIB")));
    fflush(stdout);
    return 0;
}
