/* mapguard.h — a data file truncated under a running rank ends it with an `error` event
 * and exit 2 (CONTRACT.md §6), not with "killed by signal 7". Reading a page of a
 * MAP_SHARED file mapping past the file's new end raises SIGBUS; the handler installed
 * here looks the faulting address up in a small registry of the rank's file mappings and
 * writes the error prepared when the file was mapped. A fault anywhere else is left to
 * crash as it would have. Knows nothing of data formats; data/data.c registers its maps. */
#ifndef DDPD_MAPGUARD_H
#define DDPD_MAPGUARD_H

#include <stdbool.h>
#include <stddef.h>

#include "../schema/err.h"

/* Mappings the registry holds at once: a rank maps at most two files (x and y, or one
 * tokens file) for its training data and two for its eval data. */
#define MAPGUARD_SLOTS 8

/* Installs the SIGBUS handler (sigaction, SA_SIGINFO), keeping the previous action for
 * faults outside every registered mapping. Once per process, before the maps are read;
 * a second call does nothing. */
void mapguard_install(void);

/* Registers [addr, addr + len): a SIGBUS there writes the `error` event of `why` (and its
 * log line on stderr) and exits with ddpd_err_exit(why->code). Both lines are built now
 * (emit_error_lines), so the handler only writes them; its `ts` is set again at the fault
 * when the time has as many digits. False when the registry is full or the line cannot be
 * built: the mapping then stays unguarded. Not async-signal-safe; one thread registers. */
bool mapguard_add(const void *addr, size_t len, const struct ddpd_error *why);

/* Forgets the mapping that starts at addr (before it is unmapped); nothing when none. */
void mapguard_remove(const void *addr);

/* The event line (with its newline) the handler would write for a fault at addr, and its
 * length in *len; NULL outside every registered mapping. Async-signal-safe (the handler's
 * own lookup). */
const char *mapguard_find(const void *addr, size_t *len);

#endif
