/* fatbin.c - reads symbol tables out of CUDA fatbinaries and cubins.
 *
 * Why: the simulated driver runs no device code, but clients still ask it about the images
 * they load.  cuBLAS checks that `cublas::internal::deviceConstants` is exactly 128 bytes
 * (via cuLibraryGetGlobal) before it creates a handle, and kernel look-ups should fail only
 * for names that are really absent.  The answers are in the ELF .symtab of each cubin inside
 * the image, so this file walks the fatbin structure, inflates compressed entries (LZ4 with a
 * small decoder of our own, ZSTD through the system libzstd loaded on first use), collects
 * every defined function and object symbol, and keeps the decoded tables of the most recently
 * used images in a small cache, because cuBLAS queries many names of the same image.
 *
 * Layout (learned from ZLUDA's dark_api and checked against the PyTorch wheel's libraries;
 * all fields little-endian):
 *   container: u32 magic 0xBA55ED50, u16 version 1, u16 header_size, u64 files_size;
 *              entries follow the header back to back.
 *   entry:     u16 kind (1 PTX, 2 ELF), u16 version 0x101, u32 header_size (64 or more),
 *              u32 payload_size (stored bytes, padded to 8), u32 compressed_size at 16,
 *              u64 flags at 40 (0x2000: LZ4 raw block, 0x8000: ZSTD frame),
 *              u64 uncompressed_size at 56.  The next entry starts header_size + payload_size
 *              bytes further on.
 * Images are trusted memory, but every offset is still checked against the sizes the headers
 * claim, and anything inconsistent turns the answer into SIM_IMAGE_UNKNOWN.
 */
#include "fatbin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WRAPPER_MAGIC 0x466243B1u
#define CONTAINER_MAGIC 0xBA55ED50u
#define CONTAINER_VERSION 1u
#define CONTAINER_HDR_MIN 16u
#define ENTRY_HDR_MIN 64u
#define ENTRY_VERSION 0x101u
#define KIND_ELF 2u
#define FLAG_LZ4 0x2000u
#define FLAG_ZSTD 0x8000u

#define ELF_EHDR_SIZE 64u
#define ELF_SHDR_SIZE 64u
#define ELF_PHDR_SIZE 56u
#define ELF_SYM_SIZE 24u
#define SHT_SYMTAB 2u
#define SHT_STRTAB 3u
#define SHT_NOBITS 8u
#define STT_OBJECT 1u
#define STT_FUNC 2u

/* Far above anything NVIDIA ships (the largest cubin in libtorch_cuda inflates to 43 MB), yet
 * low enough that a garbage size field cannot make us allocate the machine away. */
#define MAX_SPAN ((uint64_t)1 << 30)
/* Version-2 wrappers list prelinked containers in a NULL-terminated array. */
#define MAX_WRAPPED 4096u
#define CACHE_SLOTS 16u

enum sym_kind { SYM_FUNC = 1, SYM_OBJECT = 2 };
enum walk_status { WALK_OK = 0, WALK_BROKEN = -1, WALK_FOREIGN = -2 };

struct fat_wrapper {
    int magic;
    int version;
    const void *data;
    void *filename_or_fatbins;
};

/* One blob of device code as stored: possibly compressed, possibly not a cubin at all. */
struct piece {
    unsigned kind;
    uint64_t flags;
    const unsigned char *data;
    size_t len;        /* stored bytes: the compressed size, or the whole payload */
    uint64_t raw_len;  /* size after decompression, as the entry header promises */
};

typedef void (*piece_fn)(void *ctx, const struct piece *p);

struct sym {
    const char *name;
    size_t off;        /* into the name arena while it may still move */
    uint64_t size;
    int kind;
};

/* The decoded answer for one image. */
struct table {
    const void *key;
    uint64_t print;
    uint64_t used;
    unsigned elf_ok;   /* cubins whose symbol table was read */
    unsigned elf_bad;  /* cubins we could not decode: their symbols are unknown */
    int oom;
    size_t n, cap;
    struct sym *syms;
    char *names;
    size_t names_len, names_cap;
};

static uint16_t le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Byte by byte, stopping at the first mismatch, so that a short PTX string ending in NUL is
 * never read past its end (no magic contains a zero byte). */
static int has_magic(const unsigned char *p, uint32_t magic)
{
    for (int i = 0; i < 4; i++)
        if (p[i] != (unsigned char)(magic >> (8 * i)))
            return 0;
    return 1;
}

