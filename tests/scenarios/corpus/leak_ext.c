// Ground truth: LEAK at ext_workspace_leak() in libcorpus_ext.so, onset step 0, 1 MiB per step.
// The extension is dlopen'ed RTLD_LOCAL from argv[1], or else from the directory of this
// executable. Its ext_fused_op() (4 MiB, freed) runs every step too and is clean.
// Live at exit: steps x 1 MiB from ext_workspace_leak (60 MiB with 60 steps).
#include "corpus.h"
#include <limits.h>
#include <unistd.h>

static void* load_ext(int argc, char** argv) {
    char path[PATH_MAX];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        if (n <= 0) return NULL;
        path[n] = 0;
        char* slash = strrchr(path, '/');
        if (!slash || (size_t)(slash - path) + sizeof "/libcorpus_ext.so" > sizeof path) return NULL;
        strcpy(slash, "/libcorpus_ext.so");
    }
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) fprintf(stderr, "leak_ext: %s\n", dlerror());
    return h;
}

int main(int argc, char** argv) {
    void* h = load_ext(argc, argv);
    if (!h) return 2;
    void (*fused_op)(void) = (void (*)(void))dlsym(h, "ext_fused_op");
    void (*workspace_leak)(void) = (void (*)(void))dlsym(h, "ext_workspace_leak");
    if (!fused_op || !workspace_leak) return 3;
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        fused_op();
        workspace_leak();  // never freed
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_ext: ok\n");
    return 0;
}
