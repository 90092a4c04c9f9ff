// Runs argv[1..] as its child and writes the child's maximum resident set (KiB, from wait4's
// rusage) to the file PEAK_RSS_FILE names; exits as the child did. Why a process of its own:
// Linux keeps, at exec, the larger of the old image's resident set and the new one's, so a
// program forked (or vforked) straight from the test binary has the test binary's size in its
// maximum; forked from this small process, it has its own. The child dies with this process.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
    const char* out = getenv("PEAK_RSS_FILE");
    if (argc < 2 || !out) return 125;
    pid_t pid = fork();
    if (pid < 0) return 125;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[1], argv + 1);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid) return 125;
    FILE* f = fopen(out, "w");
    if (!f || fprintf(f, "%ld\n", ru.ru_maxrss) < 0 || fclose(f) != 0) return 125;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}