/* ---- structure walking ------------------------------------------------------------------ */

/* Checks one container and hands its entries to `fn` (which may be NULL).  Nothing is
 * delivered unless the whole container is consistent, so callers never decode half an image. */
static int walk_container(const unsigned char *c, piece_fn fn, void *ctx, uint64_t *span)
{
    if (!c || !has_magic(c, CONTAINER_MAGIC) || le16(c + 4) != CONTAINER_VERSION)
        return WALK_BROKEN;
    uint32_t hsz = le16(c + 6);
    uint64_t files = le64(c + 8);
    if (hsz < CONTAINER_HDR_MIN || files > MAX_SPAN)
        return WALK_BROKEN;

    for (int deliver = 0; deliver < 2; deliver++) {
        if (deliver && !fn)
            break;
        const unsigned char *p = c + hsz;
        uint64_t left = files;
        while (left > 0) {
            if (left < ENTRY_HDR_MIN)
                return WALK_BROKEN;
            uint32_t ehs = le32(p + 4);
            uint32_t payload = le32(p + 8);
            uint32_t packed = le32(p + 16);
            uint64_t flags = le64(p + 40);
            if (le16(p + 2) != ENTRY_VERSION || ehs < ENTRY_HDR_MIN || ehs > left)
                return WALK_BROKEN;
            /* ZLUDA steps by the larger of the two sizes; be as tolerant. */
            uint64_t stride = (uint64_t)ehs + (payload > packed ? payload : packed);
            if (stride > left)
                return WALK_BROKEN;
            if (deliver) {
                struct piece pc = {
                    .kind = le16(p),
                    .flags = flags,
                    .data = p + ehs,
                    .len = (flags & (FLAG_LZ4 | FLAG_ZSTD)) ? packed : payload,
                    .raw_len = le64(p + 56),
                };
                fn(ctx, &pc);
            }
            p += stride;
            left -= stride;
        }
    }
    if (span)
        *span = hsz + files;
    return WALK_OK;
}

static int walk_wrapper(const unsigned char *image, piece_fn fn, void *ctx)
{
    struct fat_wrapper w;
    memcpy(&w, image, sizeof w);
    if (w.version == 1)
        return walk_container(w.data, fn, ctx, NULL);
    if (w.version != 2)
        return WALK_BROKEN;
    /* Relocatable (-rdc) registration: `data` is this unit's container, the list holds
     * the prelinked ones.  Validate everything before delivering anything. */
    for (int deliver = 0; deliver < 2; deliver++) {
        piece_fn f = deliver ? fn : NULL;
        if (deliver && !fn)
            break;
        if (w.data && walk_container(w.data, f, ctx, NULL) != WALK_OK)
            return WALK_BROKEN;
        const unsigned char *list = w.filename_or_fatbins;
        for (unsigned i = 0; list; i++) {
            const void *c;
            if (i == MAX_WRAPPED)
                return WALK_BROKEN;
            memcpy(&c, list + i * sizeof c, sizeof c);
            if (!c)
                break;
            if (walk_container(c, f, ctx, NULL) != WALK_OK)
                return WALK_BROKEN;
        }
    }
    return WALK_OK;
}

/* A bare cubin comes without a length, so its extent is computed from its own headers
 * (trusting them, as the real driver must).  Returns 0 for what we do not understand. */
static uint64_t elf_span(const unsigned char *e)
{
    if (e[4] != 2 || e[5] != 1) /* only 64-bit little-endian cubins exist nowadays */
        return 0;
    uint64_t end = ELF_EHDR_SIZE;
    uint64_t phoff = le64(e + 0x20), shoff = le64(e + 0x28);
    uint32_t phsz = le16(e + 0x36), phnum = le16(e + 0x38);
    uint32_t shsz = le16(e + 0x3a), shnum = le16(e + 0x3c);

    if (phnum) {
        if (phsz < ELF_PHDR_SIZE || phoff > MAX_SPAN)
            return 0;
        for (uint32_t i = 0; i < phnum; i++) {
            const unsigned char *ph = e + phoff + (uint64_t)i * phsz;
            uint64_t off = le64(ph + 8), filesz = le64(ph + 32);
            if (off > MAX_SPAN || filesz > MAX_SPAN)
                return 0;
            if (off + filesz > end)
                end = off + filesz;
        }
        if (phoff + (uint64_t)phnum * phsz > end)
            end = phoff + (uint64_t)phnum * phsz;
    }
    if (shoff) {
        if (shsz < ELF_SHDR_SIZE || shoff > MAX_SPAN)
            return 0;
        if (shnum == 0) { /* more than 0xff00 sections: the count hides in section 0 */
            uint64_t n = le64(e + shoff + 32);
            if (n > 0xffffff)
                return 0;
            shnum = (uint32_t)n;
        }
        for (uint32_t i = 0; i < shnum; i++) {
            const unsigned char *sh = e + shoff + (uint64_t)i * shsz;
            uint64_t off = le64(sh + 24), size = le64(sh + 32);
            if (le32(sh + 4) == SHT_NOBITS || le32(sh + 4) == 0)
                continue;
            if (off > MAX_SPAN || size > MAX_SPAN)
                return 0;
            if (off + size > end)
                end = off + size;
        }
        if (shoff + (uint64_t)shnum * shsz > end)
            end = shoff + (uint64_t)shnum * shsz;
    }
    return end > MAX_SPAN ? 0 : end;
}

