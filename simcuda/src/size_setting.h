/*
 * The syntax of simcuda's size settings (SIMCUDA_MEMORY, SIMCUDA_HOST_MEMORY, ...), shared by
 * the driver and its NVML stand-in so that both read a setting the same way.
 */
#ifndef SIMCUDA_SIZE_SETTING_H
#define SIMCUDA_SIZE_SETTING_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

/* Accepts "<digits>" optionally followed by K/M/G/T or KiB/MiB/GiB/TiB (any case, binary
 * multiples).  Returns 1 and the size, or 0 for anything else (overflow included). */
static inline int simcuda_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } k_suffixes[] = {
        {"k", 10}, {"kib", 10}, {"m", 20}, {"mib", 20},
        {"g", 30}, {"gib", 30}, {"t", 40}, {"tib", 40},
    };
    char *end;
    uint64_t mult = 1;
    if (*s < '0' || *s > '9')
        return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return 0;
    if (*end) {
        size_t i, n = sizeof k_suffixes / sizeof k_suffixes[0];
        for (i = 0; i < n; i++)
            if (strcasecmp(end, k_suffixes[i].suffix) == 0)
                break;
        if (i == n)
            return 0;
        mult = 1ull << k_suffixes[i].shift;
    }
    if (v > UINT64_MAX / mult)
        return 0;
    *out = v * mult;
    return 1;
}

#endif
