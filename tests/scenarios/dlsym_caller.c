// dlsym must keep glibc's caller-relative semantics under the preloaded trampoline:
//  - libwrap_puts.so wraps puts() and chains with dlsym(RTLD_NEXT, "puts"): a forwarder that
//    lost the caller identity would recurse forever;
//  - plugin_local.so, dlopened RTLD_LOCAL, finds its own dependency with dlsym(RTLD_DEFAULT)
//    relative to itself (its local scope).
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : ".";
    char path[4096];
    snprintf(path, sizeof path, "%s/libplugin_local.so", dir);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("plugin: %s\n", dlerror());
        return 2;
    }
    int (*probe)(void) = (int (*)(void))dlsym(h, "plugin_probe");
    printf("plugin probe: %d\n", probe ? probe() : -1);
    puts("puts through the wrapper");
    return 0;
}