static int looks_like_text(const unsigned char *p)
{
    return (p[0] >= 0x20 && p[0] < 0x7f) || p[0] == '\t' || p[0] == '\n' || p[0] == '\r';
}

static int walk_image(const void *image, piece_fn fn, void *ctx)
{
    const unsigned char *p = image;
    if (!p)
        return WALK_FOREIGN;
    if (has_magic(p, WRAPPER_MAGIC))
        return walk_wrapper(p, fn, ctx);
    if (has_magic(p, CONTAINER_MAGIC))
        return walk_container(p, fn, ctx, NULL);
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') {
        uint64_t len = elf_span(p);
        if (!len)
            return WALK_BROKEN;
        if (fn) {
            struct piece pc = { .kind = KIND_ELF, .data = p, .len = len };
            fn(ctx, &pc);
        }
        return WALK_OK;
    }
    return WALK_FOREIGN;
}

/* ---- fingerprint ------------------------------------------------------------------------ */

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; n > 0; p++, n--) {
        h = (h ^ *p) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h;
}

static uint64_t hash_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];
    memcpy(b, &v, 8);
    return hash_bytes(h, b, 8);
}

/* The cache is keyed by address, and addresses get reused (a client frees one cubin buffer
 * and loads another).  Small payloads are hashed whole; big ones are sampled, which is enough
 * because compressed data differs throughout, and the driver also calls sim_image_forget. */
static void hash_piece(void *ctx, const struct piece *p)
{
    enum { WHOLE = 16384, EDGE = 2048, SAMPLES = 32, SAMPLE = 64 };
    uint64_t h = *(uint64_t *)ctx;
    h = hash_u64(h, p->kind);
    h = hash_u64(h, p->flags);
    h = hash_u64(h, p->len);
    h = hash_u64(h, p->raw_len);
    if (p->len <= WHOLE) {
        h = hash_bytes(h, p->data, p->len);
    } else {
        h = hash_bytes(h, p->data, EDGE);
        h = hash_bytes(h, p->data + p->len - EDGE, EDGE);
        for (size_t i = 1; i <= SAMPLES; i++)
            h = hash_bytes(h, p->data + (p->len - SAMPLE) / (SAMPLES + 1) * i, SAMPLE);
    }
    *(uint64_t *)ctx = h;
}

/* ---- decompression ---------------------------------------------------------------------- */

/* LZ4 block format: sequences of [token][literal length ext][literals][offset][match length
 * ext]; the last sequence carries literals only.  Returns 0 (length in *out) or -1. */
static int lz4_decode(const unsigned char *src, size_t n, unsigned char *dst, size_t cap,
                      size_t *out)
{
    size_t ip = 0, op = 0;
    for (;;) {
        if (ip >= n)
            return -1;
        unsigned token = src[ip++];
        size_t lit = token >> 4;
        if (lit == 15) {
            unsigned char b;
            do {
                if (ip >= n)
                    return -1;
                b = src[ip++];
                lit += b;
            } while (b == 255);
        }
        if (lit > n - ip || lit > cap - op)
            return -1;
        memcpy(dst + op, src + ip, lit);
        ip += lit;
        op += lit;
        if (ip == n)
            break;
        if (n - ip < 2)
            return -1;
        size_t dist = (size_t)src[ip] | (size_t)src[ip + 1] << 8;
        ip += 2;
        if (dist == 0 || dist > op)
            return -1;
        size_t len = token & 15;
        if (len == 15) {
            unsigned char b;
            do {
                if (ip >= n)
                    return -1;
                b = src[ip++];
                len += b;
            } while (b == 255);
        }
        len += 4;
        if (len > cap - op)
            return -1;
        if (dist >= len) {
            memcpy(dst + op, dst + op - dist, len);
        } else {
            /* The match overlaps the bytes it produces (a repeated pattern): copy in order. */
            for (size_t i = 0; i < len; i++)
                dst[op + i] = dst[op - dist + i];
        }
        op += len;
    }
    *out = op;
    return 0;
}

