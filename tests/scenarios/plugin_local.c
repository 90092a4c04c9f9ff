// Looks up a function of its own dependency with RTLD_DEFAULT: glibc searches relative to the
// caller, which includes this library's local scope.
#include <dlfcn.h>

int plugin_probe(void) {
    int (*dep)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "plugin_dep_value");
    return dep ? dep() : -1;
}
