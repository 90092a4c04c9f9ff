// Interposes puts() and chains to the next definition with dlsym(RTLD_NEXT, ...).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int puts(const char* s) {
    static int (*next)(const char*) = NULL;
    if (!next) next = (int (*)(const char*))dlsym(RTLD_NEXT, "puts");
    fputs("[wrapped] ", stdout);
    return next(s);
}