struct zstd_api {
    size_t (*decompress)(void *dst, size_t cap, const void *src, size_t n);
    unsigned long long (*content_size)(const void *src, size_t n);
    unsigned (*is_error)(size_t code);
};

#define ZSTD_SIZE_UNKNOWN (0ULL - 1)
#define ZSTD_SIZE_ERROR (0ULL - 2)

static struct zstd_api zstd;
static pthread_once_t zstd_once = PTHREAD_ONCE_INIT;

/* libzstd rather than a decoder of our own: ZSTD is large, and every system that runs the
 * PyTorch wheel has it.  The handle stays open for the life of the process on purpose. */
static void zstd_load(void)
{
    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    void *d = dlsym(h, "ZSTD_decompress");
    void *c = dlsym(h, "ZSTD_getFrameContentSize");
    void *e = dlsym(h, "ZSTD_isError");
    if (!d || !c || !e) {
        dlclose(h);
        return;
    }
    /* memcpy: ISO C has no conversion from object to function pointer. */
    memcpy(&zstd.decompress, &d, sizeof d);
    memcpy(&zstd.content_size, &c, sizeof c);
    memcpy(&zstd.is_error, &e, sizeof e);
}

/* Returns the cubin bytes of a piece, in `*owned` when they had to be inflated (the caller
 * frees it), or NULL when the piece cannot be decoded. */
static const unsigned char *inflate(const struct piece *p, size_t *len, unsigned char **owned)
{
    uint64_t method = p->flags & (FLAG_LZ4 | FLAG_ZSTD);
    *owned = NULL;
    if (!method) {
        *len = p->len;
        return p->data;
    }
    if (method == (FLAG_LZ4 | FLAG_ZSTD) || p->len == 0)
        return NULL;

    uint64_t want = p->raw_len;
    if (method == FLAG_ZSTD) {
        pthread_once(&zstd_once, zstd_load);
        if (!zstd.decompress)
            return NULL;
        unsigned long long framed = zstd.content_size(p->data, p->len);
        if (framed == ZSTD_SIZE_ERROR)
            return NULL;
        if (framed != ZSTD_SIZE_UNKNOWN) {
            if (want && want != framed)
                return NULL;
            want = framed;
        }
    }
    if (want == 0 || want > MAX_SPAN)
        return NULL;
    unsigned char *buf = malloc(want);
    if (!buf)
        return NULL;
    size_t got;
    if (method == FLAG_ZSTD) {
        got = zstd.decompress(buf, want, p->data, p->len);
        if (zstd.is_error(got) || got > want) {
            free(buf);
            return NULL;
        }
    } else if (lz4_decode(p->data, p->len, buf, want, &got) != 0) {
        free(buf);
        return NULL;
    }
    *owned = buf;
    *len = got;
    return buf;
}

/* ---- symbol tables ---------------------------------------------------------------------- */

static void table_add(struct table *t, const char *name, size_t name_len, int kind,
                      uint64_t size)
{
    if (t->oom)
        return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        struct sym *s = realloc(t->syms, cap * sizeof *s);
        if (!s) {
            t->oom = 1;
            return;
        }
        t->syms = s;
        t->cap = cap;
    }
    if (name_len + 1 > t->names_cap - t->names_len) {
        size_t cap = t->names_cap ? 2 * t->names_cap : 4096;
        while (cap - t->names_len < name_len + 1)
            cap *= 2;
        char *s = realloc(t->names, cap);
        if (!s) {
            t->oom = 1;
            return;
        }
        t->names = s;
        t->names_cap = cap;
    }
    memcpy(t->names + t->names_len, name, name_len + 1);
    t->syms[t->n++] = (struct sym){ .off = t->names_len, .size = size, .kind = kind };
    t->names_len += name_len + 1;
}

/* Reads the defined STT_FUNC / STT_OBJECT symbols of every SHT_SYMTAB (local ones too: the
 * cuBLAS global is file-local in its cubin).  Returns -1 if the ELF does not hold together. */
