/* stcheck.h — is a downloaded file a whole safetensors file (CONTRACT.md §4)? `ddpd pull`
 * asks before it gives the download its name: the 8-byte little-endian header length
 * inside the file, the header a JSON object (no key twice), "__metadata__" strings only,
 * each tensor's dtype known and its shape's bytes the span of its data_offsets, and the
 * offsets tiling the data section exactly: sorted, no gap, no overlap, ending at the file's
 * end (as the reference implementation checks). Reads the header, never the values.
 *
 * The reader of schema/safetensors.c (the worker's checkpoints, the server's GPT-2 export)
 * is separate: it holds the limits of what ddpd loads (four dimensions, the seven dtypes it
 * converts, 127-byte names); this check accepts every file of the format that any reader
 * could load. */
#ifndef DDPD_STCHECK_H
#define DDPD_STCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The reference implementation's limit on the header (100 MB). */
#define STCHECK_MAX_HEADER 100000000

/* Checks the `size` bytes of the file open on fd (read with pread; the offset is left
 * alone). Returns true, or false with why[cap] saying which check failed, with the
 * numbers (tensor names in it are escaped for a terminal, termsafe.h). */
bool stcheck_fd(int fd, int64_t size, char *why, size_t cap);

#endif
