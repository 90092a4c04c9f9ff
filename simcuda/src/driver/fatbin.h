/* fatbin.h - answers questions about a CUDA module image without running it.
 *
 * The simulated driver never executes device code, yet clients inspect what they load:
 * cuBLAS refuses to create a handle unless its device global `deviceConstants` is exactly
 * 128 bytes, and callers expect CUDA_ERROR_NOT_FOUND for kernels an image does not define.
 * Those facts live in the ELF symbol tables of the cubins inside the image, so this module
 * reads them (decompressing fatbin entries as needed) and caches the result per image.
 */
#ifndef SIMCUDA_DRIVER_FATBIN_H
#define SIMCUDA_DRIVER_FATBIN_H

#include <stddef.h>

/* `image` is whatever a client passed as module/library image: a fatbin wrapper
 * (magic 0x466243B1: struct { int magic; int version; const void *data;
 * void *filename_or_fatbins; }), a fatbin container (magic 0xBA55ED50), or a bare ELF cubin
 * ("\x7fELF").  PTX text and anything else that cannot be decoded is "unknown", so callers
 * must treat SIM_IMAGE_UNKNOWN as "do not fail".
 *
 * Only the container the pointer designates is read (header size + files_size), even when
 * more containers follow it in memory: cudart hands out pointers into a library's
 * .nv_fatbin section, where the next container belongs to an unrelated translation unit. */
enum sim_image_answer { SIM_IMAGE_FOUND = 1, SIM_IMAGE_ABSENT = 0, SIM_IMAGE_UNKNOWN = -1 };

/* Size (st_size) of the device global `name` (exact, mangled symbol name) in any cubin of the
 * image; the largest if cubins disagree.  `size` may be NULL. */
enum sim_image_answer sim_image_global_size(const void *image, const char *name, size_t *size);

/* Whether the image defines a kernel (function) called `name` (exact, mangled). */
enum sim_image_answer sim_image_has_function(const void *image, const char *name);

/* Size in bytes of the image (for copying it), or 0 if not recognised.
 * Bare ELF: extent of its headers and sections.  Fatbin container: header + files_size.
 * Wrapper: the wrapper struct alone (its pointers refer to the client's loaded library).
 * PTX text: strlen + 1. */
size_t sim_image_size(const void *image);

/* Drops what the cache remembers about `image` (all images when NULL).  Call it when a
 * module/library is unloaded: the cache is keyed by address, and although a content
 * fingerprint guards against a reused address, forgetting is exact and frees memory. */
void sim_image_forget(const void *image);

#endif