static int elf_symbols(const unsigned char *e, size_t len, struct table *t)
{
    if (len < ELF_EHDR_SIZE || e[0] != 0x7f || e[1] != 'E' || e[2] != 'L' || e[3] != 'F' ||
        e[4] != 2 || e[5] != 1)
        return -1;
    uint64_t shoff = le64(e + 0x28);
    uint32_t shsz = le16(e + 0x3a);
    uint64_t shnum = le16(e + 0x3c);
    if (shoff == 0)
        return 0;
    if (shsz < ELF_SHDR_SIZE || shoff > len || len - shoff < shsz)
        return -1;
    if (shnum == 0)
        shnum = le64(e + shoff + 32);
    if (shnum > (len - shoff) / shsz)
        return -1;

    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = e + shoff + i * shsz;
        if (le32(sh + 4) != SHT_SYMTAB)
            continue;
        uint64_t off = le64(sh + 24), size = le64(sh + 32), ent = le64(sh + 56);
        uint32_t link = le32(sh + 40);
        if (ent == 0)
            ent = ELF_SYM_SIZE;
        if (ent < ELF_SYM_SIZE || off > len || size > len - off || link >= shnum)
            return -1;
        const unsigned char *str_sh = e + shoff + (uint64_t)link * shsz;
        uint64_t str_off = le64(str_sh + 24), str_size = le64(str_sh + 32);
        if (le32(str_sh + 4) != SHT_STRTAB || str_off > len || str_size > len - str_off)
            return -1;
        const char *strs = (const char *)e + str_off;

        for (uint64_t s = 0; s + ent <= size; s += ent) {
            const unsigned char *sym = e + off + s;
            uint32_t name = le32(sym);
            unsigned type = sym[4] & 0xf;
            int kind = type == STT_FUNC ? SYM_FUNC : type == STT_OBJECT ? SYM_OBJECT : 0;
            if (!kind || le16(sym + 6) == 0 /* SHN_UNDEF: a reference, not a definition */)
                continue;
            if (name >= str_size)
                return -1;
            const char *nul = memchr(strs + name, '\0', str_size - name);
            if (!nul)
                return -1;
            table_add(t, strs + name, (size_t)(nul - (strs + name)), kind, le64(sym + 16));
        }
    }
    return 0;
}

/* Entries that are not cubins (PTX, LTO IR) are other renderings of the same kernels, so they
 * neither add symbols nor stop us from calling a name absent; a cubin that fails to decode
 * does stop us. */
static void collect_piece(void *ctx, const struct piece *p)
{
    struct table *t = ctx;
    if (p->kind != KIND_ELF)
        return;
    size_t len;
    unsigned char *owned;
    const unsigned char *elf = inflate(p, &len, &owned);
    if (elf && elf_symbols(elf, len, t) == 0)
        t->elf_ok++;
    else
        t->elf_bad++;
    free(owned);
}

static int sym_cmp(const void *a, const void *b)
{
    const struct sym *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->kind - y->kind;
}

static void table_free(struct table *t)
{
    if (!t)
        return;
    free(t->syms);
    free(t->names);
    free(t);
}

/* Sorts for bsearch and merges the copies every per-architecture cubin brings, keeping the
 * largest size, then repacks the names so a cached table holds each name once. */
static int table_finish(struct table *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->syms[i].name = t->names + t->syms[i].off;
    if (t->n)
        qsort(t->syms, t->n, sizeof *t->syms, sym_cmp);
    size_t m = 0, bytes = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (m && sym_cmp(&t->syms[m - 1], &t->syms[i]) == 0) {
            if (t->syms[i].size > t->syms[m - 1].size)
                t->syms[m - 1].size = t->syms[i].size;
            continue;
        }
        t->syms[m++] = t->syms[i];
        bytes += strlen(t->syms[i].name) + 1;
    }
    t->n = m;
    char *names = malloc(bytes ? bytes : 1);
    if (!names)
        return -1;
    size_t at = 0;
    for (size_t i = 0; i < m; i++) {
        size_t l = strlen(t->syms[i].name) + 1;
        memcpy(names + at, t->syms[i].name, l);
        t->syms[i].name = names + at;
        at += l;
    }
    free(t->names);
    t->names = names;
    t->names_len = t->names_cap = bytes;
    if (m < t->cap) {
        struct sym *s = realloc(t->syms, (m ? m : 1) * sizeof *s);
        if (s) {
            t->syms = s;
            t->cap = m;
        }
    }
    return 0;
}

