// Its working directory is removed in the middle of the run: 150 allocate/free pairs, then it
// creates the file argv[1] (outside that directory) and waits, at most 30 s, until the
// directory is gone (the test removes it), then 150 more pairs. Exits 5 (or 3 if the
// directory was never removed).
#include <sys/stat.h>
#include <time.h>
#include "scenario.h"

static void pairs(int n) {
    for (int i = 0; i < n; i++) {
        void* p;
        CHECK(cudaMalloc(&p, MiB));
        CHECK(cudaFree(p));
    }
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cwd_gone READY-FILE\n");
        return 2;
    }
    pairs(150);
    FILE* ready = fopen(argv[1], "w");
    if (!ready) {
        perror("cwd_gone: ready file");
        return 4;
    }
    fclose(ready);
    for (int waited = 0;; waited++) {
        struct stat st;
        // A removed directory has no links left (and `.` may no longer resolve at all).
        if (stat(".", &st) != 0 || st.st_nlink == 0) break;
        if (waited >= 3000) return 3;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    pairs(150);
    printf("cwd_gone: done\n");
    return 5;
}
