// A program that closes every descriptor above 2 after its first CUDA calls (as daemons,
// sandboxes and some launchers do), then opens its own file, socketpair or pipe, which gets
// the numbers that were free: under a careless tracer, the one its connection had.
//
// usage: close_all HOW WHAT PAIRS [nowait]
//   HOW:  loop (close() on every number up to the soft RLIMIT_NOFILE), range (close_range),
//         from (closefrom)
//   WHAT: file, socketpair, pipe
//   PAIRS: allocate/free pairs made after the program opened its own descriptors (so that the
//          tracer has plenty to send while the program uses them)
//   nowait: close everything right after the first calls, without waiting for the tracer to
//          have delivered them (oomtrace_flush), so that its connection may still be in the
//          making
// The program writes its own data in two parts (before and after the allocations), then reads
// it back and checks it byte for byte, and that nothing else arrived. Exit codes: 42 all good
// (and "close_all: ok" on stdout); 10 + a step number when something of its own went wrong
// (a line on stderr says what).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include "scenario.h"

#define OK_CODE 42

static void fail(int step, const char* what) {
    fprintf(stderr, "close_all: %s: %s\n", what, strerror(errno));
    exit(10 + step);
}

static void close_all(const char* how) {
    if (strcmp(how, "loop") == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0) fail(0, "getrlimit");
        long top = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1 << 20) ? (1 << 20) : (long)rl.rlim_cur;
        for (long fd = 3; fd < top; fd++) close((int)fd);
    } else if (strcmp(how, "range") == 0) {
        if (close_range(3, ~0U, 0) != 0) fail(0, "close_range");
    } else if (strcmp(how, "from") == 0) {
        closefrom(3);
    } else {
        fprintf(stderr, "close_all: HOW is loop, range or from\n");
        exit(2);
    }
}

// Writes all of buf (the descriptors are non-blocking: a pipe stuffed by someone else must
// fail the check, not hang the program).
static void put(int fd, const char* buf, size_t n, int step) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail(step, "write of its own data");
        buf += w;
        n -= (size_t)w;
    }
}

// Reads what is there (non-blocking) and checks it is exactly `want`.
static void expect_stream(int fd, const char* want, size_t n) {
    char got[8192];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, got + have, sizeof got - have);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) break;
        if (r < 0) fail(5, "read of its own data");
        if (r == 0) break;
        have += (size_t)r;
        if (have == sizeof got) break;
    }
    if (have != n || memcmp(got, want, n) != 0) {
        fprintf(stderr, "close_all: read back %zu bytes, wrote %zu%s\n", have, n,
                have >= n && memcmp(got, want, n) == 0 ? " (and someone else's after them)"
                                                       : " (different bytes)");
        exit(16);
    }
}

static void nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) fail(1, "fcntl");
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: close_all loop|range|from file|socketpair|pipe PAIRS [nowait]\n");
        return 2;
    }
    const char* how = argv[1];
    const char* what = argv[2];
    long pairs = atol(argv[3]);
    int wait_first = !(argc > 4 && strcmp(argv[4], "nowait") == 0);

    // The first CUDA calls start the tracer (and its connection).
    void* p;
    for (int i = 0; i < 100; i++) {
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
    }
    if (wait_first) {
        int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "oomtrace_flush");
        if (flush) flush();
    }

    close_all(how);

    // Its own descriptors, and its own data.
    char part1[64], part2[64], want[128];
    int n1 = snprintf(part1, sizeof part1, "first part of %d's own data|", (int)getpid());
    int n2 = snprintf(part2, sizeof part2, "second part, after the allocations|");
    memcpy(want, part1, (size_t)n1);
    memcpy(want + n1, part2, (size_t)n2);
    size_t total = (size_t)(n1 + n2);
    int wfd, rfd;
    if (strcmp(what, "file") == 0) {
        wfd = open("close_all.data", O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (wfd < 0) fail(1, "open");
        rfd = wfd;
    } else if (strcmp(what, "socketpair") == 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) fail(1, "socketpair");
        wfd = sv[0];
        rfd = sv[1];
        nonblocking(wfd);
        nonblocking(rfd);
    } else if (strcmp(what, "pipe") == 0) {
        int pv[2];
        if (pipe(pv) != 0) fail(1, "pipe");
        rfd = pv[0];
        wfd = pv[1];
        nonblocking(wfd);
        nonblocking(rfd);
    } else {
        fprintf(stderr, "close_all: WHAT is file, socketpair or pipe\n");
        return 2;
    }
    put(wfd, part1, (size_t)n1, 2);

    // Plenty for the tracer to send while the program's descriptors are open.
    for (long i = 0; i < pairs; i++) {
        CHECK(cudaMalloc(&p, 512 + (size_t)(i % 7) * 256));
        CHECK(cudaFree(p));
    }

    put(wfd, part2, (size_t)n2, 3);
    // Still open, still the program's own.
    if (fcntl(wfd, F_GETFD) < 0 || fcntl(rfd, F_GETFD) < 0) fail(4, "its descriptor was closed");
    if (rfd == wfd) {
        struct stat st;
        if (fstat(rfd, &st) != 0) fail(4, "fstat");
        if ((size_t)st.st_size != total) {
            fprintf(stderr, "close_all: the file holds %lld bytes, the program wrote %zu\n",
                    (long long)st.st_size, total);
            return 16;
        }
        char got[128];
        if (pread(rfd, got, total, 0) != (ssize_t)total) fail(5, "pread");
        if (memcmp(got, want, total) != 0) {
            fprintf(stderr, "close_all: the file holds other bytes than the program wrote\n");
            return 16;
        }
    } else {
        expect_stream(rfd, want, total);
    }
    if (close(wfd) != 0 || (rfd != wfd && close(rfd) != 0)) fail(7, "close of its own descriptor");
    printf("close_all: ok\n");
    fflush(stdout);
    return OK_CODE;
}