static struct table *table_build(const void *image)
{
    struct table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (walk_image(image, collect_piece, t) != WALK_OK || t->oom || table_finish(t) != 0) {
        table_free(t);
        return NULL;
    }
    return t;
}

static enum sim_image_answer table_answer(const struct table *t, const char *name, int kind,
                                          size_t *size)
{
    struct sym key = { .name = name, .kind = kind };
    const struct sym *hit =
        t->n ? bsearch(&key, t->syms, t->n, sizeof *t->syms, sym_cmp) : NULL;
    if (hit) {
        if (size)
            *size = (size_t)hit->size;
        return SIM_IMAGE_FOUND;
    }
    return t->elf_ok && !t->elf_bad ? SIM_IMAGE_ABSENT : SIM_IMAGE_UNKNOWN;
}

/* ---- cache ------------------------------------------------------------------------------ */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct table *cache[CACHE_SLOTS];
static uint64_t cache_clock;

static struct table *cache_find(const void *image, uint64_t print)
{
    for (unsigned i = 0; i < CACHE_SLOTS; i++)
        if (cache[i] && cache[i]->key == image && cache[i]->print == print) {
            cache[i]->used = ++cache_clock;
            return cache[i];
        }
    return NULL;
}

/* Takes ownership of `t`; evicts the least recently used table, or a stale one for the same
 * address, whose content has changed. */
static void cache_insert(struct table *t)
{
    unsigned victim = 0;
    for (unsigned i = 0; i < CACHE_SLOTS; i++) {
        if (!cache[i] || cache[i]->key == t->key) {
            victim = i;
            break;
        }
        if (cache[i]->used < cache[victim]->used)
            victim = i;
    }
    table_free(cache[victim]);
    t->used = ++cache_clock;
    cache[victim] = t;
}

static enum sim_image_answer lookup(const void *image, const char *name, int kind,
                                    size_t *size)
{
    if (!image || !name)
        return SIM_IMAGE_UNKNOWN;
    uint64_t print = 0x6a09e667f3bcc908ull;
    if (walk_image(image, hash_piece, &print) != WALK_OK)
        return SIM_IMAGE_UNKNOWN;

    enum sim_image_answer ans = SIM_IMAGE_UNKNOWN;
    pthread_mutex_lock(&cache_lock);
    struct table *t = cache_find(image, print);
    if (t)
        ans = table_answer(t, name, kind, size);
    pthread_mutex_unlock(&cache_lock);
    if (t)
        return ans;

    /* Decode outside the lock: inflating a large image takes milliseconds. */
    struct table *fresh = table_build(image);
    if (!fresh)
        return SIM_IMAGE_UNKNOWN;
    fresh->key = image;
    fresh->print = print;
    pthread_mutex_lock(&cache_lock);
    t = cache_find(image, print);
    if (t) {
        table_free(fresh); /* another thread got there first */
    } else {
        cache_insert(fresh);
        t = fresh;
    }
    ans = table_answer(t, name, kind, size);
    pthread_mutex_unlock(&cache_lock);
    return ans;
}

/* ---- API -------------------------------------------------------------------------------- */

enum sim_image_answer sim_image_global_size(const void *image, const char *name, size_t *size)
{
    return lookup(image, name, SYM_OBJECT, size);
}

enum sim_image_answer sim_image_has_function(const void *image, const char *name)
{
    return lookup(image, name, SYM_FUNC, NULL);
}

size_t sim_image_size(const void *image)
{
    const unsigned char *p = image;
    if (!p)
        return 0;
    if (has_magic(p, WRAPPER_MAGIC))
        return walk_wrapper(p, NULL, NULL) == WALK_OK ? sizeof(struct fat_wrapper) : 0;
    if (has_magic(p, CONTAINER_MAGIC)) {
        uint64_t span;
        return walk_container(p, NULL, NULL, &span) == WALK_OK ? (size_t)span : 0;
    }
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F')
        return (size_t)elf_span(p);
    if (looks_like_text(p))
        return strlen(image) + 1;
    return 0;
}

void sim_image_forget(const void *image)
{
    pthread_mutex_lock(&cache_lock);
    for (unsigned i = 0; i < CACHE_SLOTS; i++)
        if (cache[i] && (!image || cache[i]->key == image)) {
            table_free(cache[i]);
            cache[i] = NULL;
        }
    pthread_mutex_unlock(&cache_lock);
}
