// Ten call sites that keep memory: keep_1 holds 1 MiB, ..., keep_10 holds 10 MiB (55 MiB live at
// exit), so the biggest 8 are the top sites and keep_1 + keep_2 (3 MiB) the rest.
#include "scenario.h"

#define KEEP(n) \
    __attribute__((noinline)) void keep_##n(void) { void* p; CHECK(cudaMalloc(&p, n * MiB)); }

KEEP(1)
KEEP(2)
KEEP(3)
KEEP(4)
KEEP(5)
KEEP(6)
KEEP(7)
KEEP(8)
KEEP(9)
KEEP(10)

int main(void) {
    keep_1();
    keep_2();
    keep_3();
    keep_4();
    keep_5();
    keep_6();
    keep_7();
    keep_8();
    keep_9();
    keep_10();
    printf("many_sites: ok\n");
    return 0;
}
